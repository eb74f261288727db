#!/usr/bin/env bash
# PM space of BOOM-KV's hybrid update against append-only, side by side:
# a zipfian(0.99) write-only load (rpcbench kv --workload put) on a fresh
# pool, once with in-place updates (the default) and once --append-only.
# Prints the log bytes each left in the pool and the ratio.
#
#   tools/rpcbench/space-zipf.sh [--records N] [--iters N] [--value-size N]
#                                [--fabric F] [--build DIR]
set -euo pipefail

records=10000 iters=200000 vsize=64 fabric=shm build=build
while [ $# -gt 0 ]; do
    case $1 in
        --records) records=$2; shift 2 ;;
        --iters) iters=$2; shift 2 ;;
        --value-size) vsize=$2; shift 2 ;;
        --fabric) fabric=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        *) echo "usage: $0 [--records N] [--iters N] [--value-size N] [--fabric F] [--build DIR]" >&2
           exit 2 ;;
    esac
done
bench=$build/tools/rpcbench/rpcbench
[ -x "$bench" ] || { echo "$bench: not built" >&2; exit 1; }

used() {    # used MODE [extra args]: pool bytes after the run
    "$bench" kv --fabric "$fabric" --workload put --dist zipfian --records "$records" \
        --iters "$iters" --value-size "$vsize" --json "$@" |
        python3 -c 'import json,sys; print([json.loads(l) for l in sys.stdin if l.startswith("{")][-1]["pool_used_bytes"])'
}

hybrid=$(used)
append=$(used --append-only)
python3 - "$hybrid" "$append" "$records" "$iters" "$vsize" "$fabric" <<'PY'
import sys
h, a, rec, it, vs, fab = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:]
print(f"zipfian(0.99) write-only, {rec} keys, {it} puts of {vs} B over {fab}:")
print(f"  append-only : {a / 2**20:8.2f} MiB of log")
print(f"  hybrid      : {h / 2**20:8.2f} MiB of log")
print(f"  hybrid uses {100 * (1 - h / a):.0f}% less PM than append-only")
PY

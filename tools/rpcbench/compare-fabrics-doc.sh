#!/usr/bin/env bash
# RMongo's claim for tern: the document service over the kernel-bypass
# fabrics (shm, rdma) against the same service over tcp, in one run, as
# ratios. RMongo (Huang et al., 2019) reports about +30% insert and +15%
# query throughput for MongoDB over RDMA against TCP.
#
#   tools/rpcbench/compare-fabrics-doc.sh [--rounds R] [--records N]
#       [--iters N] [--window W] [--build DIR] [--pool-dir DIR]
#
# Each round runs rpcbench doc over every fabric built in (a fresh server
# each): inserts and reads by _id with --window in flight, finds by the
# indexed field one at a time (about ten documents each, --path auto). The
# table gives each fabric's median ops/s over the rounds and its ratio to
# tcp's.
set -euo pipefail

rounds=3 records=20000 iters=20000 window=16 build=build pool_dir=""
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --records) records=$2; shift 2 ;;
        --iters) iters=$2; shift 2 ;;
        --window) window=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        --pool-dir) pool_dir=$2; shift 2 ;;
        *) echo "usage: $0 [--rounds R] [--records N] [--iters N] [--window W] [--build DIR] [--pool-dir DIR]" >&2
           exit 2 ;;
    esac
done
bench=$build/tools/rpcbench/rpcbench
[ -x "$bench" ] || { echo "$bench: not built" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
extra=()
[ -n "$pool_dir" ] && extra=(--pool-dir "$pool_dir")
for ((r = 0; r < rounds; r++)); do
    "$bench" doc --fabric all --workload insert,read,find --records "$records" --iters "$iters" \
        --window "$window" --path auto --json "${extra[@]}" >>"$out"
done
python3 - "$out" "$rounds" "$window" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    by.setdefault((r["workload"], r["fabric"]), []).append(r["ops_per_s"])
fabrics = []
for r in rows:
    if r["fabric"] not in fabrics:
        fabrics.append(r["fabric"])
print(f"document service, {sys.argv[2]} rounds, window {sys.argv[3]} (find: 1); median ops/s and ratio to tcp")
print(f"{'workload':12} " + " ".join(f"{f:>18}" for f in fabrics))
for w in ("doc-insert", "doc-read", "doc-find"):
    base = statistics.median(by.get((w, "tcp"), [0])) or None
    cells = []
    for f in fabrics:
        v = by.get((w, f))
        if not v:
            cells.append(f"{'-':>18}")
            continue
        m = statistics.median(v)
        ratio = f" ({m / base:.2f}x)" if base else ""
        cells.append(f"{m:>10.0f}{ratio:>8}")
    print(f"{w:12} " + " ".join(cells))
PY

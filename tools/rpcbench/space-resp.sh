#!/usr/bin/env bash
# PM space left by SETs through ternd's Redis gateway: redis-benchmark SETs
# against `ternd --resp-port` on a fresh pool, then the pool's figures from
# INFO persistence (committed log bytes, segments in use, live bytes).
# The gateway commits once per batch of commands (group commit); what this
# measures is whether those SETs rewrite a key's older record in place
# (BOOM-KV's hybrid update, docs/KV.md) or append a new one each time.
#
#   tools/rpcbench/space-resp.sh [--keys N] [--requests N] [--clients N]
#                                [--pipeline N] [--value-size N] [--build DIR]
#
# --keys 1 (the default) SETs one key over and over; --keys N spreads them
# uniformly over N keys (redis-benchmark -r). The pool lives on tmpfs with
# PMEM_IS_PMEM_FORCE=1, as in the other benchmarks. Nothing is cleaned
# while the figures are taken: the pool (1 GiB by default) is larger than
# the log the run writes without in-place updates.
set -euo pipefail

keys=1 requests=1600000 clients=50 pipeline=1 vsize=64 build=build pool=1g
while [ $# -gt 0 ]; do
    case $1 in
        --keys) keys=$2; shift 2 ;;
        --requests) requests=$2; shift 2 ;;
        --clients) clients=$2; shift 2 ;;
        --pipeline) pipeline=$2; shift 2 ;;
        --value-size) vsize=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        --pool-size) pool=$2; shift 2 ;;
        *) echo "usage: $0 [--keys N] [--requests N] [--clients N] [--pipeline N]" \
                "[--value-size N] [--pool-size SIZE] [--build DIR]" >&2
           exit 2 ;;
    esac
done
ternd=$build/tools/ternd/ternd
[ -x "$ternd" ] || { echo "$ternd: not built" >&2; exit 1; }
command -v redis-benchmark >/dev/null || { echo "redis-benchmark not found (redis-tools)" >&2; exit 1; }

dir=$(mktemp -d "${TMPDIR:-/dev/shm}/space-resp.XXXXXX")
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT

PMEM_IS_PMEM_FORCE=1 "$ternd" --data-dir "$dir" --listen tcp://127.0.0.1:0 --no-shm \
    --resp-port 0 --pool-size "$pool" >"$dir/out" 2>"$dir/err" &
pid=$!
for _ in $(seq 100); do
    grep -q '^ternd ready' "$dir/out" 2>/dev/null && break
    sleep 0.1
done
port=$(sed -n 's/.* resp=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$dir/out")
[ -n "$port" ] || { echo "ternd did not start:" >&2; cat "$dir/err" >&2; exit 1; }

range=()
[ "$keys" -gt 1 ] && range=(-r "$keys")
redis-benchmark -p "$port" -t set -n "$requests" -c "$clients" -P "$pipeline" -d "$vsize" \
    "${range[@]}" -q | tr '\r' '\n' | grep -v '^$' | tail -1

redis-cli -p "$port" info persistence | tr -d '\r' | python3 -c "$(cat <<'PY'
import sys
f = dict(l.strip().split(":", 1) for l in sys.stdin if ":" in l)
seg = int(f["tern_pool_seg_bytes"])
print("  segments in use : %s of %s (%d KiB each)" % (f["tern_pool_segs_used"], f["tern_pool_segs"], seg >> 10))
c = int(f["tern_pool_bytes_committed"])
print("  committed log   : %d bytes (%.2f MiB)" % (c, c / 2**20))
print("  live            : %s bytes" % f["tern_pool_bytes_live"])
print("  segments cleaned: %s" % f["tern_segs_cleaned"])
PY
)"
redis-cli -p "$port" info stats | tr -d '\r' | grep -E '^total_commands_processed' || true

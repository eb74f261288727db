#!/usr/bin/env bash
# Memory over a long echo run: the client's and the server's resident set
# before and after N calls (default 10 million). tern allocates nothing per
# message, so both should stay flat; the script fails if either grows by more
# than 1 MiB.
#
#   tools/rpcbench/memflat.sh [--iters N] [--window W] [--size S] [--fabric F]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bench=${RPCBENCH:-$root/build/tools/rpcbench/rpcbench}
iters=10000000 window=1 size=64 fabric=tcp
while [ $# -gt 0 ]; do
    case $1 in
        --iters) iters=$2; shift 2 ;;
        --window) window=$2; shift 2 ;;
        --size) size=$2; shift 2 ;;
        --fabric) fabric=$2; shift 2 ;;
        *) echo "usage: $0 [--iters N] [--window W] [--size S] [--fabric F]" >&2; exit 2 ;;
    esac
done
[ -x "$bench" ] || { echo "no rpcbench at $bench (build first)" >&2; exit 1; }
json=$("$bench" echo --fabric "$fabric" --size "$size" --window "$window" --iters "$iters" --json 2>/dev/null)
python3 - "$json" <<'PY'
import json, sys
r = json.loads(sys.argv[1].splitlines()[-1])
c0, c1 = r["client_rss_kb"]; s0, s1 = r["server_rss_kb"]
print(f"{r['fabric']} {r['size']} B window {r['window']}: {r['iters']} calls, "
      f"p50 {r['p50_ns']/1e3:.2f} us, {r['ops_per_s']:.0f} ops/s")
print(f"client RSS {c0} -> {c1} kB ({c1-c0:+d}), server RSS {s0} -> {s1} kB ({s1-s0:+d})")
bad = [n for n, d in (("client", c1 - c0), ("server", s1 - s0)) if d > 1024]
if bad:
    print("memory grew:", ", ".join(bad)); sys.exit(1)
print("flat: yes")
PY

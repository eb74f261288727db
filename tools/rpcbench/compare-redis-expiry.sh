#!/usr/bin/env bash
# Keys that expire: ternd's RESP gateway against Debian's redis-server, side
# by side in one run.
#
#   tools/rpcbench/compare-redis-expiry.sh [--ternd PATH] [--requests N]
#                                          [--keys K] [--rounds R]
#
# Per round and target (redis-server with persistence off, then ternd):
#  - SET with and without EX (redis-benchmark -P 16 -c 50, random keys over
#    100,000): ops/s and the server's CPU per SET, to show what a deadline
#    costs a write;
#  - background removal: K keys set with PX 5000 (redis-cli --pipe, done
#    well before the deadline, or the run stops), then
#    nothing but DBSIZE every 20 ms until it reads 0. Reported: how long
#    after the deadline the last key went, and the server's CPU per key
#    removed. Redis samples keys with deadlines (20 at a time, ten times a
#    second, more while over a quarter are due); ternd pops them off a heap
#    in deadline order, at most 1000 a pass, ten passes a second or more
#    while a full batch was due.
#
# The ternd pool is on tmpfs with PMEM_IS_PMEM_FORCE=1 (emulated PM).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
TERND=${TERND:-$here/../../build/tools/ternd/ternd}
REQUESTS=400000
KEYS=200000
ROUNDS=3

while [ $# -gt 0 ]; do
    case $1 in
        --ternd) TERND=$2; shift 2 ;;
        --requests) REQUESTS=$2; shift 2 ;;
        --keys) KEYS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        *) echo "usage: $0 [--ternd PATH] [--requests N] [--keys K] [--rounds R]" >&2; exit 2 ;;
    esac
done
for tool in redis-server redis-benchmark redis-cli; do
    command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed" >&2; exit 0; }
done
[ -x "$TERND" ] || { echo "no ternd at $TERND (build first, or --ternd PATH)" >&2; exit 2; }

dir=$(mktemp -d /dev/shm/tern-expiry-XXXXXX)
. "$here/../common/ports.sh"
RPORT=$(free_port)
TPORT=$(free_port)
HZ=$(getconf CLK_TCK)
PID=""
results=$dir/results
cleanup() {
    [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
wait_port() {
    for _ in $(seq 200); do
        redis-cli -p "$1" ping >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    echo "server on port $1 did not answer" >&2
    return 1
}
start() {
    if [ "$1" = redis ]; then
        redis-server --port "$RPORT" --save "" --appendonly no --daemonize no \
            --logfile /dev/null >/dev/null 2>&1 &
        PID=$!
        port=$RPORT
    else
        rm -rf "$dir/ternd"
        PMEM_IS_PMEM_FORCE=1 "$TERND" --data-dir "$dir/ternd" --listen tcp://127.0.0.1:0 \
            --no-shm --resp-port "$TPORT" --pool-size 2g >"$dir/ternd.out" 2>&1 &
        PID=$!
        port=$TPORT
    fi
    wait_port "$port"
}
stop() {
    kill "$PID"
    wait "$PID" 2>/dev/null || true
    PID=""
}

# set_run TARGET KIND: SETs with (ex) or without (plain) a deadline.
set_run() {
    local before after rps
    local args=(set "key:__rand_int__" "value-of-64-bytes-value-of-64-bytes-value-of-64-bytes-val")
    [ "$2" = ex ] && args+=(EX 3600)
    before=$(cpu_ticks "$PID")
    rps=$(redis-benchmark -p "$port" -c 50 -P 16 -n "$REQUESTS" -r 100000 --csv "${args[@]}" \
          2>/dev/null | awk -F'"' 'NR > 1 && $2 != "" {print $4; exit}')
    after=$(cpu_ticks "$PID")
    echo "$1 set-$2 $rps $(awk -v d=$((after - before)) -v hz="$HZ" -v n="$REQUESTS" \
        'BEGIN {printf "%.3f", d / hz / n * 1e6}')" >>"$results"
}

# expire_run TARGET: K keys with PX 5000, then how long after the deadline
# the last one is gone.
expire_run() {
    local t0 deadline before after n
    redis-cli -p "$port" flushall >/dev/null
    python3 -c "
import sys
out = sys.stdout.buffer
for i in range($KEYS):
    k = b'tmp:%d' % i
    out.write(b'*5\r\n\$3\r\nSET\r\n\$%d\r\n%s\r\n\$1\r\nv\r\n\$2\r\nPX\r\n\$4\r\n5000\r\n' % (len(k), k))
" >"$dir/load"
    t0=$(now_ms)
    redis-cli -p "$port" --pipe <"$dir/load" >/dev/null
    deadline=$((t0 + 5000))
    [ "$(now_ms)" -lt $((deadline - 500)) ] || { echo "$1: loading took past the deadline" >&2; exit 1; }
    n=$(redis-cli -p "$port" dbsize)
    [ "$n" -ge $((KEYS * 99 / 100)) ] || { echo "only $n keys loaded" >&2; exit 1; }
    while [ "$(now_ms)" -lt "$deadline" ]; do sleep 0.01; done
    before=$(cpu_ticks "$PID")
    while [ "$(redis-cli -p "$port" dbsize)" != 0 ]; do
        sleep 0.02
        [ $(($(now_ms) - deadline)) -lt 120000 ] || { echo "$1: keys still there 2 min on" >&2; exit 1; }
    done
    after=$(cpu_ticks "$PID")
    echo "$1 expire $(($(now_ms) - deadline)) $(awk -v d=$((after - before)) -v hz="$HZ" \
        -v n="$KEYS" 'BEGIN {printf "%.3f", d / hz / n * 1e6}')" >>"$results"
}

echo "# SET: redis-benchmark -c 50 -P 16 -n $REQUESTS -r 100000; expiry: $KEYS keys PX 5000; $ROUNDS rounds" >&2
for round in $(seq "$ROUNDS"); do
    for target in redis ternd; do
        start "$target"
        set_run "$target" plain
        set_run "$target" ex
        expire_run "$target"
        stop
    done
    echo "# round $round done" >&2
done

python3 - "$results" <<'EOF'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    t, kind, a, b = line.split()
    rows.setdefault((t, kind), []).append((float(a), float(b)))
med = {k: (statistics.median(a for a, _ in v), statistics.median(b for _, b in v))
       for k, v in rows.items()}
print(f"{'target':7} {'test':10} {'ops/s or ms late':>17} {'cpu_us/op':>10}")
for k in sorted(med):
    print(f"{k[0]:7} {k[1]:10} {med[k][0]:>17.0f} {med[k][1]:>10.3f}")
print("\nternd/redis")
for kind in ("set-plain", "set-ex", "expire"):
    if ("ternd", kind) in med and ("redis", kind) in med:
        t, r = med[("ternd", kind)], med[("redis", kind)]
        what = "ms after the deadline" if kind == "expire" else "ops/s"
        print(f"{kind:10} {what}: {t[0] / r[0] if r[0] else float('inf'):.2f}x, "
              f"cpu per op: {t[1] / r[1] if r[1] else float('inf'):.2f}x")
for t in ("redis", "ternd"):
    if (t, "set-plain") in med and (t, "set-ex") in med:
        p, e = med[(t, "set-plain")], med[(t, "set-ex")]
        print(f"{t}: SET EX / plain SET cpu per op {e[1] / p[1]:.2f}x")
EOF

#!/usr/bin/env bash
# ternd's RESP gateway against Debian's redis-server, side by side in one run.
#
#   tools/rpcbench/compare-redis.sh [--ternd PATH] [--requests N] [--clients C]
#                                   [--size BYTES] [--rounds R] [--pool-dir DIR]
#                                   [--tests LIST] [--pipelines LIST]
#
# For each round, each pipeline depth (1 and 16) and each test (SET, GET),
# redis-benchmark runs against redis-server (persistence off) and against
# ternd --resp-port (every SET persistent before its +OK), one after the
# other, each on a freshly started server. With --tests (redis-benchmark's
# names: lpush,rpush,lpop,...), the tests run in that order on one server
# per round and pipeline depth, so that LPOP finds what LPUSH left, as in
# redis-benchmark's default list. For an LRANGE test redis-benchmark
# first fills the list with as many LPUSHes: its row's ops/s is the
# LRANGE's, its CPU per operation counts both. The server's CPU time (utime + stime from /proc/PID/stat) over the
# run divided by the requests gives CPU per operation: on a 2-core machine
# redis-benchmark saturates a core, so ops/s mostly measures the client and
# CPU per operation is the figure that shows the server's cost.
#
# The pool goes on tmpfs with PMEM_IS_PMEM_FORCE=1 by default, the way
# persistent memory is emulated here (libpmem flushes cache lines); with
# --pool-dir on a disk, every batch is msync()ed instead.
#
# Prints one row per (target, pipeline, test) with the medians over rounds,
# then the ratios ternd/redis.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
TERND=${TERND:-$here/../../build/tools/ternd/ternd}
REQUESTS=1000000
CLIENTS=50
SIZE=64
ROUNDS=3
POOL_DIR=/dev/shm
TESTS=""
PIPES="1 16"

while [ $# -gt 0 ]; do
    case $1 in
        --ternd) TERND=$2; shift 2 ;;
        --requests) REQUESTS=$2; shift 2 ;;
        --clients) CLIENTS=$2; shift 2 ;;
        --size) SIZE=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --pool-dir) POOL_DIR=$2; shift 2 ;;
        --tests) TESTS=${2//,/ }; shift 2 ;;
        --pipelines) PIPES=${2//,/ }; shift 2 ;;
        *) echo "usage: $0 [--ternd PATH] [--requests N] [--clients C] [--size B] [--rounds R] [--pool-dir DIR] [--tests LIST] [--pipelines LIST]" >&2
           exit 2 ;;
    esac
done

for tool in redis-server redis-benchmark redis-cli; do
    command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed (apt-get install redis-server redis-tools)" >&2; exit 0; }
done
[ -x "$TERND" ] || { echo "no ternd at $TERND (build first, or --ternd PATH)" >&2; exit 2; }

HZ=$(getconf CLK_TCK)
RPORT=$((20000 + RANDOM % 10000))
TPORT=$((RPORT + 1))
DATA=$(mktemp -d "$POOL_DIR/tern-compare-XXXXXX")
PID=""
results=$(mktemp)

cleanup() {
    [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
    rm -rf "$DATA" "$results"
}
trap cleanup EXIT

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

wait_port() {
    for _ in $(seq 100); do
        redis-cli -p "$1" ping >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    echo "server on port $1 did not answer" >&2
    return 1
}

start_redis() {
    redis-server --port "$RPORT" --save "" --appendonly no --daemonize no \
        --logfile /dev/null >/dev/null 2>&1 &
    PID=$!
    wait_port "$RPORT"
}

start_ternd() {
    rm -rf "$DATA/ternd"
    local env=()
    [ "$(stat -f -c %T "$POOL_DIR")" = tmpfs ] && env=(PMEM_IS_PMEM_FORCE=1)
    env "${env[@]}" "$TERND" --data-dir "$DATA/ternd" --listen tcp://127.0.0.1:0 --no-shm \
        --resp-port "$TPORT" --pool-size 1g >"$DATA/ternd.out" 2>&1 &
    PID=$!
    wait_port "$TPORT"
}

stop() {
    kill "$PID"
    wait "$PID" 2>/dev/null || true
    PID=""
}

# run TARGET PORT PIPELINE TEST: one redis-benchmark run, one result line.
run() {
    local target=$1 port=$2 pipe=$3 test=$4 before after rps
    before=$(cpu_ticks "$PID")
    rps=$(redis-benchmark -p "$port" -t "$test" -d "$SIZE" -c "$CLIENTS" -n "$REQUESTS" \
          -P "$pipe" --csv 2>/dev/null | awk -F'"' 'NR > 1 && $2 != "" {r = $4} END {print r}')
    after=$(cpu_ticks "$PID")
    awk -v t="$target" -v p="$pipe" -v x="$test" -v r="$rps" -v d="$((after - before))" \
        -v hz="$HZ" -v n="$REQUESTS" \
        'BEGIN {printf "%s %s %s %.0f %.3f\n", t, p, x, r, d / hz / n * 1e6}' >>"$results"
}

echo "# redis-benchmark -d $SIZE -c $CLIENTS -n $REQUESTS, $ROUNDS rounds; ternd pool in $POOL_DIR" >&2
for round in $(seq "$ROUNDS"); do
    for pipe in $PIPES; do
        if [ -n "$TESTS" ]; then
            start_redis
            for test in $TESTS; do run redis "$RPORT" "$pipe" "$test"; done
            stop
            start_ternd
            for test in $TESTS; do run ternd "$TPORT" "$pipe" "$test"; done
            stop
            continue
        fi
        for test in set get; do
            start_redis; run redis "$RPORT" "$pipe" "$test"; stop
            start_ternd; run ternd "$TPORT" "$pipe" "$test"; stop
        done
    done
    echo "# round $round done" >&2
done
grep -q persist=flush "$DATA/ternd.out" && persist=flush || persist=msync

# Medians per (target, pipeline, test), then the ratios.
python3 - "$results" "$persist" <<'EOF'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    t, p, x, rps, cpu = line.split()
    rows.setdefault((t, int(p), x), []).append((float(rps), float(cpu)))
print(f"{'target':8} {'pipeline':>8} {'test':>10} {'ops/s':>12} {'cpu_us/op':>10}")
med = {}
for key in sorted(rows):
    rps = statistics.median(r for r, _ in rows[key])
    cpu = statistics.median(c for _, c in rows[key])
    med[key] = (rps, cpu)
    print(f"{key[0]:8} {key[1]:>8} {key[2]:>10} {rps:>12.0f} {cpu:>10.3f}")
print(f"\nternd/redis (ternd persists every SET: {sys.argv[2]})")
print(f"{'pipeline':>8} {'test':>10} {'ops/s ratio':>12} {'cpu/op ratio':>13}")
for (t, p, x), (rps, cpu) in sorted(med.items()):
    if t != "ternd" or ("redis", p, x) not in med:
        continue
    r_rps, r_cpu = med[("redis", p, x)]
    print(f"{p:>8} {x:>10} {rps / r_rps:>12.2f} {cpu / r_cpu:>13.2f}")
EOF

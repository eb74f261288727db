#!/usr/bin/env bash
# What a backup costs a PUT, in one run: the median and 99th percentile of
# a PUT (window 1, updates only, small values), and PUTs a second with 16 in
# flight (the second ratio: how many times fewer), against a plain ternd, and
# against the primary of a two-replica shard ([cluster] kv_shard, w=majority:
# the backup holds it before the reply) shipping as repl_ship = $SHIP says
# (default auto: into the backup's ring where that needs no help from its
# CPU) and by call (repl_ship = call), over each fabric given: the client
# and the primary's sessions to its backup both move to that fabric
# (auto://, TERN_FABRICS). Prints the ratios per fabric.
#
# PM=1 runs every ternd with PMEM_IS_PMEM_FORCE=1: libpmem takes their
# pools and rings for persistent memory (cache-line flushes instead of
# msync), as on a host with PM; a ring on PM is what lets a put followed by
# a read be durable without the backup's CPU (rdma).
#
#   tools/rpcbench/repl-cost.sh BUILD_DIR [FABRIC...]     (default: shm rdma)
#
# NODE_CONF adds lines to every ternd's [node] section (say "busy = yes");
# SECONDS_EACH is each measurement's length (default 5); ROUNDS (default 3)
# how often each is taken, in turn with the others, every figure printed
# being the median of its rounds. The last column is the CPU time each
# ternd spent per PUT at window 16: the plain one; the primary + the
# backup (the busier first).
set -euo pipefail

build=$(cd "${1:?usage: repl-cost.sh BUILD_DIR [FABRIC...]}" && pwd)
shift
fabrics=("$@")
[ ${#fabrics[@]} -gt 0 ] || fabrics=(shm rdma)
secs=${SECONDS_EACH:-5}
ternd=$build/tools/ternd/ternd
tern=$build/tools/tern/tern
bench=$build/tools/rpcbench/rpcbench
[ -x /usr/bin/etcd ] || { echo "SKIP: /usr/bin/etcd not installed (Debian's etcd-server)"; exit 77; }
base=/tmp
[ -d /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/tern-replcost-XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir" || true
}
trap cleanup EXIT
# shellcheck source=tools/common/ports.sh
. "$(dirname "$0")/../common/ports.sh"

ec=$(free_port)
ep=$(free_port)
etcd_url=http://127.0.0.1:$ec
/usr/bin/etcd --name t --data-dir "$dir/etcd" --listen-client-urls "$etcd_url" \
    --advertise-client-urls "$etcd_url" --listen-peer-urls "http://127.0.0.1:$ep" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ep" \
    --initial-cluster "t=http://127.0.0.1:$ep" --log-level error >"$dir/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do curl -sf "$etcd_url/health" >/dev/null 2>&1 && break; sleep 0.1; done

# conf NAME FABRIC CLUSTER(yes|no): a ternd on tcp, and rdma for rdma.
conf() {
    local p r
    p=$(free_port)
    r=$(free_port)
    echo "$p" >"$dir/$1.port"
    {
        echo "[node]"
        echo "name = $1"
        echo "data_dir = $dir/$1"
        echo "listen = tcp://127.0.0.1:$p"
        [ "$2" = rdma ] && echo "listen = rdma://127.0.0.1:$r"
        echo "log_file = $dir/$1.log"
        echo "key_file = $dir/key"
        [ -n "${NODE_CONF:-}" ] && printf '%b\n' "$NODE_CONF"
        echo "[kv]"
        echo "pool_size = 64m"
        echo "[doc]"
        echo "enabled = no"
        if [ "$3" = yes ]; then
            echo "[cluster]"
            echo "etcd = $etcd_url"
            echo "prefix = /$4"
            echo "lease_ttl = 2"
            echo "shard = kv"
            echo "kv_shard = kv"
            echo "repl_ship = $5"
        fi
    } >"$dir/$1.conf"
}
# A cluster key: without one, ternd serves only processes it can name on
# this host, which rdma connections cannot show (they would fall back to tcp).
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/key"
chmod 600 "$dir/key"
export TERN_KEY_FILE=$dir/key
pm_env=()
[ "${PM:-0}" = 1 ] && pm_env=(PMEM_IS_PMEM_FORCE=1)
start() {    # NAME FABRIC
    env "${pm_env[@]}" TERN_FABRICS=$2,tcp "$ternd" --config "$dir/$1.conf" >"$dir/$1.out" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do grep -qs '^ternd ready' "$dir/$1.out" && return 0; sleep 0.05; done
    echo "repl-cost: $1 not ready: $(cat "$dir/$1.out")" >&2
    exit 1
}
# CPU seconds a process has used (user and system).
cpu_of() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.3f\n", ($14 + $15) / hz}' "/proc/$1/stat"; }
run() {    # FABRIC URIS PID... -> "p50 p99 puts/s(window 1) puts/s(window 16) cpu-us/PUT..."
    local a b f=$1 uris=$2 n t0=() t1=() i
    shift 2
    a=$(TERN_FABRICS=$f,tcp "$bench" failover --replicas "$uris" --mix put --window 1 --records 1000 \
        --seconds "$secs" --json 2>"$dir/bench.err" |
        python3 -c "import json,sys; r=json.load(sys.stdin); assert r['lost']==0; print(r['put_p50_us'], r['put_p99_us'])")
    for i in "$@"; do t0+=("$(cpu_of "$i")"); done
    b=$(TERN_FABRICS=$f,tcp "$bench" failover --replicas "$uris" --mix put --window 16 --records 1000 \
        --seconds "$secs" --json 2>"$dir/bench.err" |
        python3 -c "import json,sys; r=json.load(sys.stdin); assert r['lost']==0; print(r['puts_ok'], int(r['puts_ok'] / r['seconds']))")
    for i in "$@"; do t1+=("$(cpu_of "$i")"); done
    n=${b%% *}
    # Each node's CPU per PUT at window 16, the busier node first (the
    # primary: a backup fed one-sided sleeps between the rings it takes).
    echo "$a ${b#* } $(for i in "${!t0[@]}"; do
        python3 -c "import sys; n, a, b = map(float, sys.argv[1:]); print(f'{(b - a) * 1e6 / n:.2f}')" \
            "$n" "${t0[$i]}" "${t1[$i]}"; done |
        sort -rn | tr '\n' ' ')"
}
printf "%-6s %20s %20s %20s %7s %7s %11s %11s %11s %7s %7s %22s\n" fabric "alone p50/p99" \
    "${SHIP:-auto} p50/p99" "by call p50/p99" "it/alone" "call/it" "alone/s" "${SHIP:-auto}/s" \
    "by call/s" "alone/it" "it/call" "CPU us/PUT alone; it"
ratio() { python3 -c "print(f'{$1/$2:.2f}x')"; }
med() { python3 -c "import statistics, sys; print(statistics.median(map(float, sys.argv[1:])))" "$@"; }
stop_nodes() {
    for p in "${pids[@]:1}"; do kill "$p" 2>/dev/null || true; done
    wait "${pids[@]:1}" 2>/dev/null || true
    pids=("${pids[0]}")
}
for f in "${fabrics[@]}"; do
    # The three set-ups side by side, measured in turn ROUNDS times: the
    # machine drifts (other guests, frequency) over a run, and a ratio of
    # figures taken minutes apart would carry that drift. The two not
    # measured sleep meanwhile (their loops block in epoll).
    conf "p$f" "$f" no
    start "p$f" "$f"
    declare -A uris=([alone]="auto://127.0.0.1:$(cat "$dir/p$f.port")")
    declare -A node_pids=([alone]="${pids[-1]}")
    for ship in "${SHIP:-auto}" call; do
        a=a$f$ship b=b$f$ship
        conf "$a" "$f" yes "c$f$ship" "$ship"
        conf "$b" "$f" yes "c$f$ship" "$ship"
        "$tern" shard define --etcd "$etcd_url" --prefix "/c$f$ship" kv "$a" "$b" >/dev/null 2>&1 || true
        start "$a" "$f"
        start "$b" "$f"
        k=$([ "$ship" = call ] && echo call || echo it)
        uris[$k]="auto://127.0.0.1:$(cat "$dir/$a.port"),auto://127.0.0.1:$(cat "$dir/$b.port")"
        node_pids[$k]="${pids[-2]} ${pids[-1]}"
    done
    declare -A col=()
    for _ in $(seq "${ROUNDS:-3}"); do
        for k in alone it call; do
            # shellcheck disable=SC2086
            read -r -a v < <(run "$f" "${uris[$k]}" ${node_pids[$k]})
            for i in "${!v[@]}"; do col[$k.$i]="${col[$k.$i]:-} ${v[$i]}"; done
        done
    done
    stop_nodes
    declare -A m=()
    for key in "${!col[@]}"; do
        # shellcheck disable=SC2086
        m[$key]=$(med ${col[$key]})
    done
    printf "%-6s %9s / %-8s %9s / %-8s %9s / %-8s %7s %7s %11.0f %11.0f %11.0f %7s %7s %22s\n" "$f" \
        "${m[alone.0]}" "${m[alone.1]}" "${m[it.0]}" "${m[it.1]}" "${m[call.0]}" "${m[call.1]}" \
        "$(ratio "${m[it.0]}" "${m[alone.0]}")" "$(ratio "${m[call.0]}" "${m[it.0]}")" \
        "${m[alone.2]}" "${m[it.2]}" "${m[call.2]}" "$(ratio "${m[alone.2]}" "${m[it.2]}")" \
        "$(ratio "${m[it.2]}" "${m[call.2]}")" "${m[alone.3]}; ${m[it.3]} + ${m[it.4]}"
    unset uris node_pids col m
done

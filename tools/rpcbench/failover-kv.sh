#!/usr/bin/env bash
# Kill the primary of a replicated KV shard again and again under load:
# etcd and three ternds on this host ([cluster] kv_shard, lease LEASE s),
# `rpcbench failover` running YCSB-A with w=majority against them, and
# every PERIOD s the primary (as `tern status` names it) killed with
# SIGKILL and started again half a second later. It passes if no
# acknowledged write was lost and writes never stopped for more than twice
# the lease.
#
#   tools/rpcbench/failover-kv.sh BUILD_DIR [ROUNDS] [LEASE] [PERIOD]
#
# (defaults 50 rounds, a 2 s lease, 6 s between kills). With VICTIM=etcd
# each round kills etcd instead and starts it again after ETCD_DOWN
# seconds (default 5) on the same data: the load must lose nothing, writes
# must go on while etcd is away (the primary keeps its office on what a
# majority of replicas confirms), and the shard must have a primary once
# etcd is back. VICTIM=pause stops the primary (SIGSTOP) for PAUSE seconds
# (default 2 leases + 1 s) instead, while its clients' sessions stay open:
# the others elect a successor, and the old primary, resumed, still thinks
# it leads and is sent calls; it must acknowledge nothing (it is fenced)
# and catch up as a backup. VICTIM=mixed takes turns: etcd, then a kill
# (an election right after etcd came back), then a pause.
set -euo pipefail

build=$(cd "${1:?usage: failover-kv.sh BUILD_DIR [ROUNDS] [LEASE] [PERIOD]}" && pwd)
rounds=${2:-50}
lease=${3:-2}
period=${4:-6}
ternd=$build/tools/ternd/ternd
tern=$build/tools/tern/tern
bench=$build/tools/rpcbench/rpcbench
[ -x /usr/bin/etcd ] || { echo "SKIP: /usr/bin/etcd not installed (Debian's etcd-server)"; exit 77; }
help=$("$ternd" --help 2>&1 || true)
grep -q -- '--kv-shard' <<<"$help" || { echo "SKIP: ternd built without [cluster]"; exit 77; }
base=/tmp
[ -d /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/tern-failover-XXXXXX")
declare -A pid port
etcd_pid=
load_pid=
cleanup() {
    for p in "${pid[@]}" $etcd_pid $load_pid; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ -n "${KEEP:-}" ]; then echo "failover-kv: kept $dir" >&2; else rm -rf "$dir" || true; fi
}
trap cleanup EXIT
fail() {
    echo "failover-kv: $*" >&2
    for n in a b c; do
        echo "  $n: $(state_of "$n" 2>/dev/null || echo '?')" >&2
        [ -f "$dir/$n.log" ] && grep -h "repl\|cluster\|error" "$dir/$n.log" | tail -12 |
            sed "s/^/  $n: /" >&2
        [ -f "$dir/$n.out" ] && grep -v "^ternd ready" "$dir/$n.out" | tail -3 | sed "s/^/  $n out: /" >&2
    done
    exit 1
}
# shellcheck source=tools/common/ports.sh
. "$(dirname "$0")/../common/ports.sh"

ec=$(free_port)
ep=$(free_port)
etcd_url=http://127.0.0.1:$ec
start_etcd() {
    /usr/bin/etcd --name t --data-dir "$dir/etcd" --listen-client-urls "$etcd_url" \
        --advertise-client-urls "$etcd_url" --listen-peer-urls "http://127.0.0.1:$ep" \
        --initial-advertise-peer-urls "http://127.0.0.1:$ep" \
        --initial-cluster "t=http://127.0.0.1:$ep" --log-level error >>"$dir/etcd.log" 2>&1 &
    etcd_pid=$!
    for _ in $(seq 200); do
        curl -sf "$etcd_url/health" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    fail "etcd did not come up: $(tail -3 "$dir/etcd.log")"
}
start_etcd
uris=
for n in a b c; do
    port[$n]=$(free_port)
    uris=$uris${uris:+,}tcp://127.0.0.1:${port[$n]}
    cat >"$dir/$n.conf" <<EOC
[node]
name = $n
data_dir = $dir/$n
listen = tcp://127.0.0.1:${port[$n]}
log_file = $dir/$n.log
log_level = info
[kv]
pool_size = 64m
[doc]
enabled = no
[cluster]
etcd = $etcd_url
prefix = /fo
lease_ttl = $lease
shard = kv0
kv_shard = kv0
EOC
done
"$tern" shard define --etcd "$etcd_url" --prefix /fo kv0 a b c >/dev/null || fail "shard define"
start() {
    "$ternd" --config "$dir/$1.conf" >>"$dir/$1.out" 2>&1 &
    pid[$1]=$!
}
for n in a b c; do start $n; done
repl_field() {
    "$tern" status --json "127.0.0.1:${port[$1]}" 2>/dev/null |
        python3 -c "import json,sys; r=json.load(sys.stdin)['replication']; print(r['$2'] if r else 'none')" 2>/dev/null ||
        echo down
}
state_of() { repl_field "$1" state; }
# Every ternd alive (a crash is a failure, not one more outage).
all_alive() {
    local n
    for n in a b c; do
        kill -0 "${pid[$n]}" 2>/dev/null ||
            fail "round $1: $n's ternd exited on its own: $(tail -3 "$dir/$n.out" 2>/dev/null)"
    done
}
primary() {
    for n in a b c; do [ "$(state_of $n)" = primary ] && { echo $n; return 0; }; done
    return 1
}
for _ in $(seq 100); do primary >/dev/null && break; sleep 0.1; done
primary >/dev/null || fail "no primary after 10 s"

# Long enough for every round; told to stop (SIGUSR1) after the last.
secs=$(( rounds * (period + 5 + ${ETCD_DOWN:-5}) + period ))
"$bench" failover --replicas "$uris" --records 5000 --seconds "$secs" --window 16 --json \
    >"$dir/load.json" 2>"$dir/load.err" &
load_pid=$!
load_t0=$(date +%s%N)
sleep "$period"
killed=0
etcd_restarts=0
elections=0
paused=0
for r in $(seq "$rounds"); do
    what=${VICTIM:-primary}
    if [ "$what" = mixed ]; then
        what=(pause etcd primary)
        what=${what[$((r % 3))]}
    fi
    if [ "$what" = pause ]; then
        victim=$(primary) || fail "round $r: no primary to stop"
        kill -STOP "${pid[$victim]}"
        echo "failover-kv: round $r: $victim stopped at $(( ($(date +%s%N) - load_t0) / 1000000 )) ms" >&2
        paused=$((paused + 1))
        sleep "${PAUSE:-$((2 * lease + 1))}"
        kill -CONT "${pid[$victim]}"
        sleep "$period"
        kill -0 "$load_pid" 2>/dev/null || fail "the load ended early: $(tail -3 "$dir/load.err")"
        all_alive "$r"
        continue
    fi
    if [ "$what" = etcd ]; then
        before=$(primary) || fail "round $r: no primary before etcd goes"
        epoch=$(repl_field "$before" epoch)
        kill -9 "$etcd_pid"
        { wait "$etcd_pid"; } 2>/dev/null || true
        etcd_restarts=$((etcd_restarts + 1))
        sleep "${ETCD_DOWN:-5}"
        start_etcd
        for _ in $(seq 100); do primary >/dev/null && break; sleep 0.1; done
        after=$(primary) || fail "round $r: no primary 10 s after etcd came back"
        [ "$after" = "$before" ] && [ "$(repl_field "$after" epoch)" = "$epoch" ] ||
            elections=$((elections + 1))
        sleep "$period"
        kill -0 "$load_pid" 2>/dev/null || fail "the load ended early: $(tail -3 "$dir/load.err")"
        all_alive "$r"
        continue
    fi
    victim=
    for _ in $(seq 100); do victim=$(primary) && break; sleep 0.1; done
    [ -n "$victim" ] || fail "round $r: no primary to kill"
    kill -9 "${pid[$victim]}"
    { wait "${pid[$victim]}"; } 2>/dev/null || true
    killed=$((killed + 1))
    sleep 0.5
    start "$victim"
    sleep "$period"
    kill -0 "$load_pid" 2>/dev/null || fail "the load ended early: $(tail -3 "$dir/load.err")"
    all_alive "$r"
done
kill -USR1 "$load_pid"
wait "$load_pid" || true
load_pid=
python3 - "$dir/load.json" "$killed" "$lease" "$etcd_restarts" "$elections" "$paused" <<'PYEOF' || fail "$(tail -5 "$dir/load.err")"
import json, sys
r = json.load(open(sys.argv[1]))
killed, lease = int(sys.argv[2]), float(sys.argv[3])
restarts, elections, paused = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
outs = sorted(o["ms"] for o in r["outages"])
worst = r["worst_outage_ms"]
med = outs[len(outs) // 2] if outs else 0
what = []
if killed:
    what.append(f"{killed} primaries killed")
if paused:
    what.append(f"{paused} primaries paused")
if restarts:
    what.append(f"{restarts} etcd restarts ({elections} followed by a new primary or epoch)")
print(f"failover-kv: {', '.join(what)} (lease {lease:g} s): {r['puts_ok']} writes "
      f"acknowledged with w=majority, {r['puts_failed']} not; {r['gets_ok']} reads checked; "
      f"lost {r['lost']}; {len(outs)} outages, median {med:.0f} ms, worst {worst:.0f} ms "
      f"(bar: {2 * lease * 1000:.0f} ms)")
if outs:
    print("failover-kv: outages (s into the load: ms): " +
          ", ".join(f"{o['at_s']:.1f}: {o['ms']:.0f}" for o in r["outages"]))
sys.exit(0 if r["lost"] == 0 and worst <= 2 * lease * 1000 else 1)
PYEOF

#!/usr/bin/env bash
# Members of a replicated KV shard changed under load with `tern shard`:
# etcd and four ternds on this host, the shard kv0 defined on a, b and c
# (d has it in its configuration but is no replica), `rpcbench failover`
# running YCSB-A with w=majority the whole time, told of a, b and c only.
# Then:
#
#   1. tern shard add kv0 d: d is copied in while the shard serves, then
#      made a voter;
#   2. tern shard remove kv0 PRIMARY: the primary hands its office over and
#      is dropped;
#   3. the other two of a, b, c removed the same way, one after the other:
#      d alone is left, the primary, and the client must have learned of
#      it from the shard's map;
#   4. tern shard add kv0 (the first primary): it comes back with what it
#      had, is copied over, and votes again.
#
# The primaries' logs of recent writes are small (1 MiB), so that the
# nodes added get full copies. It passes if every step ends (the map as asked, within WAIT s), no
# acknowledged write was lost, writes never stopped for more than twice
# the lease, the added nodes hold the primary's records, and the removed
# ones say they are no replica.
#
#   tests/ternd_members.sh BUILD_DIR [LEASE]      (KEEP=1 keeps the files)
set -euo pipefail

build=$(cd "${1:?usage: ternd_members.sh BUILD_DIR [LEASE]}" && pwd)
lease=${2:-2}
wait_s=${WAIT:-90}
ternd=$build/tools/ternd/ternd
tern=$build/tools/tern/tern
bench=$build/tools/rpcbench/rpcbench
[ -x /usr/bin/etcd ] || { echo "SKIP: /usr/bin/etcd not installed (Debian's etcd-server)"; exit 77; }
help=$("$ternd" --help 2>&1 || true)
grep -q -- '--kv-shard' <<<"$help" || { echo "SKIP: ternd built without [cluster]"; exit 77; }
base=/tmp
[ -d /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/tern-members-XXXXXX")
declare -A pid port
nodes=(a b c d)
etcd_pid=
load_pid=
cleanup() {
    for p in "${pid[@]}" $etcd_pid $load_pid; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ -n "${KEEP:-}" ]; then echo "ternd-members: kept $dir" >&2; else rm -rf "$dir" || true; fi
}
trap cleanup EXIT
fail() {
    echo "ternd-members: $*" >&2
    "$tern" shard list --etcd "$etcd_url" --prefix /mb 2>&1 | sed "s/^/  map: /" >&2 || true
    for n in "${nodes[@]}"; do
        "$tern" status "127.0.0.1:${port[$n]}" 2>/dev/null | grep -A5 "^replicated" |
            sed "s/^/  $n: /" >&2 || echo "  $n: down" >&2
        [ -f "$dir/$n.log" ] && grep -h "repl\|cluster\|error" "$dir/$n.log" | tail -10 |
            sed "s/^/  $n: /" >&2
    done
    exit 1
}
# shellcheck source=tools/common/ports.sh
. "$(dirname "$0")/../tools/common/ports.sh"

ec=$(free_port)
ep=$(free_port)
etcd_url=http://127.0.0.1:$ec
/usr/bin/etcd --name t --data-dir "$dir/etcd" --listen-client-urls "$etcd_url" \
    --advertise-client-urls "$etcd_url" --listen-peer-urls "http://127.0.0.1:$ep" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ep" \
    --initial-cluster "t=http://127.0.0.1:$ep" --log-level error >>"$dir/etcd.log" 2>&1 &
etcd_pid=$!
for _ in $(seq 200); do curl -sf "$etcd_url/health" >/dev/null 2>&1 && break; sleep 0.1; done
curl -sf "$etcd_url/health" >/dev/null 2>&1 || fail "etcd did not come up: $(tail -3 "$dir/etcd.log")"
uris=
for n in "${nodes[@]}"; do
    port[$n]=$(free_port)
    [ "$n" = d ] || uris=$uris${uris:+,}tcp://127.0.0.1:${port[$n]}
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
prefix = /mb
lease_ttl = $lease
shard = kv0
kv_shard = kv0
repl_log_mb = 1
EOC
done
"$tern" shard define --etcd "$etcd_url" --prefix /mb kv0 a b c >/dev/null || fail "shard define"
for n in "${nodes[@]}"; do
    "$ternd" --config "$dir/$n.conf" >>"$dir/$n.out" 2>&1 &
    pid[$n]=$!
done
repl_field() {
    "$tern" status --json "127.0.0.1:${port[$1]}" 2>/dev/null |
        python3 -c "import json,sys; r=json.load(sys.stdin)['replication']; print(r['$2'] if r else 'none')" 2>/dev/null ||
        echo down
}
primary() {
    local n
    for n in "${nodes[@]}"; do [ "$(repl_field $n state)" = primary ] && { echo $n; return 0; }; done
    return 1
}
for _ in $(seq 100); do primary >/dev/null && break; sleep 0.1; done
primary >/dev/null || fail "no primary after 10 s"
[ "$(repl_field d state)" = none ] || fail "d, no replica, says $(repl_field d state)"

"$bench" failover --replicas "$uris" --records 5000 --seconds 600 --window 16 --json \
    >"$dir/load.json" 2>"$dir/load.err" &
load_pid=$!
sleep 3
shard() {
    echo "ternd-members: tern shard $*" >&2
    "$tern" shard "$1" --etcd "$etcd_url" --prefix /mb --wait "$wait_s" "${@:2}" \
        >"$dir/step.out" 2>&1 || fail "tern shard $*: $(tail -5 "$dir/step.out")"
    sed 's/^/    /' "$dir/step.out" >&2
    kill -0 "$load_pid" 2>/dev/null || fail "the load ended early: $(tail -3 "$dir/load.err")"
}
# A replica the primary streams to, at its position (under load the
# primary's word is the one that counts).
streams_to() {
    local p=$1 n=$2
    "$tern" status --json "127.0.0.1:${port[$p]}" 2>/dev/null | python3 -c "
import json, sys
r = json.load(sys.stdin)['replication']
sys.exit(0 if r and any(x['node'] == '$n' and x['state'] == 'streaming'
                        and x['vote'] == 'voter' for x in r['replicas']) else 1)"
}

shard add kv0 d
p=$(primary) || fail "no primary after d was added"
for _ in $(seq 100); do streams_to "$p" d && break; sleep 0.1; done
streams_to "$p" d || fail "$p does not stream to d as a voter"
[ "$(repl_field d state)" = backup ] || fail "d is $(repl_field d state), not a backup"
sleep 2

old=$(primary) || fail "no primary to remove"
shard remove kv0 "$old"
sleep 1
p=$(primary) || fail "no primary after $old left"
[ "$p" != "$old" ] || fail "$old is still primary after it was removed"
[ "$(repl_field "$old" state)" = none ] || fail "$old, removed, says $(repl_field "$old" state)"
sleep 2

# The other two, the primary first if it is one of them: d is left alone.
for _ in 1 2; do
    p=$(primary) || fail "no primary"
    gone=$p
    if [ "$p" = d ]; then
        for n in a b c; do
            [ "$n" != "$old" ] && [ "$(repl_field $n state)" != none ] && { gone=$n; break; }
        done
    fi
    shard remove kv0 "$gone"
    sleep 2
done
[ "$(primary)" = d ] || fail "d is not the primary of a shard of d alone"
shard add kv0 "$old"
p=$(primary) || fail "no primary after $old came back"
for _ in $(seq 100); do streams_to "$p" "$old" && break; sleep 0.1; done
streams_to "$p" "$old" || fail "$p does not stream to $old as a voter"
sleep 2
copies=$(cat "$dir"/*.log | grep -c "needs a full copy" || true)
[ "$copies" -ge 1 ] || fail "no node added was copied in (the log of recent writes held all)"
kill -USR1 "$load_pid"
wait "$load_pid" || true
load_pid=
"$tern" shard list --etcd "$etcd_url" --prefix /mb | sed 's/^/ternd-members: map: /' >&2
python3 - "$dir/load.json" "$lease" "$copies" <<'PYEOF' || fail "$(tail -5 "$dir/load.err")"
import json, sys
r = json.load(open(sys.argv[1]))
lease, copies = float(sys.argv[2]), int(sys.argv[3])
outs = sorted(o["ms"] for o in r["outages"])
worst = r["worst_outage_ms"]
print(f"ternd-members: d added, a, b and c removed (the client knew only them), the "
      f"first primary added back (lease {lease:g} s; {copies} full copies): {r['puts_ok']} writes acknowledged with "
      f"w=majority, {r['puts_failed']} not; {r['gets_ok']} reads checked; lost {r['lost']}; "
      f"{len(outs)} outages, worst {worst:.0f} ms (bar: {2 * lease * 1000:.0f} ms)")
sys.exit(0 if r["lost"] == 0 and worst <= 2 * lease * 1000 else 1)
PYEOF

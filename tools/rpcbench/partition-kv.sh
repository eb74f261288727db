#!/usr/bin/env bash
# Cut the primary of a replicated KV shard off from the rest of the rack
# while clients write, again and again (root: network namespaces).
#
# A rack of two racks of three hosts (tools/rack/rack): etcd on r1h1, the
# shard kv0 on r2h1..r2h3, a lease of LEASE s. A client on r1h2 runs
# `rpcbench failover` (YCSB-A, w=majority) against the shard the whole
# time. Each round cuts the primary's host off (its link on the rack's
# bridge and its NTB cables: `rack cut`) for CUT s, while a second client
# on that host itself, which still reaches the old primary and nothing
# else, writes to it (`rpcbench failover --no-load --mix put`); then heals
# the host and waits for the shard to converge (the old primary a backup,
# every replica at the primary's position). It passes if:
#   - the client left with the cut-off primary had no write acknowledged
#     (two primaries never acknowledge writes for one shard);
#   - the other client lost no acknowledged write and never waited more
#     than twice the lease;
#   - the shard converged after every heal.
# The emulated RDMA NIC is shared memory, which a namespace does not cut,
# so the ternds and clients here run on TCP (TERN_FABRICS=tcp).
# MODE=kill kills the primary's ternd with SIGKILL instead (and starts it
# again half a second later), waits for convergence, then CUT s more: the
# kill test of tools/rpcbench/failover-kv.sh on rack hosts. LOAD_LOG sets
# the load's log level (TERN_LOG; default warn). On a failure every log,
# the load's report and the times of the cuts are kept in a directory the
# script names.
#
#   tools/rpcbench/partition-kv.sh BUILD_DIR [ROUNDS] [CUT] [LEASE]
#
# (defaults 5 rounds, 8 s cut, 2 s lease).
set -euo pipefail

build=$(cd "${1:?usage: partition-kv.sh BUILD_DIR [ROUNDS] [CUT] [LEASE]}" && pwd)
rounds=${2:-5}
cut=${3:-8}
lease=${4:-2}
src=$(cd "$(dirname "$0")/../.." && pwd)
rack=$src/tools/rack/rack
tern=$build/tools/tern/tern
bench=$build/tools/rpcbench/rpcbench
[ "$(id -u)" -eq 0 ] || { echo "SKIP: partitions need root (network namespaces)"; exit 77; }
command -v ip >/dev/null || { echo "SKIP: needs iproute2"; exit 77; }
[ -x /usr/bin/etcd ] || { echo "SKIP: /usr/bin/etcd not installed (Debian's etcd-server)"; exit 77; }
if ! ip netns add tern-part-probe 2>/dev/null; then
    echo "SKIP: network namespaces are not allowed here"
    exit 77
fi
ip netns del tern-part-probe
"$build/tools/ternd/ternd" --help 2>&1 | grep -q -- '--kv-shard' ||
    { echo "SKIP: ternd built without [cluster]"; exit 77; }

export TERN_RACK_DIR TERN_FABRICS=tcp
TERN_RACK_DIR=$(mktemp -d /tmp/tern-part-XXXXXX)
rmdir "$TERN_RACK_DIR"
work=$(mktemp -d /tmp/tern-part-work-XXXXXX)
load_pid=
cleanup() {
    [ -z "$load_pid" ] || kill -9 "$load_pid" 2>/dev/null || true
    "$rack" down >/dev/null 2>&1 || true
    rm -rf "$work" || true
}
trap cleanup EXIT
fail() {
    echo "partition-kv: $*" >&2
    for h in r2h1 r2h2 r2h3; do
        echo "  $h: $(view "$h" 2>/dev/null)" >&2
        on "$h" "$tern" status --json "$(addr "$h"):7300" 2>/dev/null | python3 -c "
import json, sys
r = json.load(sys.stdin)['replication']
print('  replicas: ' + ', '.join(x['node'] + ' ' + x['state'] for x in r['replicas']))" >&2 || true
        [ -f "$TERN_RACK_DIR/$h/ternd.log" ] &&
            grep -h "repl\|cluster" "$TERN_RACK_DIR/$h/ternd.log" | tail -12 | sed "s/^/  $h: /" >&2
    done
    # Every log, the load's report and the times of the cuts, for a look
    # after the rack is down.
    kept=$(mktemp -d /tmp/tern-part-failed-XXXXXX)
    cp -r "$TERN_RACK_DIR" "$kept/rack" 2>/dev/null || true
    cp -r "$work" "$kept/work" 2>/dev/null || true
    echo "partition-kv: logs kept in $kept" >&2
    exit 1
}
on() { "$rack" exec "$@"; }
addr() { echo "10.2.0.${1#r2h}"; }
shard=(r2h1 r2h2 r2h3)

"$rack" up --racks 2 --hosts 3 --build "$build" --etcd 1 --lease "$lease" \
    --kv-shard kv0=r2h1,r2h2,r2h3 >"$work/up" 2>&1 || fail "rack up: $(tail -5 "$work/up")"

# A replica's view of the shard: "state epoch position".
view() {
    on "$1" "$tern" status --json "$(addr "$1"):7300" 2>/dev/null | python3 -c "
import json, sys
r = json.load(sys.stdin)['replication']
print(r['state'], r['epoch'], r['position']) if r else print('none 0 0')" 2>/dev/null ||
        echo "down 0 0"
}
primary() {
    local h
    for h in "${shard[@]}"; do
        [ "$(view "$h" | cut -d' ' -f1)" = primary ] && { echo "$h"; return 0; }
    done
    return 1
}
# One primary, streaming to every other replica, and they backups at its
# epoch (under load positions move: the primary's word on its replicas is
# the one that counts).
converged() {
    local p h
    p=$(primary) || return 1
    on "$p" "$tern" status --json "$(addr "$p"):7300" 2>/dev/null | python3 -c "
import json, sys
r = json.load(sys.stdin)['replication']
sys.exit(0 if r and all(x['state'] == 'streaming' for x in r['replicas']) else 1)" ||
        return 1
    for h in "${shard[@]}"; do
        [ "$h" = "$p" ] || [ "$(view "$h" | cut -d' ' -f1)" = backup ] || return 1
    done
}
for _ in $(seq 100); do primary >/dev/null && break; sleep 0.1; done
primary >/dev/null || fail "no primary after 10 s"

uris=tcp://$(addr r2h1):7300,tcp://$(addr r2h2):7300,tcp://$(addr r2h3):7300
secs=$(( rounds * (cut + 45) + 10 ))
"$rack" exec r1h2 env TERN_LOG=${LOAD_LOG:-warn} "$bench" failover --replicas "$uris" --records 5000 --seconds "$secs" --window 16 \
    --json >"$work/load.json" 2>"$work/load.err" &
load_pid=$!
echo "load started at $(date +%T.%N)" >>"$work/times"
sleep 4
kill -0 "$load_pid" 2>/dev/null || fail "the load ended early: $(tail -3 "$work/load.err")"
stray=0
heal_ms=()
for r in $(seq "$rounds"); do
    victim=$(primary) || fail "round $r: no primary to cut off"
    if [ "${MODE:-cut}" = kill ]; then
        kill -9 "$(cat "$TERN_RACK_DIR/$victim/pid")"
        sleep 0.5
        ip netns exec "tern-$victim" "$build/tools/ternd/ternd" \
            --config "$TERN_RACK_DIR/$victim/ternd.conf" >>"$TERN_RACK_DIR/$victim/out" \
            2>>"$TERN_RACK_DIR/$victim/err" &
        echo $! >"$TERN_RACK_DIR/$victim/pid"
        t0=$(date +%s%N)
        for _ in $(seq 300); do converged && break; sleep 0.1; done
        converged || fail "round $r: no convergence 30 s after restarting $victim"
        heal_ms+=($(( ($(date +%s%N) - t0) / 1000000 )))
        kill -0 "$load_pid" 2>/dev/null || fail "the load ended early: $(tail -3 "$work/load.err")"
        sleep "$cut"
        continue
    fi
    "$rack" cut "$victim"
    echo "round $r: cut $victim at $(date +%T.%N)" >>"$work/times"
    # The client left with it: writes to it alone, for as long as it is cut.
    on "$victim" "$bench" failover --replicas "tcp://$(addr "$victim"):7300" --no-load \
        --mix put --records 1000 --seconds $((cut - 1)) --window 4 --json \
        >"$work/inner.$r.json" 2>"$work/inner.$r.err" || true
    sleep 1
    read -r acked tried < <(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(j['puts_ok'], j['puts_ok'] + j['puts_failed'])" \
        "$work/inner.$r.json" 2>/dev/null) || fail "round $r: the cut-off client said: $(tail -3 "$work/inner.$r.err")"
    [ "$tried" -gt 0 ] || fail "round $r: the cut-off client sent no write"
    stray=$((stray + acked))
    echo "partition-kv: round $r: $victim cut off for ${cut} s; its own client had $acked of $tried writes acknowledged"
    "$rack" heal "$victim"
    echo "round $r: healed $victim at $(date +%T.%N)" >>"$work/times"
    t0=$(date +%s%N)
    for _ in $(seq 300); do converged && break; sleep 0.1; done
    converged || fail "round $r: no convergence 30 s after healing $victim"
    heal_ms+=($(( ($(date +%s%N) - t0) / 1000000 )))
    kill -0 "$load_pid" 2>/dev/null || fail "the load ended early: $(tail -3 "$work/load.err")"
    sleep 3
done
kill -USR1 "$load_pid" 2>/dev/null || true
wait "$load_pid" || true
load_pid=
python3 - "$work/load.json" "$rounds" "$lease" "$stray" "${heal_ms[*]}" "${MODE:-cut}" <<'PYEOF' ||
import json, sys
r = json.load(open(sys.argv[1]))
rounds, lease, stray = int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
heal = sorted(int(x) for x in sys.argv[5].split())
outs = sorted(o["ms"] for o in r["outages"])
worst = r["worst_outage_ms"]
med = outs[len(outs) // 2] if outs else 0
how = "killed and restarted" if sys.argv[6] == "kill" else "cut off"
print(f"partition-kv: {rounds} primaries {how} (lease {lease:g} s): {r['puts_ok']} writes "
      f"acknowledged with w=majority, {r['puts_failed']} not; {r['gets_ok']} reads checked; "
      f"lost {r['lost']}; outages median {med:.0f} ms, worst {worst:.0f} ms "
      f"(bar: {2 * lease * 1000:.0f} ms); " +
      (f"writes acknowledged to the cut-off clients: {stray}; " if sys.argv[6] != "kill" else "") +
      f"converged in {heal[len(heal) // 2]} ms (median), {heal[-1]} ms (worst) after each "
      f"{'restart' if sys.argv[6] == 'kill' else 'heal'}")
sys.exit(0 if r["lost"] == 0 and stray == 0 and worst <= 2 * lease * 1000 else 1)
PYEOF
    fail "$(tail -5 "$work/load.err")"

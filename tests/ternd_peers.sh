#!/usr/bin/env bash
# Two ternds on this host, each naming the other as a [peer] of its rack:
# each keeps a session to the other (shm, the policy's first fabric that
# reaches a peer on the same host); `tern status` shows the node and the
# peer with the fields the operator's view promises, `tern ping` answers,
# the metrics endpoint serves the same counters in Prometheus text; a peer
# that stops shows as down with the reason and comes back up when it
# returns; SIGHUP with a new [policy] moves the session to TCP.
#
#   tests/ternd_peers.sh BUILD_DIR
set -euo pipefail

build=$1
ternd=$build/tools/ternd/ternd
tern=$build/tools/tern/tern
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 0; }
base=/tmp
[ -d /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/tern-peers-XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$dir" || true
}
trap cleanup EXIT
fail() { echo "ternd peers: $*" >&2; for h in a b; do [ -f "$dir/$h.log" ] && sed "s/^/  $h: /" "$dir/$h.log" | tail -15 >&2; done; exit 1; }

port_a=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
port_b=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
conf() {    # NAME PORT PEER PEER_PORT
    cat >"$dir/$1.conf" <<EOF
[node]
name = $1
rack = r1
data_dir = $dir/$1
listen = tcp://127.0.0.1:$2
metrics_port = 0
log_file = $dir/$1.log
log_level = info

[kv]
pool_size = 4m
seg_size = 64k

[doc]
enabled = no

[peer $3]
address = tcp://127.0.0.1:$4
rack = r1
EOF
}
conf a "$port_a" b "$port_b"
conf b "$port_b" a "$port_a"

start() {    # NAME
    "$ternd" --config "$dir/$1.conf" >"$dir/$1.out" 2>"$dir/$1.err" &
    pids+=($!)
    eval "pid_$1=$!"
    for _ in $(seq 100); do
        grep -q '^ternd ready' "$dir/$1.out" && return 0
        sleep 0.05
    done
    fail "$1 not ready: $(cat "$dir/$1.out" "$dir/$1.err")"
}
start a
start b

# The field of peer b in a's status (JSON), by python.
peer_field() {    # ADDRESS FIELD
    "$tern" status --json "$1" | python3 -c "import json,sys; o=json.load(sys.stdin); print(o['peers'][0]['$2'])"
}
wait_for() {    # WHAT CMD...: until CMD succeeds, 5 s at most
    local what=$1
    shift
    for _ in $(seq 100); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    fail "$what never happened"
}
is_up_over() { [ "$(peer_field "127.0.0.1:$port_a" state)" = up ] && [ "$(peer_field "127.0.0.1:$port_a" fabric)" = "$1" ]; }
wait_for "a's session to b over shm" is_up_over shm

# The JSON has what the operator's view promises.
"$tern" status --json "127.0.0.1:$port_a" >"$dir/status.json" || fail "tern status --json failed"
python3 - "$dir/status.json" <<'PY' || fail "status JSON: $(cat "$dir/status.json")"
import json, sys
o = json.load(open(sys.argv[1]))
for k in ["node", "rack", "uptime_s", "services", "peers"]:
    assert k in o, k
assert o["node"] == "a" and o["rack"] == "r1" and o["uptime_s"] > 0, o
assert o["services"] == ["kv"], o["services"]
p = o["peers"][0]
for k in ["node", "rack", "fabric", "calls", "errors", "failovers"]:
    assert k in p, k
assert p["node"] == "b" and p["rack"] == "r1" and p["fabric"] == "shm", p
assert p["errors"] == 0 and p["failovers"] == 0 and p["credits"] > 0, p
PY
"$tern" status "127.0.0.1:$port_a" >"$dir/table" || fail "tern status failed"
grep -Eq '^b +r1 +up +shm ' "$dir/table" || fail "status table: $(cat "$dir/table")"
"$tern" ping -c 2 "127.0.0.1:$port_b" >"$dir/ping" || fail "tern ping: $(cat "$dir/ping")"
grep -q '^2 sent, 2 answered, rtt' "$dir/ping" || fail "tern ping: $(cat "$dir/ping")"

# Metrics: the same counters; 404 elsewhere.
mport=$(sed -n 's/.* metrics=127.0.0.1:\([0-9]*\).*/\1/p' "$dir/a.out")
[ -n "$mport" ] || fail "no metrics port in the ready line: $(cat "$dir/a.out")"
curl -sf "http://127.0.0.1:$mport/metrics" >"$dir/metrics" || fail "GET /metrics failed"
for want in 'tern_peer_up{peer="b",rack="r1"} 1' 'tern_peer_fabric{peer="b",rack="r1",fabric="shm"} 1' \
    '# TYPE tern_peer_calls_total counter' 'tern_peer_failovers_total{peer="b",rack="r1"} 0'; do
    grep -qF "$want" "$dir/metrics" || fail "metrics without '$want': $(cat "$dir/metrics")"
done
calls=$(sed -n 's/^tern_peer_calls_total{peer="b",rack="r1"} //p' "$dir/metrics")
[ "${calls:-0}" -gt 0 ] || fail "no calls counted: $(cat "$dir/metrics")"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$mport/nope")
[ "$code" = 404 ] || fail "GET /nope answered $code"

# b stops: a shows it down with why; b returns: up again.
kill -TERM "$pid_b"
wait "$pid_b" || fail "b exited with $? on SIGTERM"
is_down() { [ "$(peer_field "127.0.0.1:$port_a" state)" = down ]; }
wait_for "b shown down" is_down
[ "$(peer_field "127.0.0.1:$port_a" rtt_us)" = "0.0" ] ||
    fail "a down peer shows a round trip: $(peer_field "127.0.0.1:$port_a" rtt_us)"
peer_field "127.0.0.1:$port_a" last_error | grep -q 'refused\|reset\|lost' ||
    fail "no reason for the loss: $(peer_field "127.0.0.1:$port_a" last_error)"
start b
wait_for "b back up" is_up_over shm

# SIGHUP with same_rack = tcp: the session moves to TCP.
printf '\n[policy]\nsame_rack = tcp\n' >>"$dir/a.conf"
kill -HUP "$pid_a"
wait_for "a's session to b moved to tcp by the new policy" is_up_over tcp
grep -q 'policy shm,ntb,rdma,tcp -> tcp' "$dir/a.log" || fail "no policy change logged"

# A node nobody runs: a clear error, status 2.
rc=0
"$tern" status 127.0.0.1:1 >/dev/null 2>"$dir/err" || rc=$?
[ $rc -eq 2 ] && grep -q 'connection refused' "$dir/err" || fail "status of nothing: $rc $(cat "$dir/err")"
for p in "$pid_a" "$pid_b"; do
    kill -TERM "$p"
    wait "$p" || fail "a ternd exited with $? on SIGTERM"
done
pids=()
grep -q 'ternd: stopped$' "$dir/a.log" || fail "a did not stop cleanly"
echo "ternd peers: ok"

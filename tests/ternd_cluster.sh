#!/usr/bin/env bash
# Two ternds with [cluster] etcd = an etcd this test starts: each registers
# as PREFIX/nodes/NAME with its listen addresses and services, `tern
# status` and the metrics say so; a node killed with SIGKILL is gone from
# etcd once its lease runs out, one stopped with SIGTERM at once; a third
# of the same name as a live one is refused and says why; a node whose
# etcd is away keeps serving and registers again once etcd is back. Shard
# s1 (replicas a and b, defined with `tern shard define`): one primary,
# the other a backup naming it; when the primary dies the other takes over
# at a higher epoch, within twice the lease.
#
#   tests/ternd_cluster.sh BUILD_DIR
set -euo pipefail

build=$1
ternd=$build/tools/ternd/ternd
tern=$build/tools/tern/tern
[ -x /usr/bin/etcd ] || { echo "SKIP: /usr/bin/etcd not installed (Debian's etcd-server)"; exit 77; }
[ -x /usr/bin/etcdctl ] || { echo "SKIP: /usr/bin/etcdctl not installed (etcd-client)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
# The help read whole first: grep -q leaves at its first match, and under
# pipefail ternd's SIGPIPE would read as "no --etcd".
help=$("$ternd" --help 2>&1 || true)
grep -q -- '--etcd' <<<"$help" || { echo "SKIP: ternd built without [cluster]"; exit 77; }
base=/tmp
[ -d /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/tern-cluster-XXXXXX")
pids=()
etcd_pid=
cleanup() {
    for p in "${pids[@]}" $etcd_pid; do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$dir" || true
}
trap cleanup EXIT
fail() {
    echo "ternd cluster: $*" >&2
    for h in a b c; do [ -f "$dir/$h.log" ] && sed "s/^/  $h: /" "$dir/$h.log" | tail -8 >&2; done
    exit 1
}
# shellcheck source=tools/common/ports.sh
. "$(dirname "$0")/../tools/common/ports.sh"

ec=$(free_port)
ep=$(free_port)
etcd_url=http://127.0.0.1:$ec
start_etcd() {
    /usr/bin/etcd --name t --data-dir "$dir/etcd" --listen-client-urls "$etcd_url" \
        --advertise-client-urls "$etcd_url" --listen-peer-urls "http://127.0.0.1:$ep" \
        --initial-advertise-peer-urls "http://127.0.0.1:$ep" \
        --initial-cluster "t=http://127.0.0.1:$ep" --log-level error >"$dir/etcd.log" 2>&1 &
    etcd_pid=$!
    for _ in $(seq 200); do
        ETCDCTL_API=3 etcdctl --endpoints "$etcd_url" put /up 1 >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    fail "etcd never came up: $(tail -5 "$dir/etcd.log")"
}
nodes() { ETCDCTL_API=3 etcdctl --endpoints "$etcd_url" get --prefix /tc/nodes/ --keys-only | grep -v '^$' || true; }
node_value() { ETCDCTL_API=3 etcdctl --endpoints "$etcd_url" get --print-value-only "/tc/nodes/$1"; }
start_etcd

conf() {    # FILE NAME PORT
    cat >"$dir/$1.conf" <<EOF
[node]
name = $2
rack = r1
data_dir = $dir/$1
listen = tcp://127.0.0.1:$3
metrics_port = 0
log_file = $dir/$1.log
log_level = info

[kv]
pool_size = 4m
seg_size = 64k

[doc]
enabled = no

[cluster]
etcd = http://127.0.0.1:1,$etcd_url
prefix = /tc
lease_ttl = 2
shard = s1
EOF
}
port_a=$(free_port)
port_b=$(free_port)
port_c=$(free_port)
conf a a "$port_a"
conf b b "$port_b"
conf c a "$port_c"      # the same name as a
"$ternd" --config "$dir/a.conf" --check >/dev/null || fail "--check refused the [cluster] section"
"$ternd" --config "$dir/a.conf" --check | grep -q "^lease_ttl = 2$" || fail "--check lost [cluster]"

start() {    # FILE
    "$ternd" --config "$dir/$1.conf" >"$dir/$1.out" 2>"$dir/$1.err" &
    pids+=($!)
    eval "pid_$1=$!"
    for _ in $(seq 100); do
        grep -q '^ternd ready' "$dir/$1.out" && return 0
        sleep 0.05
    done
    fail "$1 not ready: $(cat "$dir/$1.out" "$dir/$1.err")"
}
wait_for() {    # SECONDS WHAT CMD...
    local n=$(( $1 * 20 )) what=$2
    shift 2
    for _ in $(seq "$n"); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    fail "$what never happened"
}
cluster_field() {    # PORT FIELD
    "$tern" status --json "127.0.0.1:$1" |
        python3 -c "import json,sys; c=json.load(sys.stdin)['cluster']; print(c['$2'] if c else None)"
}
"$tern" shard define --etcd "$etcd_url" --prefix /tc s1 a b >/dev/null || fail "shard define"
rc=0
"$tern" shard define --etcd "$etcd_url" --prefix /tc s1 a b 2>"$dir/err" || rc=$?
[ $rc -eq 2 ] && grep -q 'already exists' "$dir/err" || fail "defined twice: $rc $(cat "$dir/err")"
rc=0
"$tern" shard define --etcd "$etcd_url" --prefix /tc s2 a a 2>"$dir/err" || rc=$?
[ $rc -eq 2 ] || fail "a shard with a replica twice: $rc"
start a
start b
grep -q " etcd=http://127.0.0.1:1,$etcd_url/tc" "$dir/a.out" || fail "ready line: $(cat "$dir/a.out")"
has_nodes() { [ "$(nodes | tr '\n' ' ')" = "$1" ]; }
wait_for 5 "a and b registered" has_nodes "/tc/nodes/a /tc/nodes/b "
node_value a | python3 -c "
import json, sys
v = json.load(sys.stdin)
assert v['node'] == 'a' and v['rack'] == 'r1' and v['services'] == ['kv'], v
assert 'tcp://127.0.0.1:$port_a' in v['listen'], v
" || fail "a's value: $(node_value a)"
[ "$(cluster_field "$port_a" registered)" = True ] || fail "status: $("$tern" status --json "127.0.0.1:$port_a")"
"$tern" status "127.0.0.1:$port_a" | grep -q "^cluster /tc/nodes/a in etcd http://127.0.0.1:1,$etcd_url  lease " ||
    fail "status table: $("$tern" status "127.0.0.1:$port_a")"
mport=$(sed -n 's/.* metrics=127.0.0.1:\([0-9]*\).*/\1/p' "$dir/a.out")
curl -sf "http://127.0.0.1:$mport/metrics" | grep -q '^tern_cluster_registered 1$' ||
    fail "metrics: $(curl -s "http://127.0.0.1:$mport/metrics" | grep cluster)"

# Shard s1: one primary, one backup naming it, epoch 1.
shard_field() {    # PORT FIELD
    "$tern" status --json "127.0.0.1:$1" |
        python3 -c "import json,sys; c=json.load(sys.stdin)['cluster']; print(c['shards'][0]['$2'])"
}
settled() {
    local ra rb
    ra=$(shard_field "$port_a" role) && rb=$(shard_field "$port_b" role) || return 1
    [ "$ra/$rb" = primary/backup ] || [ "$ra/$rb" = backup/primary ] || return 1
    [ "$(shard_field "$port_a" primary)" = "$(shard_field "$port_b" primary)" ]
}
wait_for 8 "s1 settled on one primary" settled
first=$(shard_field "$port_a" primary)
[ "$(shard_field "$port_a" epoch)" = 1 ] || fail "epoch $(shard_field "$port_a" epoch), not 1"
"$tern" shard list --etcd "$etcd_url" --prefix /tc | grep -Eq "^s1 +epoch 1 +primary $first +replicas a b$" ||
    fail "shard list: $("$tern" shard list --etcd "$etcd_url" --prefix /tc)"
"$tern" status "127.0.0.1:$port_a" | grep -Eq "^shard s1 +(primary|backup) +epoch 1 +primary $first$" ||
    fail "status table: $("$tern" status "127.0.0.1:$port_a")"
curl -sf "http://127.0.0.1:$mport/metrics" | grep -q '^tern_shard_epoch{shard="s1"} 1$' ||
    fail "metrics: $(curl -s "http://127.0.0.1:$mport/metrics" | grep shard)"
# The primary dies: the other takes the office at epoch 2.
if [ "$first" = a ]; then victim=$pid_a other=$port_b; else victim=$pid_b other=$port_a; fi
kill -9 "$victim"
t0=$(date +%s%N)
took_over() { [ "$(shard_field "$other" role)" = primary ] && [ "$(shard_field "$other" epoch)" = 2 ]; }
wait_for 6 "the backup took s1 over" took_over
echo "ternd cluster: s1's primary killed; the backup was primary at epoch 2 after $(( ($(date +%s%N) - t0) / 1000000 )) ms (lease 2 s)"
# Bring the dead one back under its name: it rejoins as a backup.
if [ "$first" = a ]; then start a; else start b; fi
rejoined() { settled && [ "$(shard_field "$port_a" epoch)" = 2 ]; }
wait_for 8 "the old primary back as a backup" rejoined

# A second node named a: refused while a lives, and says why.
start c
is_refused() { cluster_field "$port_c" error | grep -q 'another node holds the name'; }
wait_for 5 "c refused the name a" is_refused
[ "$(cluster_field "$port_c" registered)" = False ] || fail "c registered as a"

# b killed: gone once its lease (2 s) runs out; a stopped: gone at once
# (and then c, waiting for the name, takes it).
kill -9 "$pid_b"
t0=$(date +%s%N)
wait_for 6 "b's key gone after SIGKILL" has_nodes "/tc/nodes/a "
echo "ternd cluster: b killed, its key gone after $(( ($(date +%s%N) - t0) / 1000000 )) ms (lease 2 s)"
kill -TERM "$pid_a"
wait "$pid_a" || fail "a exited with $? on SIGTERM"
c_took_it() { [ "$(node_value a | python3 -c 'import json,sys; print(json.load(sys.stdin)["listen"][0])')" = "tcp://127.0.0.1:$port_c" ]; }
wait_for 5 "c registered as a after a left" c_took_it

# etcd away for longer than the lease: c keeps serving, says it is not
# registered, and once etcd is back renews the lease it held (etcd kept it).
lease_c=$(cluster_field "$port_c" lease)
regs_c=$(cluster_field "$port_c" registrations)
kill -9 "$etcd_pid"
wait "$etcd_pid" 2>/dev/null || true
is_out() { [ "$(cluster_field "$port_c" registered)" = False ]; }
wait_for 6 "c saw etcd gone" is_out
"$tern" ping -c 1 "127.0.0.1:$port_c" >/dev/null || fail "c stopped serving without etcd"
start_etcd
is_in() { [ "$(cluster_field "$port_c" registered)" = True ]; }
wait_for 10 "c registered again" is_in
[ "$(cluster_field "$port_c" lease)" = "$lease_c" ] || fail "lease $(cluster_field "$port_c" lease), was $lease_c"
[ "$(cluster_field "$port_c" registrations)" = "$regs_c" ] || fail "registrations: $(cluster_field "$port_c" registrations), was $regs_c"
kill -TERM "$pid_c"
wait "$pid_c" || fail "c exited with $? on SIGTERM"
has_nodes "" || fail "keys left: $(nodes)"
echo "ternd cluster: ok"

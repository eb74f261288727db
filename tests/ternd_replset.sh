#!/usr/bin/env bash
# A replicated document shard as drivers see it: three ternds with
# [cluster] doc_shard = docs and their MongoDB gateways, an etcd this test
# starts, and pymongo connected with replicaSet=docs (tests/mongo/
# replset.py). pymongo finds the primary from the members' hello; while
# it writes (w: majority, retryable writes), the primary is killed with
# SIGKILL: the driver finds the new one and goes on, the application sees
# no error, and every write it was told of is on the new primary. The
# killed node comes back as a backup and catches up: each member then
# holds every document.
#
# With ROUNDS > 1, the primary is killed ROUNDS times: each killed node
# is started again 3 s after its death, and the next primary is killed
# PERIOD seconds (5) after every replica streams again (a shard that has
# one replica down and another still copying has no majority to write
# to). The application's slowest operation is how long writes stopped at
# worst. POOL: the document pools' size (256m).
#
#   tests/ternd_replset.sh BUILD_DIR [ROUNDS]     (KEEP=1 keeps the files)
set -euo pipefail

build=$1
rounds=${2:-1}
period=${PERIOD:-5}
here=$(cd "$(dirname "$0")" && pwd)
ternd=$build/tools/ternd/ternd
tern=$build/tools/tern/tern
py=/usr/bin/python3
[ -x /usr/bin/etcd ] || { echo "SKIP: /usr/bin/etcd not installed (Debian's etcd-server)"; exit 77; }
"$py" -c 'import pymongo' 2>/dev/null ||
    { echo "SKIP: pymongo not installed (Debian's python3-pymongo)"; exit 77; }
help=$("$ternd" --help 2>&1 || true)
grep -q -- '--doc-shard' <<<"$help" ||
    { echo "SKIP: ternd built without [cluster] or the document service"; exit 77; }
base=/tmp
[ -d /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/tern-replset-XXXXXX")
declare -A pid
etcd_pid=
cleanup() {
    [ -n "${KEEP:-}" ] && { echo "kept $dir (processes running: ${pid[*]} $etcd_pid)"; return; }
    for p in "${pid[@]}" $etcd_pid; do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$dir" || true
}
trap cleanup EXIT
fail() {
    echo "ternd replset: $*" >&2
    for h in a b c; do [ -f "$dir/$h.log" ] && sed "s/^/  $h: /" "$dir/$h.log" | tail -12 >&2; done
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
    --initial-cluster "t=http://127.0.0.1:$ep" --log-level error >"$dir/etcd.log" 2>&1 &
etcd_pid=$!
for _ in $(seq 200); do
    ETCDCTL_API=3 etcdctl --endpoints "$etcd_url" put /up 1 >/dev/null 2>&1 && break
    sleep 0.1
done

declare -A rpc mongo
hosts=
for h in a b c; do
    rpc[$h]=$(free_port)
    mongo[$h]=$(free_port)
    hosts=${hosts:+$hosts,}127.0.0.1:${mongo[$h]}
    cat >"$dir/$h.conf" <<EOF
[node]
name = $h
data_dir = $dir/$h
listen = tcp://127.0.0.1:${rpc[$h]}
log_file = $dir/$h.log
log_level = info

[kv]
pool_size = 4m
seg_size = 64k

[doc]
pool_size = ${POOL:-256m}
mongo_port = ${mongo[$h]}

[cluster]
etcd = $etcd_url
prefix = /rs
lease_ttl = 2
shard = docs
doc_shard = docs
EOF
done
start() {    # NAME
    local was
    was=$(grep -c '^ternd ready' "$dir/$1.out" 2>/dev/null || true)
    "$ternd" --config "$dir/$1.conf" >>"$dir/$1.out" 2>>"$dir/$1.err" &
    pid[$1]=$!
    for _ in $(seq 200); do
        [ "$(grep -c '^ternd ready' "$dir/$1.out")" -gt "${was:-0}" ] && return 0
        sleep 0.05
    done
    fail "$1 not ready: $(cat "$dir/$1.out" "$dir/$1.err")"
}
"$tern" shard define --etcd "$etcd_url" --prefix /rs docs a b c >/dev/null || fail "shard define"
for h in a b c; do start "$h"; done

status() {    # NAME KEY: the doc_replication field of a node
    "$tern" status --json "127.0.0.1:${rpc[$1]}" 2>/dev/null |
        "$py" -c "import json,sys; r=json.load(sys.stdin)['doc_replication']; print(r['$2'] if r else '')"
}
primary() {
    for h in a b c; do
        [ "$(status "$h" state)" = primary ] && { echo "$h"; return 0; }
    done
    return 1
}
# Every replica streams from the primary.
streaming() {
    local p
    p=$(primary) || return 1
    "$tern" status --json "127.0.0.1:${rpc[$p]}" 2>/dev/null | "$py" -c "
import json, sys
r = json.load(sys.stdin)['doc_replication']
sys.exit(0 if r and all(x['state'] == 'streaming' for x in r['replicas']) else 1)"
}
for _ in $(seq 200); do primary >/dev/null && break; sleep 0.1; done
primary >/dev/null || fail "no primary after 20 s"

STOP_FILE=$dir/stop "$py" "$here/mongo/replset.py" write "$hosts" docs 3600 "$dir/run.json" \
    >"$dir/app.out" 2>&1 &
app=$!
killed=
for r in $(seq "$rounds"); do
    if [ -n "$killed" ]; then
        sleep 3
        t0=$(date +%s%N)
        start "$killed"
        for _ in $(seq 600); do streaming && break; sleep 0.1; done
        streaming || fail "round $r: the shard never streamed to every replica again"
        echo "round $r: $killed back, every replica streaming $(( ($(date +%s%N) - t0) / 1000000 )) ms after its start"
    fi
    sleep "$period"
    victim=
    for _ in $(seq 100); do victim=$(primary) && break; sleep 0.1; done
    [ -n "$victim" ] || fail "round $r: no primary"
    kill -9 "${pid[$victim]}"
    unset "pid[$victim]"
    killed=$victim
    echo "round $r: killed the primary, $victim"
done
sleep 4
touch "$dir/stop"
rc=0
wait "$app" || rc=$?
sed 's/^/  /' "$dir/app.out"
[ $rc -eq 0 ] || fail "the application saw errors"
"$py" -c "import json,sys; p=json.load(open('$dir/run.json'))['primaries']; sys.exit(len(p) < 2)" ||
    fail "the driver never moved to a new primary"
"$py" "$here/mongo/replset.py" check "$hosts" docs "$dir/run.json" | sed 's/^/  /'
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "acknowledged writes are missing"

# The killed node comes back, catches up, and every member holds it all.
start "$killed"
want=$("$py" -c "import json; r=json.load(open('$dir/run.json')); print(len(r['acked']))")
same=0
for _ in $(seq 60); do
    same=1
    for h in a b c; do
        n=$("$py" "$here/mongo/replset.py" count "127.0.0.1:${mongo[$h]}" 2>/dev/null || echo -1)
        [ "$n" = "$want" ] || { same=0; break; }
    done
    [ $same = 1 ] && break
    sleep 0.5
done
if [ $same = 0 ]; then
    for h in a b c; do
        echo "  $h holds $("$py" "$here/mongo/replset.py" count "127.0.0.1:${mongo[$h]}" 2>&1 | tail -1): $("$tern" status --json "127.0.0.1:${rpc[$h]}" 2>&1 | "$py" -c 'import json,sys; print(json.load(sys.stdin)["doc_replication"])' 2>&1)" >&2
    done
    fail "the members never converged on $want documents"
fi
# The native client told of one backup only learns the set's members from
# it and follows the primary: the CRUD script's transcript is the one a
# server alone gives.
if [ -x "$build/tests/mongo/native" ]; then
    p=$(primary) || fail "no primary for the native client"
    for h in a b c; do [ "$h" = "$p" ] || { one=tcp://127.0.0.1:${rpc[$h]}; break; }; done
    "$build/tests/mongo/native" "$one" crud_native >"$dir/native.jsonl" 2>"$dir/native.err" ||
        fail "the native client on $one: $(tail -5 "$dir/native.err")"
    diff -u "$here/mongo/expected.jsonl" "$dir/native.jsonl" >"$dir/native.diff" ||
        fail "the native client's transcript through a backup differs: $(head -30 "$dir/native.diff")"
    echo "ternd replset: the native client, told of a backup only, ran the CRUD script on the primary ($p)"
fi
echo "ternd replset: ok ($rounds primaries killed; every member holds the $want documents)"

#!/usr/bin/env bash
# ternd and the tern CLI, end to end: start on a fresh data dir, SET and GET
# through the RESP gateway, check that native tern RPC (tcp, and shm by
# auto://) is still answered after ternd has gone to sleep in the gateway's
# epoll, stop with SIGTERM (exit 0), restart and find the
# value, inspect the pool with `tern pool info|check`, then flip a byte of a
# committed record and check that both ternd and `tern pool check` refuse
# the pool and say where, leaving the file as it was.
#
#   tests/ternd_smoke.sh BUILD_DIR
set -euo pipefail

build=$1
ternd=$build/tools/ternd/ternd
tern=$build/tools/tern/tern
rpcbench=$build/tools/rpcbench/rpcbench
command -v redis-cli >/dev/null || { echo "SKIP: redis-cli not installed"; exit 0; }
base=/tmp
[ -d /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/tern-ternd-XXXXXX")
pid=""
trap '[ -n "$pid" ] && kill -9 $pid 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "ternd smoke: $*" >&2; exit 1; }

# start: run ternd in the background, wait for its ready line, set $port
# (RESP) and $rpc_port (tern RPC over tcp).
start() {
    "$ternd" --data-dir "$dir/data" --listen tcp://127.0.0.1:0 --resp-port 0 \
        --pool-size 4m --seg-size 64k >"$dir/out" 2>"$dir/err" &
    pid=$!
    for _ in $(seq 100); do
        grep -q '^ternd ready' "$dir/out" && break
        kill -0 $pid 2>/dev/null || fail "ternd exited: $(cat "$dir/err")"
        sleep 0.05
    done
    port=$(sed -n 's/.* resp=127.0.0.1:\([0-9]*\).*/\1/p' "$dir/out")
    rpc_port=$(sed -n 's/^ternd ready tcp:\/\/127.0.0.1:\([0-9]*\) .*/\1/p' "$dir/out")
    [ -n "$port" ] && [ -n "$rpc_port" ] || fail "no ready line: $(cat "$dir/out" "$dir/err")"
}

# native URI FABRIC: once ternd has been idle long enough to sleep in the
# gateway's epoll (--spin-us is 20), a tern RPC client on URI must get its
# handshake and its first call answered over FABRIC. No tool reads the KV
# service of a running server natively (rpcbench kv starts its own server),
# so rpcbench's echo client stands in: ternd serves only KV, so the answer
# is "unknown service id", and it has to come from ternd's RPC loop.
native() {
    local rc=0
    sleep 0.2
    env -u TERN_FABRICS timeout 10 "$rpcbench" client --connect "$1" --iters 1 \
        >"$dir/native" 2>&1 || rc=$?
    [ $rc -ne 124 ] || fail "native RPC over $1 hung while the gateway ran"
    [ $rc -eq 1 ] && grep -q "^rpcbench: $2 size 64 window 1: unknown service id" "$dir/native" ||
        fail "native RPC over $1 (exit $rc): $(cat "$dir/native")"
}

stop() {
    kill -TERM $pid
    wait $pid || fail "ternd exited with $? on SIGTERM"
    pid=""
    grep -q 'ternd: stopped' "$dir/err" || fail "no clean stop"
}

start
[ "$(redis-cli -p "$port" set greeting hello)" = OK ] || fail "SET"
[ "$(redis-cli -p "$port" get greeting)" = hello ] || fail "GET"
redis-cli -p "$port" nosuchcommand | grep -q 'unknown command' || fail "unknown command"
# RESP and native RPC take turns, each after ternd has gone idle.
native "tcp://127.0.0.1:$rpc_port" tcp
sleep 0.2
[ "$(redis-cli -p "$port" get greeting)" = hello ] || fail "GET after native RPC over tcp"
native "auto://127.0.0.1:$rpc_port" shm
sleep 0.2
[ "$(redis-cli -p "$port" get greeting)" = hello ] || fail "GET after native RPC over shm"
stop

start
[ "$(redis-cli -p "$port" get greeting)" = hello ] || fail "value lost across a restart"
grep -q 'keys=1' "$dir/out" || fail "ready line should count 1 key: $(cat "$dir/out")"
stop

pool=$dir/data/kv.pool
"$tern" pool info "$pool" | grep -q '^status' || fail "pool info"
"$tern" pool check "$pool" | grep -q 'records   1,' || fail "pool check"

# The record: after the 4 KiB header and the 64-byte segment header of the
# segment in use (the first one handed out is segment 0).
cp "$pool" "$dir/before"
printf 'X' | dd of="$pool" bs=1 seek=$((4096 + 64 + 26)) conv=notrunc status=none
rc=0; "$tern" pool check "$pool" >"$dir/check" 2>&1 || rc=$?
[ $rc -eq 1 ] || fail "pool check on a corrupt pool exited $rc, not 1"
grep -q 'corrupt   offset 4160' "$dir/check" || fail "offset not reported: $(cat "$dir/check")"
rc=0; "$ternd" --data-dir "$dir/data" --listen tcp://127.0.0.1:0 >/dev/null 2>"$dir/err" || rc=$?
[ $rc -eq 1 ] || fail "ternd started on a corrupt pool"
grep -q 'tern pool check' "$dir/err" || fail "ternd did not say what to run: $(cat "$dir/err")"
cmp -s "$pool" "$dir/before" && fail "test did not corrupt the pool"
# Nothing but the flipped byte changed: ternd left the file alone.
[ "$(cmp -l "$pool" "$dir/before" | wc -l)" -eq 1 ] || fail "ternd changed a corrupt pool"
"$tern" pool bogus "$pool" >/dev/null 2>&1 && fail "bad usage accepted"
echo "ternd smoke: ok"

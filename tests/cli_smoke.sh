#!/usr/bin/env bash
# What a new user of rpcbench, ternd and tern meets first: an unknown
# --fabric and out-of-range numbers are refused (status 2) with one line on
# stderr naming the flag and what it takes; --help and --version answer on
# stdout with status 0 for every tool and command; ternd outlives SIGHUP
# and still stops cleanly on SIGTERM; a ternd that cannot listen leaves no
# new pool behind (and keeps an old one); an error is said once, on stderr.
#
#   tests/cli_smoke.sh BUILD_DIR
set -euo pipefail

build=$1
rpcbench=$build/tools/rpcbench/rpcbench
ternd=$build/tools/ternd/ternd
tern=$build/tools/tern/tern
version=$(sed -n 's/^#define TERN_VERSION "\(.*\)"$/\1/p' "$build/tern_config.h")
[ -n "$version" ] || { echo "cli smoke: no TERN_VERSION in $build/tern_config.h" >&2; exit 1; }
services=false
[ -x "$ternd" ] && [ -x "$tern" ] && services=true
base=/tmp
[ -d /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/tern-cli-XXXXXX")
pid=""
trap '[ -n "$pid" ] && kill -9 $pid 2>/dev/null; rm -rf "$dir"' EXIT
failures=0
fail() { echo "cli smoke: $*" >&2; failures=$((failures + 1)); }

# run CMD...: run with a time limit (a wrapped-around count must not spin
# for hours), setting $rc, and $out/$err to the files of stdout/stderr.
out=$dir/out
err=$dir/err
run() {
    rc=0
    timeout 20 "$@" >"$out" 2>"$err" </dev/null || rc=$?
}

# refused FLAG PATTERN CMD...: a usage error (status 2) whose one line on
# stderr names FLAG and matches PATTERN, with nothing on stdout.
refused() {
    local flag=$1 pattern=$2
    shift 2
    run "$@"
    if [ $rc -ne 2 ]; then
        fail "'$*' exited $rc, not 2: $(head -c 300 "$err")"
    elif [ -s "$out" ]; then
        fail "'$*' wrote to stdout: $(head -c 300 "$out")"
    elif [ "$(wc -l <"$err")" -ne 1 ]; then
        fail "'$*' should say one line on stderr: $(head -c 300 "$err")"
    elif ! grep -q -- "$flag" "$err" || ! grep -qE -- "$pattern" "$err"; then
        fail "'$*' should name $flag and match '$pattern': $(cat "$err")"
    fi
}

# usage_error CMD...: status 2, nothing on stdout, something on stderr.
usage_error() {
    run "$@"
    if ! { [ $rc -eq 2 ] && [ ! -s "$out" ] && [ -s "$err" ]; }; then
        fail "'$*' (a usage error) exited $rc with stdout '$(head -c 200 "$out")'" \
            "and stderr '$(head -c 200 "$err")'"
    fi
}

# helps CMD...: usage on stdout, nothing on stderr, status 0.
helps() {
    run "$@"
    if ! { [ $rc -eq 0 ] && grep -q '^usage:' "$out" && [ ! -s "$err" ]; }; then
        fail "'$*' exited $rc with stdout '$(head -c 200 "$out")'" \
            "and stderr '$(head -c 200 "$err")'"
    fi
}

# versions NAME CMD...: "NAME tern VERSION" alone on stdout, status 0.
versions() {
    local name=$1
    shift
    run "$@"
    if ! { [ $rc -eq 0 ] && [ "$(cat "$out")" = "$name tern $version" ] && [ ! -s "$err" ]; }; then
        fail "'$*' exited $rc with stdout '$(head -c 200 "$out")'" \
            "and stderr '$(head -c 200 "$err")'"
    fi
}

# 1. An unknown fabric is named with the ones there are.
fabrics="tcp, shm, ntb"
refused --fabric "foo is not one of $fabrics.*, all, auto$" "$rpcbench" echo --fabric foo
refused --fabric "foo is not one of $fabrics.*, all, auto$" "$rpcbench" sink --fabric foo
refused --fabric "all is not one of $fabrics" "$rpcbench" get --fabric all
refused --fabric "foo is not one of $fabrics" "$rpcbench" probe --fabric foo
$services && refused --fabric "foo is not one of $fabrics.*, all$" "$rpcbench" kv --fabric foo

# 2. Numbers out of range, negative, malformed or too big for 64 bits.
in_range="is out of range \("
refused --iters "-5 $in_range""1\.\.1t\)" "$rpcbench" echo --iters -5
refused --iters "-5 $in_range" "$rpcbench" floor --iters -5
refused --iters "-5 $in_range" "$rpcbench" get --fabric shm --iters -5
refused --iters "99999999999999999999 $in_range" "$rpcbench" echo --iters 99999999999999999999
refused --window "0 $in_range""1\.\.256\)" "$rpcbench" echo --window 1,0
refused --size "65m $in_range""0\.\.64m\)" "$rpcbench" echo --size 64,65m
refused --size "banana is not a size" "$rpcbench" echo --size banana
refused --cpu "-1 $in_range" "$rpcbench" echo --cpu -1,0
refused --workload "bulk is not one of echo, sink" "$rpcbench" client --connect tcp://x:1 --workload bulk
if $services; then
    refused --iters "-5 $in_range" "$rpcbench" kv --iters -5
    refused --records "0 $in_range" "$rpcbench" kv --records 0
    refused --value-size "0 $in_range" "$rpcbench" kv --value-size 0
    refused --key-size "4 $in_range""8\.\." "$rpcbench" kv --key-size 4
    refused --cache "-1 $in_range" "$rpcbench" kv --cache -1
    # The least pool holds four segments and the 4 KiB header.
    refused --pool-size "4m $in_range""4100k\.\." "$rpcbench" kv --pool-size 4m
    refused --path "x is not one of" "$rpcbench" kv --path rpc,x

    # ternd: nothing is created before its options are checked.
    d=$dir/never
    refused --seg-size "^ternd: --seg-size: 0 is out of range \(64k\.\.1g\)$" \
        "$ternd" --data-dir "$d" --seg-size 0
    refused --seg-size "100k is not a power of two" "$ternd" --data-dir "$d" --seg-size 100k
    refused --seg-size "512m \+ 4k" "$ternd" --data-dir "$d" --seg-size 128m
    refused --spin-us "-5 $in_range""0\.\." "$ternd" --data-dir "$d" --spin-us -5
    refused --pool-size "4m $in_range""4100k\.\.16t\)" "$ternd" --data-dir "$d" --pool-size 4m
    refused --pool-size "4m $in_range""4100k\.\." "$ternd" --data-dir "$d" --pool-size 4m \
        --seg-size 1m
    refused --pool-size "abc is not a size" "$ternd" --data-dir "$d" --pool-size abc
    refused --resp-port "70000 $in_range""0\.\.65535\)" "$ternd" --data-dir "$d" --resp-port 70000
    refused --resp-coalesce-us "-1 $in_range" "$ternd" --data-dir "$d" --resp-coalesce-us -1
    refused --flush-helpers "65 $in_range""0\.\.64\)" "$ternd" --data-dir "$d" --flush-helpers 65
    refused --range "5:3 is empty" "$ternd" --data-dir "$d" --range 5:3
    refused --range "-1 $in_range" "$ternd" --data-dir "$d" --range -1:3
    refused --mongo-port "70000 $in_range" "$ternd" --data-dir "$d" --mongo-port 70000
    [ ! -e "$d" ] || fail "ternd created $d while refusing its options"
fi

# 3. --help on stdout with status 0 for every tool and command, --version,
# and usage errors on stderr with status 2.
helps "$rpcbench" --help
for cmd in echo sink server client floor get put probe kv; do
    [ $cmd = kv ] && ! $services && continue
    helps "$rpcbench" $cmd --help
    versions rpcbench "$rpcbench" $cmd --version
done
versions rpcbench "$rpcbench" --version
usage_error "$rpcbench"
usage_error "$rpcbench" bogus
usage_error "$rpcbench" --bogus
usage_error "$rpcbench" echo --bogus
usage_error "$rpcbench" echo stray
usage_error "$rpcbench" server
usage_error "$rpcbench" client
if $services; then
    helps "$ternd" --help
    versions ternd "$ternd" --version
    usage_error "$ternd" --bogus
    usage_error "$ternd" stray
    helps "$tern" --help
    helps "$tern" pool --help
    helps "$tern" pool info --help
    helps "$tern" pool check --help
    versions tern "$tern" --version
    usage_error "$tern"
    usage_error "$tern" pool
    usage_error "$tern" pool info
    usage_error "$tern" pool bogus x
    usage_error "$tern" pool info a b
    usage_error "$tern" doc
    usage_error "$tern" doc --bogus x
fi

# 6. An error said once: on stderr, not on stdout as well.
if $services; then
    run "$tern" pool info "$dir/no-such.pool"
    [ $rc -eq 2 ] || fail "tern pool info of a missing file exited $rc, not 2"
    [ ! -s "$out" ] || fail "tern pool info of a missing file wrote to stdout: $(cat "$out")"
    if ! { [ "$(grep -c 'no-such.pool' "$err")" -eq 1 ] && [ "$(wc -l <"$err")" -eq 1 ]; }; then
        fail "tern pool info of a missing file should say so once: $(cat "$err")"
    fi
fi

# tern info: every fabric built in, tcp and shm usable here, rdma's
# emulation named, the settings in force shown; and every TERN_* variable
# the library's and tools' sources read is in its list.
if [ -x "$tern" ]; then
    helps "$tern" info --help
    usage_error "$tern" info --bogus
    run env TERN_FABRICS=shm,tcp "$tern" info
    [ $rc -eq 0 ] || fail "tern info exited $rc: $(cat "$err")"
    grep -qE '^tcp +yes ' "$out" || fail "tern info: tcp not usable: $(cat "$out")"
    grep -qE '^shm +yes ' "$out" || fail "tern info: shm not usable: $(cat "$out")"
    grep -qE '^ntb +no +not probed: give --ntb-eal' "$out" ||
        fail "tern info: ntb without EAL arguments: $(cat "$out")"
    if grep -qE '^rdma ' "$out"; then
        grep -q 'emulated by softverbs0' "$out" || fail "tern info: rdma's emulation: $(cat "$out")"
    fi
    grep -qE '^TERN_FABRICS +shm,tcp ' "$out" || fail "tern info: TERN_FABRICS in force: $(cat "$out")"
    src=$(cd "$(dirname "$0")/.." && pwd)
    for v in $(grep -rhoE 'getenv\("TERN_[A-Z_]+"\)' "$src/transport" "$src/rpc" "$src/services" \
        "$src/tools" | sed 's/getenv("//; s/")//' | sort -u); do
        grep -qE "^$v " "$out" || fail "tern info does not list $v, which the sources read"
    done
    run "$tern" info --json
    python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
f = {x["name"]: x for x in d["fabrics"]}
assert f["tcp"]["hardware"] and "msg" in f["tcp"]["caps"], f
assert any(e["name"] == "TERN_LOG" for e in d["environment"])' "$out" 2>>"$err" ||
        fail "tern info --json: $(cat "$err")"
fi

if ! $services; then
    [ $failures -eq 0 ] || { echo "cli smoke: $failures failures" >&2; exit 1; }
    echo "cli smoke: ok (rpcbench only: built without the services)"
    exit 0
fi

# 4. SIGHUP leaves ternd serving; SIGTERM still stops it with status 0.
# answers: the RESP gateway (redis-cli, when there is one) and tern RPC
# (rpcbench's client: ternd serves only KV, so its answer is "unknown
# service id", which only a live ternd can give) both reply.
answers() {
    if command -v redis-cli >/dev/null; then
        [ "$(timeout 10 redis-cli -p "$port" ping 2>&1)" = PONG ] ||
            { fail "ternd does not answer PING $1"; return; }
    fi
    run env -u TERN_FABRICS "$rpcbench" client --connect "tcp://127.0.0.1:$rpc_port" --iters 1
    grep -q 'unknown service id' "$err" ||
        fail "ternd does not answer tern RPC $1 (exit $rc): $(cat "$err")"
}

data=$dir/data
"$ternd" --data-dir "$data" --listen tcp://127.0.0.1:0 --resp-port 0 --pool-size 4m \
    --seg-size 64k >"$dir/ternd.out" 2>"$dir/ternd.err" &
pid=$!
for _ in $(seq 200); do
    grep -q '^ternd ready' "$dir/ternd.out" && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.05
done
port=$(sed -n 's/.* resp=127.0.0.1:\([0-9]*\).*/\1/p' "$dir/ternd.out")
rpc_port=$(sed -n 's/^ternd ready tcp:\/\/127.0.0.1:\([0-9]*\) .*/\1/p' "$dir/ternd.out")
if [ -z "$port" ] || [ -z "$rpc_port" ]; then
    fail "ternd did not start: $(cat "$dir/ternd.out" "$dir/ternd.err")"
    echo "cli smoke: $failures failures" >&2
    exit 1
fi
answers "before SIGHUP"
kill -HUP $pid
answers "after SIGHUP"
if ! kill -0 $pid 2>/dev/null; then
    fail "ternd died of SIGHUP"
    echo "cli smoke: $failures failures" >&2
    exit 1
fi

# tern kv against that ternd, over the native RPC: put (also from stdin),
# get, scan (with --match, --values), stat, del; an absent key is exit 1
# with one line on stderr, a command it does not know or a dead address
# exit 2 with one line.
kv=("$tern" kv)
run "${kv[@]}" put "127.0.0.1:$rpc_port" cli:one "the first"
{ [ $rc -eq 0 ] && grep -qE '^version [0-9a-f]+$' "$out"; } || fail "tern kv put (exit $rc): $(cat "$out" "$err")"
printf 'line\n\001binary' >"$dir/val"
rc=0
"${kv[@]}" put "127.0.0.1:$rpc_port" cli:two - <"$dir/val" >"$out" 2>"$err" || rc=$?
[ $rc -eq 0 ] || fail "tern kv put from stdin (exit $rc): $(cat "$err")"
run "${kv[@]}" get "127.0.0.1:$rpc_port" cli:two
{ [ $rc -eq 0 ] && cmp -s "$out" "$dir/val"; } || fail "tern kv get gave back other bytes (exit $rc): $(od -c "$out" | head -3)"
run "${kv[@]}" scan "127.0.0.1:$rpc_port" --match 'cli:*' --values
[ "$(sort "$out")" = "$(printf 'cli:one\tthe first\ncli:two\tline\\x0a\\x01binary')" ] ||
    fail "tern kv scan --values: $(cat "$out" "$err")"
run "${kv[@]}" stat "127.0.0.1:$rpc_port"
grep -qE '^keys [0-9]+$' "$out" || fail "tern kv stat: $(cat "$out" "$err")"
run "${kv[@]}" del "127.0.0.1:$rpc_port" cli:one
[ $rc -eq 0 ] || fail "tern kv del (exit $rc): $(cat "$err")"
run "${kv[@]}" get "127.0.0.1:$rpc_port" cli:one
{ [ $rc -eq 1 ] && [ ! -s "$out" ] && [ "$(wc -l <"$err")" -eq 1 ] && grep -q 'no such key' "$err"; } ||
    fail "tern kv get of a deleted key (exit $rc): $(cat "$out" "$err")"
run "${kv[@]}" del "127.0.0.1:$rpc_port" cli:one
[ $rc -eq 1 ] || fail "tern kv del of an absent key exited $rc, not 1"
# Deadlines: put --ttl, ttl, expire (0 takes it away), and the key gone
# after its time.
run "${kv[@]}" put "127.0.0.1:$rpc_port" cli:ttl v --ttl 60000
[ $rc -eq 0 ] || fail "tern kv put --ttl (exit $rc): $(cat "$err")"
run "${kv[@]}" ttl "127.0.0.1:$rpc_port" cli:ttl
{ [ $rc -eq 0 ] && [ "$(cat "$out")" -gt 55000 ] && [ "$(cat "$out")" -le 60000 ]; } ||
    fail "tern kv ttl (exit $rc): $(cat "$out" "$err")"
run "${kv[@]}" expire "127.0.0.1:$rpc_port" cli:ttl 0
run "${kv[@]}" ttl "127.0.0.1:$rpc_port" cli:ttl
[ "$(cat "$out")" = none ] || fail "tern kv expire 0 left a deadline: $(cat "$out" "$err")"
run "${kv[@]}" expire "127.0.0.1:$rpc_port" cli:ttl 200
sleep 0.3
run "${kv[@]}" get "127.0.0.1:$rpc_port" cli:ttl
[ $rc -eq 1 ] || fail "tern kv get after the deadline exited $rc: $(cat "$out" "$err")"
run "${kv[@]}" ttl "127.0.0.1:$rpc_port" cli:ttl
[ $rc -eq 1 ] || fail "tern kv ttl of an expired key exited $rc, not 1"
usage_error "${kv[@]}" get "127.0.0.1:$rpc_port" cli:ttl --ttl 5
usage_error "${kv[@]}" expire "127.0.0.1:$rpc_port" cli:ttl soon
usage_error "${kv[@]}" frob "127.0.0.1:$rpc_port"
usage_error "${kv[@]}" get "127.0.0.1:$rpc_port"
helps "${kv[@]}" --help
run "${kv[@]}" get 127.0.0.1:1 cli:one --timeout 500
{ [ $rc -eq 2 ] && [ "$(wc -l <"$err")" -eq 1 ]; } ||
    fail "tern kv against a dead address (exit $rc) should say why once: $(cat "$err")"

# 5. A start that fails leaves no new pool: the RPC port is taken (by the
# ternd above), then the RESP port. The data directory ternd made for it
# goes too; one that was there stays, and so does a pool that was there.
for how in "--listen tcp://127.0.0.1:$rpc_port" "--listen tcp://127.0.0.1:0 --resp-port $port"; do
    # shellcheck disable=SC2086  # $how is two or four words
    run "$ternd" --data-dir "$dir/new" --pool-size 4m --seg-size 64k $how
    [ $rc -eq 1 ] || fail "ternd $how on a taken port exited $rc, not 1"
    [ ! -e "$dir/new" ] || fail "ternd $how left $(find "$dir/new")"
    # 6. ... and says why once, on stderr.
    [ ! -s "$out" ] || fail "ternd $how wrote to stdout: $(cat "$out")"
    [ "$(wc -l <"$err")" -eq 1 ] || fail "ternd $how should say why in one line: $(cat "$err")"
    mkdir "$dir/old"
    # shellcheck disable=SC2086
    run "$ternd" --data-dir "$dir/old" --pool-size 4m --seg-size 64k $how
    if ! { [ $rc -eq 1 ] && [ -d "$dir/old" ] && [ ! -e "$dir/old/kv.pool" ]; }; then
        fail "ternd $how (exit $rc) in a directory of its own: $(ls -A "$dir/old" 2>&1)"
    fi
    rm -rf "$dir/old"
done

kill -TERM $pid 2>/dev/null || true
rc=0
wait $pid || rc=$?
pid=""
[ $rc -eq 0 ] || fail "ternd exited $rc on SIGTERM after SIGHUP, not 0"
grep -q 'ternd: stopped' "$dir/ternd.err" || fail "ternd did not stop cleanly: $(cat "$dir/ternd.err")"

# The document pool of a ternd that stopped: tern doc reads it.
if [ -e "$data/doc.pool" ]; then
    run "$tern" doc "$data/doc.pool"
    { [ $rc -eq 0 ] && grep -q "^pool $data/doc.pool: 0 databases" "$out"; } ||
        fail "tern doc of a stopped ternd's pool (exit $rc): $(cat "$out" "$err")"
fi

# The pool of a ternd that served is not new: a failed start keeps it.
cp "$data/kv.pool" "$dir/before"
run "$ternd" --data-dir "$data" --listen tcp://127.0.0.1:0 --listen bogus://x
[ $rc -eq 1 ] || fail "ternd with a bad --listen exited $rc, not 1"
cmp -s "$data/kv.pool" "$dir/before" || fail "a failed start changed or removed an old pool"

[ $failures -eq 0 ] || { echo "cli smoke: $failures failures" >&2; exit 1; }
echo "cli smoke: ok"

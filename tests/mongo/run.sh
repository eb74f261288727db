#!/usr/bin/env bash
# Real MongoDB clients against ternd's wire gateway (README.md here): one
# ternd on a fresh pool directory and a port of its choosing, the CRUD
# script through each client named, each transcript compared with
# expected.jsonl and with the others of this run. The native client
# (tern/doc.h over tern RPC to the same ternd) runs first when it is built,
# as the reference the others are compared with too.
#
#   tests/mongo/run.sh BUILD_DIR [native|pymongo|mongoc|mongosh]...
#
# Exit 0 if every client that could run passed, 1 if one failed, 77 (SKIP)
# if none could run; a client that is not installed says SKIP and why.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR [native|pymongo|mongoc|mongosh]...}" && pwd)
shift
clients=("$@")
[ ${#clients[@]} -gt 0 ] || clients=(native pymongo mongoc mongosh)
ternd=$build/tools/ternd/ternd
expected=$here/expected.jsonl
mongosh=${MONGOSH:-$here/node/node_modules/.bin/mongosh}
CLIENT_TIMEOUT=${CLIENT_TIMEOUT:-600}

skip_all() { echo "SKIP ${clients[*]}: $*"; exit 77; }

[ -x "$ternd" ] || skip_all "$ternd not built (no services in this build)"
# The help read whole first: grep -q leaves early, and under pipefail the
# SIGPIPE ternd then gets would read as "no such option".
help=$("$ternd" --help 2>&1 || true)
grep -q -- '--mongo-port' <<<"$help" || skip_all "ternd has no --mongo-port"

base=/tmp
[ -d /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/tern-mongo-XXXXXX")
pid=""
cleanup() {
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT

# Why a client cannot run here, or nothing.
missing() {
    case $1 in
    pymongo)
        [ -x /usr/bin/python3 ] || { echo "no /usr/bin/python3 (Debian's python3)"; return; }
        /usr/bin/python3 -c 'import pymongo' 2>/dev/null ||
            echo "Debian's python3-pymongo is not installed (/usr/bin/python3 cannot import pymongo)"
        ;;
    mongoc)
        [ -x "$build/tests/mongo/crud" ] ||
            echo "libmongoc-dev is not installed (meson did not build tests/mongo/crud)"
        ;;
    native)
        [ -x "$build/tests/mongo/native" ] ||
            echo "the native document client is not built (tests/mongo/native)"
        ;;
    mongosh)
        command -v node >/dev/null || { echo "no node (Debian's nodejs)"; return; }
        [ -x "$mongosh" ] ||
            echo "mongosh is not installed (npm install --prefix tests/mongo/node mongosh@2)"
        ;;
    *) echo "unknown client '$1' (native, pymongo, mongoc, mongosh)" ;;
    esac
}

# command CLIENT URI DB: the command line that runs CLIENT's script, in cmd.
command_of() {
    case $1 in
    native) cmd=("$build/tests/mongo/native" "$rpc_uri" "$3") ;;
    pymongo) cmd=(/usr/bin/python3 "$here/crud.py" "$2" "$3") ;;
    mongoc) cmd=("$build/tests/mongo/crud" "$2" "$3") ;;
    # Its logs and history go to a home of its own; there is nothing to
    # send telemetry to from here.
    mongosh) cmd=(env HOME="$dir/home" MONGOSH_FORCE_DISABLE_TELEMETRY_FOR_TESTING=1
                  "$mongosh" --quiet --norc "$2/$3" "$here/crud.js") ;;
    esac
}

runnable=()
for c in "${clients[@]}"; do
    why=$(missing "$c")
    if [ -n "$why" ]; then
        echo "SKIP $c: $why"
    else
        runnable+=("$c")
    fi
done
[ ${#runnable[@]} -gt 0 ] || exit 77

mkdir -p "$dir/home"
"$ternd" --data-dir "$dir/data" --listen tcp://127.0.0.1:0 --no-shm --mongo-port 0 \
    >"$dir/ternd.out" 2>"$dir/ternd.err" &
pid=$!
port=""
for _ in $(seq 200); do
    port=$(sed -n 's/.* mongo=[^ ]*:\([0-9][0-9]*\).*/\1/p' "$dir/ternd.out")
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
done
if [ -z "$port" ]; then
    echo "FAIL ${runnable[*]}: ternd did not say it serves the MongoDB protocol:" \
        "$(cat "$dir/ternd.out" "$dir/ternd.err")"
    exit 1
fi
uri=mongodb://127.0.0.1:$port
rpc_uri=$(sed -n 's/^ternd ready \(tcp:\/\/[^ ]*\).*/\1/p' "$dir/ternd.out")

# check CLIENT: run it, compare its transcript with expected.jsonl and
# with those of done_clients (the clients so far that passed); 0 if all
# match.
check() {
    local c=$1 out=$dir/$1.jsonl rc start ms ok=0 o
    command_of "$c" "$uri" "crud_$c"
    start=$(date +%s%N)
    timeout "$CLIENT_TIMEOUT" "${cmd[@]}" </dev/null >"$out" 2>"$dir/$c.err"
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    if [ $rc -ne 0 ]; then
        echo "FAIL $c: exit $rc after ${ms} ms$([ $rc -eq 124 ] && echo " (timed out)"):"
        tail -n 20 "$dir/$c.err" | sed 's/^/    /'
        tail -n 5 "$out" | sed 's/^/    out: /'
        return 1
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "FAIL $c: ternd died: $(tail -n 20 "$dir/ternd.err")"
        return 1
    fi
    if ! diff -u "$expected" "$out" >"$dir/$c.diff"; then
        echo "FAIL $c: its transcript differs from expected.jsonl:"
        sed 's/^/    /' "$dir/$c.diff"
        ok=1
    fi
    for o in "${done_clients[@]}"; do
        if ! diff -u "$dir/$o.jsonl" "$out" >"$dir/$c-$o.diff"; then
            echo "FAIL $c: its transcript differs from $o's:"
            sed 's/^/    /' "$dir/$c-$o.diff"
            ok=1
        fi
    done
    [ $ok -eq 0 ] || return 1
    echo "PASS $c: $(wc -l <"$out") steps as expected.jsonl${done_clients[0]:+ and ${done_clients[*]}} (${ms} ms)"
    # Only a client that got the expected answers is a peer for the next
    # ones: one that did not has said so once.
    done_clients+=("$c")
}

failed=0
done_clients=()
# The native client as the reference, when it is built and not asked for:
# its own check is `run.sh BUILD native`, so a failure here only drops it.
if [[ " ${runnable[*]} " != *" native "* ]] && [ -z "$(missing native)" ]; then
    if check native >"$dir/native.log"; then
        echo "reference: native, $(wc -l <"$dir/native.jsonl") steps as expected.jsonl"
    else
        echo "reference: native not used (run.sh BUILD native says why):"
        sed 's/^/    /' "$dir/native.log" | head -n 20
    fi
fi
for c in "${runnable[@]}"; do
    check "$c" || failed=1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || { pid=""; failed=1; break; }
done

if [ -n "$pid" ]; then
    kill -TERM "$pid"
    if ! wait "$pid"; then
        echo "FAIL ternd exited with $? on SIGTERM: $(tail -n 20 "$dir/ternd.err")"
        failed=1
    fi
    pid=""
fi
exit $failed

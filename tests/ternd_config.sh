#!/usr/bin/env bash
# ternd's configuration file, end to end: the shipped example passes
# --check; --check prints the resolved settings with flags over the file and
# creates nothing; each kind of mistake names the file, the line and the key
# and exits 2; a ternd started from a file serves where the file says,
# writes its log to log_file in the one log format, reloads [policy] on
# SIGHUP (and keeps the old one when the new file is wrong), reopens a log
# rotated away, says when TERN_LOG names no level, and with the MongoDB
# gateway on 0.0.0.0 names the node's own address for it (and warns).
#
#   tests/ternd_config.sh BUILD_DIR
set -euo pipefail

build=$1
src=$(cd "$(dirname "$0")/.." && pwd)
ternd=$build/tools/ternd/ternd
base=/tmp
[ -d /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/tern-conf-XXXXXX")
pid=""
trap '[ -n "$pid" ] && kill -9 $pid 2>/dev/null; rm -rf "$dir" || true' EXIT
fail() { echo "ternd config: $*" >&2; exit 1; }

# The example shipped beside the systemd unit is valid as it is.
"$ternd" --config "$src/tools/ternd/ternd.conf" --check >"$dir/example" 2>&1 ||
    fail "the shipped example does not pass --check: $(cat "$dir/example")"

cat >"$dir/t.conf" <<EOF
# a host of rack r1
[node]
name = h1
rack = r1
data_dir = $dir/data
listen = tcp://127.0.0.1:0
log_level = info
log_file = $dir/ternd.log

[kv]
pool_size = 4m
seg_size = 64k
resp_port = 0

[doc]
enabled = no

[policy]
same_rack = ntb,tcp
subnet = 10.1.0.0/16 tcp

[peer h2]
address = tcp://127.0.0.1:7402
rack = r1
EOF

# --check: the file resolved, a flag over it, nothing created.
"$ternd" --config "$dir/t.conf" --check --pool-size 8m >"$dir/check" ||
    fail "--check refused a good file"
for want in 'name = h1' 'rack = r1' 'pool_size = 8m' 'seg_size = 64k' 'same_rack = ntb,tcp' \
    'other_rack = rdma,tcp' 'subnet = 10.1.0.0/16 tcp' '\[peer h2\]' 'enabled = no'; do
    grep -q "^$want\$" "$dir/check" || fail "--check printed no '$want': $(cat "$dir/check")"
done
[ ! -e "$dir/data" ] && [ ! -e "$dir/ternd.log" ] || fail "--check created files"
# What it prints is a configuration file that says the same.
"$ternd" --config "$dir/check" --check >"$dir/check2" 2>&1 || fail "--check output refused: $(cat "$dir/check2")"
diff <(grep -v '^#' "$dir/check") <(grep -v '^#' "$dir/check2") >/dev/null ||
    fail "--check of --check's output differs"

# Mistakes: FILE:LINE: [section] key: why; exit 2.
refused() {    # CONTENT PATTERN
    local rc=0
    printf '%b' "$1" >"$dir/bad.conf"
    "$ternd" --config "$dir/bad.conf" --check >/dev/null 2>"$dir/err" || rc=$?
    [ $rc -eq 2 ] || fail "exit $rc, not 2, for: $1"
    grep -Eq "$2" "$dir/err" || fail "for '$1' it said: $(cat "$dir/err")"
}
f="$dir/bad.conf"
refused '[node]\nname = h 1\n' "^ternd: $f:2: \[node\] name: 'h 1' has ' '"
refused '[kv]\n\npool_size = 12q\n' "^ternd: $f:3: \[kv\] pool_size: 12q is not a size"
refused '[kv]\nseg_size = 100k\n' "^ternd: $f:2: \[kv\] seg_size: 100k is not a power of two"
refused '[kv]\nseg_size = 64k\npool_size = 100k\n' "^ternd: $f:3: \[kv\] pool_size: 100k is out of range"
refused '[nod]\nname = x\n' "^ternd: $f:2: \[nod\]: unknown section"
refused '[node]\nnmae = x\n' "^ternd: $f:2: \[node\] nmae: unknown key"
refused 'name = x\n' "^ternd: $f:1: name: outside a section"
refused '[node]\nname = a\nname = b\n' "^ternd: $f:3: \[node\] name: set twice \(first on line 2\)"
refused '[node\nname = a\n' "^ternd: $f:1: syntax: not 'key = value'"
refused '[node]\nname = a\n  more\n' "^ternd: $f:3: syntax"
refused '[policy]\nsame_rack = ntb,foo\n' "^ternd: $f:2: \[policy\] same_rack: 'foo' is not a fabric"
refused '[policy]\nsubnet = 10.0.0.0/33 tcp\n' "^ternd: $f:2: \[policy\] subnet: .* is not 'A.B.C.D/BITS FABRIC'"
refused '[peer h2]\nrack = r1\n' "^ternd: $f: \[peer h2\]: no address"
refused '[node]\nlog_level = loud\n' "^ternd: $f:2: \[node\] log_level: loud is not one of error, warn"
refused "[node]\nlisten = tcp://$(head -c 300 /dev/zero | tr '\0' a):1\n" "^ternd: $f:2: syntax: line longer than"
refused '[node]\nname = h1\n[peer h1]\naddress = tcp://a:1\n' "this node's own name"
refused '[doc]\nmongo_port = 0\nmongo_host = 10.1.2\n' "^ternd: $f:3: \[doc\] mongo_host: '10.1.2' is not an IPv4 address"
refused '[doc]\nmongo_host = bad_host\n' "^ternd: $f:2: \[doc\] mongo_host: 'bad_host' is not an IPv4 or IPv6 address nor a host name"
refused '[doc]\nmongo_host = [::1]\n' "^ternd: $f:2: \[doc\] mongo_host: '\[::1\]': write an IPv6 address without brackets"
refused '[doc]\nmongo_host = nosuch.invalid\n' "^ternd: $f:2: \[doc\] mongo_host: host name 'nosuch.invalid' does not resolve"
refused '[doc]\nmongo_host = 0.0.0.0\n' "^ternd: --mongo-host is where the MongoDB gateway listens: it needs --mongo-port"
# The gateway's address, from the file and from a flag, as --check prints it.
printf '[doc]\nmongo_port = 27017\nmongo_host = ::1\n' >"$dir/m.conf"
"$ternd" --config "$dir/m.conf" --check | grep -qx 'mongo_host = ::1' || fail "mongo_host not printed"
"$ternd" --config "$dir/m.conf" --check --mongo-host 0.0.0.0 | grep -qx 'mongo_host = 0.0.0.0' ||
    fail "--mongo-host did not win over the file"
"$ternd" --config "$dir/none.conf" --check 2>"$dir/err" && fail "a missing file was taken"
grep -q "none.conf: No such file" "$dir/err" || fail "a missing file: $(cat "$dir/err")"

# Serving from the file: its listen, its gateway, its log file.
"$ternd" --config "$dir/t.conf" >"$dir/out" 2>"$dir/stderr" &
pid=$!
for _ in $(seq 100); do
    grep -q '^ternd ready' "$dir/out" && break
    kill -0 $pid 2>/dev/null || fail "ternd exited: $(cat "$dir/stderr" "$dir/ternd.log" 2>/dev/null)"
    sleep 0.05
done
grep -q '^ternd ready tcp://127.0.0.1:[0-9]* .*resp=127.0.0.1:' "$dir/out" ||
    fail "not ready where the file says: $(cat "$dir/out")"
[ -e "$dir/data/kv.pool" ] && [ ! -e "$dir/data/doc.pool" ] || fail "pools are not as the file says"

iso='^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z (error|warn |info |debug) \[[0-9]+\] [a-z_-]+: '
wait_log() {    # PATTERN
    for _ in $(seq 100); do
        grep -q "$1" "$dir/ternd.log" 2>/dev/null && return 0
        sleep 0.05
    done
    fail "the log never said '$1': $(cat "$dir/ternd.log" 2>/dev/null)"
}

# SIGHUP: the new policy is taken.
sed -i 's/^same_rack = ntb,tcp$/same_rack = rdma,tcp/' "$dir/t.conf"
kill -HUP $pid
wait_log 'policy reloaded from .* same_rack=rdma,tcp other_rack=rdma,tcp, 1 subnet rule$'
# A wrong file keeps the policy and says where.
sed -i 's/^same_rack = rdma,tcp$/same_rack = carrier-pigeon/' "$dir/t.conf"
kill -HUP $pid
wait_log "t.conf:19: \[policy\] same_rack: 'carrier-pigeon' is not a fabric"
wait_log 'not reloaded: the policy stays as it was'
# A log rotated away is let go and a new one started.
mv "$dir/ternd.log" "$dir/ternd.log.1"
sed -i 's/^same_rack = carrier-pigeon$/same_rack = tcp/' "$dir/t.conf"
kill -HUP $pid
wait_log 'same_rack=tcp other_rack'
kill -0 $pid || fail "ternd died on SIGHUP"
kill -TERM $pid
wait $pid || fail "ternd exited with $? on SIGTERM"
pid=""
grep -q 'ternd: stopped$' "$dir/ternd.log" || fail "no 'stopped' line in the new log"
grep -Evq "$iso" "$dir/ternd.log" "$dir/ternd.log.1" &&
    fail "a line in another format: $(grep -Ev "$iso" "$dir/ternd.log" "$dir/ternd.log.1" | head -3)"
[ ! -s "$dir/stderr" ] || fail "with log_file, stderr got: $(cat "$dir/stderr")"

# A gateway on every address says (and would register) the node's own
# listen address: no driver can dial 0.0.0.0.
if "$ternd" --help | grep -q -- '--mongo-port'; then
    "$ternd" --data-dir "$dir/data4" --listen tcp://127.0.0.1:0 --no-shm --pool-size 4m \
        --seg-size 64k --doc-pool-size 256m --mongo-port 0 --mongo-host 0.0.0.0 \
        >"$dir/any.out" 2>"$dir/any.err" &
    pid=$!
    for _ in $(seq 100); do
        grep -q '^ternd ready' "$dir/any.out" && break
        kill -0 $pid 2>/dev/null || fail "ternd with --mongo-host 0.0.0.0 exited: $(cat "$dir/any.err")"
        sleep 0.05
    done
    grep -q '^ternd ready .* mongo=127\.0\.0\.1:[1-9][0-9]* ' "$dir/any.out" ||
        fail "--mongo-host 0.0.0.0: $(cat "$dir/any.out")"
    grep -q 'mongo_host = 0.0.0.0: the MongoDB gateway has no authentication' "$dir/any.err" ||
        fail "no warning for a gateway beyond the loopback: $(cat "$dir/any.err")"
    kill -TERM $pid
    wait $pid || fail "ternd exited with $? on SIGTERM"
    pid=""
fi

# TERN_LOG that names no level is said, not ignored.
TERN_LOG=loud "$ternd" --data-dir "$dir/data3" --listen tcp://127.0.0.1:0 --no-doc \
    --pool-size 4m --seg-size 64k >/dev/null 2>"$dir/loud.err" &
pid=$!
sleep 0.5
kill -TERM $pid
wait $pid || true
pid=""
grep -Eq "$iso.*TERN_LOG=loud is not a level \(error, warn, info, debug\): using warn" "$dir/loud.err" ||
    fail "TERN_LOG=loud was not reported: $(cat "$dir/loud.err")"
# The man page names every key the table has, and the unit file is sound.
man=$build/docs/man/ternd.conf.5
if [ -f "$man" ]; then
    "$ternd" --help | sed -n 's/^  --[a-z-]*\( V\)\{0,1\} *\[[a-z]*\] \([a-z_]*\).*/\2/p' >"$dir/keys"
    [ "$(wc -l <"$dir/keys")" -ge 20 ] || fail "read too few keys from --help: $(cat "$dir/keys")"
    for k in $(cat "$dir/keys") same_rack other_rack subnet address; do
        grep -qxF "\\fB$k\\fR" "$man" || fail "ternd.conf(5) does not document $k"
    done
    extra=", ternd.conf(5) names all $(wc -l <"$dir/keys") keys"
else
    extra=" (SKIP man page check: built without scdoc)"
fi
# The unit, with the build's ternd in place of the installed one.
unit=$build/tools/ternd/ternd.service
if command -v systemd-analyze >/dev/null && [ -f "$unit" ]; then
    sed "s#^\(Exec[A-Za-z]*=\)[^ ]*/ternd #\1$(cd "$build" && pwd)/tools/ternd/ternd #" "$unit" \
        >"$dir/ternd.service"
    # It warns and exits 0 for unknown keys and bad values: any line is a fault.
    systemd-analyze verify --man=no "$dir/ternd.service" >"$dir/verify" 2>&1 || true
    [ ! -s "$dir/verify" ] || fail "systemd-analyze verify: $(cat "$dir/verify")"
    extra="$extra, the unit verified"
fi
echo "ternd config: ok$extra"

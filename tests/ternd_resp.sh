#!/usr/bin/env bash
# ternd's RESP gateway end to end: keys that expire, SCAN under load,
# redis-benchmark's default list, collections across kill -9,
# redis-cli --stat, and AUTH with a password file.
#
#  - a key set with EX 2 is gone 2 s later, also across a kill -9 and
#    restart in between, and never comes back after another one;
#  - TTLs count down across the restart (the deadline is in the record);
#  - keys nobody reads again are removed in the background (INFO's
#    expired_keys and keyspace);
#  - SCAN returns every key present for the whole scan while a second
#    client writes, overwrites and deletes between its calls, enough to
#    grow the index several times and make the pool clean segments;
#  - redis-cli --stat prints numbers, not blanks (it reads INFO's fields);
#  - with resp_password_file, commands wait for AUTH; a world-readable
#    password file is refused at start.
#
#   tests/ternd_resp.sh BUILD_DIR
set -euo pipefail

build=$1
ternd=$build/tools/ternd/ternd
command -v redis-cli >/dev/null || { echo "SKIP: redis-cli not installed"; exit 77; }
base=/tmp
[ -d /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/tern-resp-XXXXXX")
pid=""
# The last ternd is waited for, so that bash prints no "Killed" line; its
# status (137) must not become the script's.
trap 'if [ -n "$pid" ]; then kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null || true; fi
      rm -rf "$dir"' EXIT
fail() { echo "ternd resp: $*" >&2; exit 1; }

start() {
    : >"$dir/out"
    "$ternd" --data-dir "$dir/data" --listen tcp://127.0.0.1:0 --resp-port 0 \
        --pool-size 16m --seg-size 64k "$@" >"$dir/out" 2>>"$dir/err" &
    pid=$!
    for _ in $(seq 200); do
        grep -q '^ternd ready' "$dir/out" && break
        kill -0 $pid 2>/dev/null || fail "ternd exited: $(cat "$dir/err")"
        sleep 0.05
    done
    port=$(sed -n 's/.* resp=127.0.0.1:\([0-9]*\).*/\1/p' "$dir/out")
    [ -n "$port" ] || fail "no ready line: $(cat "$dir/out" "$dir/err")"
}
crash() {
    kill -9 $pid
    wait $pid 2>/dev/null || true
    pid=""
}
r() { redis-cli -p "$port" "$@"; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }

start
t0=$(now_ms)
[ "$(r set gone v EX 2)" = OK ] || fail "SET EX"
r set long v EX 100 >/dev/null
r set mid v PX 4000 >/dev/null
r set plain v >/dev/null
[ "$(r ttl gone)" = 2 ] || fail "TTL of a fresh EX 2 key: $(r ttl gone)"
sleep 0.5
crash
start
ttl=$(r ttl long)
[ "$ttl" -ge 96 ] && [ "$ttl" -le 100 ] || fail "TTL after restart: $ttl, not 96..100"
pttl=$(r pttl mid)
elapsed=$(($(now_ms) - t0))
[ "$pttl" -gt 0 ] && [ "$pttl" -le $((4000 - elapsed + 50)) ] ||
    fail "PTTL after restart: $pttl with $elapsed ms gone (set PX 4000)"
[ "$(r ttl plain)" = -1 ] || fail "a key without a deadline got one"
# 2 s after the SET (and a restart later) the key is gone.
while [ $(($(now_ms) - t0)) -lt 2000 ]; do sleep 0.05; done
[ -z "$(r get gone)" ] || fail "EX 2 key still there 2 s later"
[ "$(r exists gone)" = 0 ] && [ "$(r ttl gone)" = -2 ] || fail "EXISTS/TTL of an expired key"
crash
start
[ -z "$(r get gone)" ] && [ "$(r exists gone)" = 0 ] || fail "an expired key came back after a restart"
[ "$(r get long)" = v ] || fail "a key with 98 s to live was lost"

# Background removal: 300 keys with 200 ms to live, never read again.
before=$(r dbsize)
for i in $(seq 300); do echo "SET tmp:$i x PX 200"; done | r >/dev/null
[ "$(r dbsize)" = $((before + 300)) ] || fail "DBSIZE after the SETs: $(r dbsize)"
for _ in $(seq 40); do
    [ "$(r dbsize)" = "$before" ] && break
    sleep 0.05
done
[ "$(r dbsize)" = "$before" ] || fail "keys past their deadline not removed: DBSIZE $(r dbsize), want $before"
expired=$(r info stats | tr -d '\r' | sed -n 's/^expired_keys://p')
[ "$expired" -ge 300 ] || fail "expired_keys $expired, want at least 300"
r info keyspace | tr -d '\r' | grep -q "^db0:keys=$before,expires=[12]," ||
    fail "INFO keyspace: $(r info keyspace)"

# SCAN under writes, overwrites and deletes.
python3 - "$port" <<'PY' || fail "SCAN under load"
import socket, sys

port = int(sys.argv[1])

class Conn:
    def __init__(self):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.f = self.s.makefile("rb")
    def send(self, cmds):
        out = b""
        for c in cmds:
            out += b"*%d\r\n" % len(c)
            for a in c:
                a = a if isinstance(a, bytes) else str(a).encode()
                out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.s.sendall(out)
        return [self.reply() for _ in cmds]
    def reply(self):
        line = self.f.readline()
        t, rest = line[:1], line[1:-2]
        if t in (b"+", b":"):
            return rest
        if t == b"-":
            raise SystemExit("error reply: %r" % rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)
            return data[:-2]
        if t == b"*":
            return [self.reply() for _ in range(int(rest))]
        raise SystemExit("bad reply %r" % line)

scanner, writer = Conn(), Conn()
stable = {b"stable:%d" % i for i in range(3000)}
for i in range(0, 3000, 500):
    writer.send([["SET", "stable:%d" % j, "s" * 40] for j in range(i, i + 500)])
info = lambda: dict(l.split(b":", 1) for l in writer.send([["INFO"]])[0].split(b"\r\n")
                    if b":" in l)
cleaned0 = int(info()[b"tern_segs_cleaned"])
seen, cursor, steps, n = set(), b"0", 0, 0
while True:
    cursor, keys = scanner.send([["SCAN", cursor, "COUNT", 20]])[0]
    seen.update(keys)
    steps += 1
    # Between two SCAN calls: 60 new keys (the index grows), 30 of the
    # newest deleted, 40 hot keys overwritten with values longer each time
    # (never in place: dead records for the cleaner).
    cmds = [["SET", "churn:%d" % (n + j), "c" * 30] for j in range(60)]
    cmds += [["DEL", "churn:%d" % (n + j)] for j in range(0, 60, 2)]
    cmds += [["SET", "hot:%d" % j, "h" * (200 + 4 * steps)] for j in range(40)]
    writer.send(cmds)
    n += 60
    if cursor == b"0":
        break
missing = stable - seen
cleaned = int(info()[b"tern_segs_cleaned"]) - cleaned0
print("scan: %d calls, %d keys seen, %d churn keys written, %d segments cleaned meanwhile"
      % (steps, len(seen), n, cleaned))
if missing:
    raise SystemExit("SCAN missed %d stable keys, e.g. %r" % (len(missing), sorted(missing)[:5]))
if n < 3 * 3000:
    raise SystemExit("the load was too light to grow the index: %d keys" % n)
if cleaned == 0:
    raise SystemExit("no segment was cleaned during the scan: the test did not test that")
PY

# redis-benchmark: its default list runs to the end, every test with a
# result. Debian's redis-benchmark 7.0 exits at the first error reply, so
# this also says that no test of the list got one.
if command -v redis-benchmark >/dev/null; then
    redis-benchmark -p "$port" -q -n 2000 -c 4 2>&1 | tr '\r' '\n' >"$dir/bench" ||
        fail "redis-benchmark's default list stopped: $(grep -v rps= "$dir/bench" | tail -5)"
    for t in PING_INLINE PING_MBULK SET GET INCR LPUSH RPUSH LPOP RPOP SADD HSET SPOP ZADD \
        ZPOPMIN 'LPUSH (needed to benchmark LRANGE)' 'LRANGE_100 (first 100 elements)' \
        'LRANGE_300 (first 300 elements)' 'LRANGE_500 (first 500 elements)' \
        'LRANGE_600 (first 600 elements)' 'MSET (10 keys)'; do
        grep -qF "$t: " "$dir/bench" || fail "no $t result: $(grep -v rps= "$dir/bench")"
    done
    ! grep -q "Error from server" "$dir/bench" || fail "an error reply: $(cat "$dir/bench")"
    # What it left: its list, set, hash and sorted set, with their types.
    [ "$(r type mylist)" = list ] || fail "TYPE mylist: $(r type mylist)"
    [ "$(r type myhash)" = hash ] || fail "TYPE myhash: $(r type myhash)"
    [ "$(r llen mylist)" -ge 600 ] || fail "LLEN mylist: $(r llen mylist)"
    [ "$(r ping)" = PONG ] || fail "the gateway stopped serving after redis-benchmark"
else
    echo "SKIP: redis-benchmark checks (redis-tools not installed)"
fi

# Lists, hashes, sets and sorted sets across kill -9: contents, order,
# scores and deadlines come back; a deleted big set and an expired list
# do not; RENAME moved the list for good.
r del mylist myhash myset myzset >/dev/null
r rpush q a b c d >/dev/null
r lpop q >/dev/null
r lpush q z >/dev/null
r hset h f 1 g 2 >/dev/null
r hincrby h f 41 >/dev/null
r sadd s x y x >/dev/null
r zadd z 2.5 b 1 a 3 c >/dev/null
r zincrby z 10 a >/dev/null
r expire z 100 >/dev/null
r rename q q2 >/dev/null
for i in $(seq 500); do echo "SADD big m$i"; done | r >/dev/null
r del big >/dev/null
r rpush short x >/dev/null
r pexpire short 300 >/dev/null
crash
start
[ "$(r lrange q2 0 -1 | tr '\n' ' ')" = "z b c d " ] || fail "list after restart: $(r lrange q2 0 -1)"
[ "$(r exists q)" = 0 ] || fail "a renamed list came back under its old key"
[ "$(r hget h f)" = 42 ] && [ "$(r hlen h)" = 2 ] || fail "hash after restart: $(r hgetall h)"
[ "$(r scard s)" = 2 ] && [ "$(r sismember s y)" = 1 ] || fail "set after restart: $(r smembers s)"
[ "$(r zrange z 0 -1 withscores | tr '\n' ' ')" = "b 2.5 c 3 a 11 " ] ||
    fail "sorted set after restart: $(r zrange z 0 -1 withscores)"
ttl=$(r ttl z)
[ "$ttl" -ge 90 ] && [ "$ttl" -le 100 ] || fail "a sorted set's TTL after restart: $ttl"
[ "$(r exists big)" = 0 ] || fail "a deleted set came back"
sleep 0.4
[ "$(r exists short)" = 0 ] || fail "a list past its deadline is still there"
[ "$(r type q2) $(r type h) $(r type s) $(r type z)" = "list hash set zset" ] || fail "TYPE after restart"

# redis-cli --stat wants a terminal; script(1) gives it one.
if command -v script >/dev/null; then
    script -qc "timeout 3 redis-cli -p $port --stat -i 0.5" /dev/null >"$dir/stat" 2>&1 || true
    tr -d '\r' <"$dir/stat" | grep -Eq '^[0-9]+ +[0-9.]+[BKMG] +[0-9]+ +0 +[0-9]+ \(\+[0-9]+\) +[0-9]+' ||
        fail "redis-cli --stat: $(cat "$dir/stat")"
else
    echo "SKIP: redis-cli --stat check (no script(1))"
fi

# AUTH with a password file.
crash
printf 'pa55 word\n' >"$dir/pass"
chmod 644 "$dir/pass"
printf '[kv]\nresp_password_file = %s\n' "$dir/pass" >"$dir/conf"
if "$ternd" --config "$dir/conf" --check >"$dir/check" 2>&1; then
    fail "a world-readable password file was taken"
fi
grep -q "readable by others" "$dir/check" || fail "refused for another reason: $(cat "$dir/check")"
chmod 600 "$dir/pass"
"$ternd" --config "$dir/conf" --check | grep -q "^resp_password_file = $dir/pass" ||
    fail "--check of a good password file: $("$ternd" --config "$dir/conf" --check 2>&1)"
start --resp-password-file "$dir/pass"
r get long | grep -q NOAUTH || fail "a command ran before AUTH: $(r get long)"
[ "$(redis-cli -p "$port" --no-auth-warning -a wrong get long 2>&1)" != v ] || fail "a wrong password"
[ "$(redis-cli -p "$port" --no-auth-warning -a 'pa55 word' get long)" = v ] ||
    fail "AUTH with the file's password: $(redis-cli -p "$port" --no-auth-warning -a 'pa55 word' get long)"
echo "ternd resp: ok"

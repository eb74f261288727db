#!/usr/bin/env bash
# ternd's memory under one RESP command whose reply is far larger than the
# gateway's output cap: a client SETs a 1 MiB value, another sends MGET of
# that key N times (1000: a 1 GB reply) and never reads. Prints ternd's
# resident memory (VmRSS, and its peak VmHWM) before and after, whether
# another client is still served, and what the reader would get first.
#
#   tools/rpcbench/resp-bigreply.sh [--times N] [--build DIR]
set -euo pipefail

times=1000 build=build
while [ $# -gt 0 ]; do
    case $1 in
        --times) times=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        *) echo "usage: $0 [--times N] [--build DIR]" >&2; exit 2 ;;
    esac
done
ternd=$build/tools/ternd/ternd
[ -x "$ternd" ] || { echo "$ternd: not built" >&2; exit 1; }

dir=$(mktemp -d "${TMPDIR:-/dev/shm}/resp-bigreply.XXXXXX")
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT

# Segments of 2 MiB, so that a 1 MiB value fits.
"$ternd" --data-dir "$dir" --listen tcp://127.0.0.1:0 --no-shm --resp-port 0 \
    --seg-size 2m >"$dir/out" 2>"$dir/err" &
pid=$!
for _ in $(seq 100); do
    grep -q '^ternd ready' "$dir/out" 2>/dev/null && break
    sleep 0.1
done
port=$(sed -n 's/.* resp=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$dir/out")
[ -n "$port" ] || { echo "ternd did not start:" >&2; cat "$dir/err" >&2; exit 1; }

python3 - "$port" "$pid" "$times" <<'PY'
import socket, sys, time
port, pid, times = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])

def mem(tag):
    f = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        f[k] = v.strip()
    print(f"  {tag:28s} VmRSS {f['VmRSS']:>12s}   VmHWM {f['VmHWM']:>12s}")

def reply(s, n=200):
    s.settimeout(5)
    return s.recv(n)

b = socket.create_connection(("127.0.0.1", port))
val = b"v" * (1 << 20)
b.sendall(b"*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$%d\r\n" % len(val) + val + b"\r\n")
assert reply(b) == b"+OK\r\n"
mem("after SET of 1 MiB")
a = socket.create_connection(("127.0.0.1", port))
a.sendall(b"*%d\r\n$4\r\nMGET\r\n" % (times + 1) + b"$3\r\nbig\r\n" * times)
time.sleep(3)
mem(f"MGET x{times}, unread")
b.sendall(b"PING\r\n")
print("  another client's PING        ", reply(b))
print("  the reader's first bytes     ", reply(a, 80))
PY

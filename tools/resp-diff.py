#!/usr/bin/env python3
"""Send the same commands to a Redis server and to tern's RESP gateway and
show where the raw replies differ, byte for byte.

    tools/resp-diff.py [--redis PORT] [--tern PORT] [--record OUT] [FILE]

FILE (default: stdin) holds one command a line, its words split as a shell
would (shlex). Lines starting with '#' are comments; a line starting with
'~' is sent to both but only compared by reply type (random results:
SPOP, SRANDMEMBER, RANDOMKEY). Both servers are flushed first. Exits 1 if
any reply differs. A development tool: with --record, Redis's replies are
written to OUT as the resp_coll suite replays them against the gateway
(tests/resp_coll.txt), so that CI needs no redis-server:

    > WORD WORD ...          a command, each word escaped (esc())
    < REPLY                  Redis's reply, escaped; "<~" compares its type only
"""
import argparse
import shlex
import socket
import sys


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.f = self.s.makefile("rb")

    def call(self, words):
        out = b"*%d\r\n" % len(words)
        for w in words:
            w = w.encode("latin-1") if isinstance(w, str) else w
            out += b"$%d\r\n%s\r\n" % (len(w), w)
        self.s.sendall(out)
        return self.raw()

    def raw(self):
        line = self.f.readline()
        t, rest = line[:1], line[1:-2]
        if t in (b"+", b"-", b":"):
            return line
        if t == b"$":
            n = int(rest)
            return line + (self.f.read(n + 2) if n >= 0 else b"")
        if t == b"*":
            n = int(rest)
            return line + b"".join(self.raw() for _ in range(max(n, 0)))
        raise SystemExit("bad reply %r" % line)


def esc(b):
    """Bytes as printable ASCII: \\r \\n \\\\ \\s (blank) \\xNN."""
    out = []
    for ch in b:
        c = chr(ch)
        if c == "\r":
            out.append("\\r")
        elif c == "\n":
            out.append("\\n")
        elif c == "\\":
            out.append("\\\\")
        elif c == " ":
            out.append("\\s")
        elif 33 <= ch < 127:
            out.append(c)
        else:
            out.append("\\x%02x" % ch)
    return "".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis", type=int, default=6379)
    ap.add_argument("--tern", type=int, default=6380)
    ap.add_argument("--record")
    ap.add_argument("file", nargs="?")
    a = ap.parse_args()
    src = open(a.file) if a.file else sys.stdin
    redis, tern = Conn(a.redis), Conn(a.tern)
    redis.call(["FLUSHALL"])
    tern.call(["FLUSHALL"])
    rec = open(a.record, "w") if a.record else None
    if rec:
        rec.write("# Redis 7.0's replies, recorded with tools/resp-diff.py from %s.\n"
                  % (a.file or "stdin"))
    bad = n = 0
    for line in src:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        loose = line.startswith("~")
        words = shlex.split(line.lstrip("~"))
        want, got = redis.call(words), tern.call(words)
        n += 1
        if rec:
            rec.write("> %s\n<%s %s\n" % (" ".join(esc(w.encode("latin-1")) for w in words),
                                          "~" if loose else "", esc(want)))
        same = want[:1] == got[:1] if loose else want == got
        if not same:
            bad += 1
            print("%s\n  redis: %r\n  tern:  %r" % (line, want[:300], got[:300]))
    print("%d commands, %d differ" % (n, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

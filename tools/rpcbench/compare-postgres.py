#!/usr/bin/python3
# The Python half of compare-postgres.sh: one client doing N calls of each
# operation (insert, read, find, update: the same as its pgbench scripts and
# mongo-load) through psycopg2 against PostgreSQL or pymongo against ternd's
# MongoDB gateway, timing them and the server's CPU (/proc, as the shell
# script does). Debian's packages, so Debian's /usr/bin/python3.
#
#   compare-postgres.py postgres HOST:PORT POSTMASTER_PID N RECORDS KEYS
#   compare-postgres.py tern URI TERND_PID N RECORDS KEYS
#
# Prints "OP CALLS SECONDS CPU_TICKS" per operation.
import os
import random
import sys
import time

F2 = "u" * 96


def ticks(pid, reaped=False):
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    t = int(fields[11]) + int(fields[12])
    if reaped:
        t += int(fields[13]) + int(fields[14])
    return t


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except OSError:
                pass
    return out


def server_ticks(system, pid):
    if system == "tern":
        return ticks(pid)
    return ticks(pid, True) + sum(ticks(c) for c in children(pid))


def doc(i, keys):
    d = {"_id": i}
    for j in range(10):
        d["f%d" % j] = str(i % keys) if j == 1 else chr(97 + (i + j) % 26) * 96
    d["cnt"] = 0
    return d


def main():
    system, addr, pid, n, records, keys = sys.argv[1:7]
    pid, n, records, keys = int(pid), int(n), int(records), int(keys)
    rnd = random.Random(7)
    if system == "postgres":
        import psycopg2
        host, port = addr.rsplit(":", 1)
        conn = psycopg2.connect(host=host, port=int(port), user="postgres", dbname="bench")
        conn.autocommit = True
        cur = conn.cursor()

        def insert(_):
            cur.execute("INSERT INTO docs SELECT i, mkdoc(i) FROM (SELECT nextval('ins') AS i) AS s")

        def read(k):
            cur.execute("SELECT doc FROM docs WHERE id = %s", (k,))
            return cur.fetchall()

        def find(v):
            cur.execute("SELECT doc FROM docs WHERE doc->>'f1' = %s", (str(v),))
            return cur.fetchall()

        def update(k):
            cur.execute("UPDATE docs SET doc = doc || jsonb_build_object('cnt', (doc->>'cnt')::int + 1,"
                        " 'f2', %s) WHERE id = %s", (F2, k))
    else:
        import pymongo
        client = pymongo.MongoClient(addr)
        coll = client.bench.docs
        next_id = [(1 << 40) + (1 << 39)]

        def insert(_):
            coll.insert_one(doc(next_id[0], keys))
            next_id[0] += 1

        def read(k):
            return coll.find_one({"_id": k})

        def find(v):
            return list(coll.find({"f1": str(v)}))

        def update(k):
            coll.update_one({"_id": k}, {"$inc": {"cnt": 1}, "$set": {"f2": F2}})

    for name, fn, space in (("insert", insert, records), ("read", read, records),
                            ("find", find, keys), ("update", update, records)):
        args = [rnd.randrange(space) for _ in range(n)]
        before, t0 = server_ticks(system, pid), time.monotonic()
        for a in args:
            fn(a)
        secs, after = time.monotonic() - t0, server_ticks(system, pid)
        print(name, n, "%.3f" % secs, after - before, flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""A pymongo application on a tern document shard seen as a replica set.

    replset.py write HOSTS SET SECONDS OUT.json
        Writes for SECONDS (or until the file $STOP_FILE exists) with the driver's defaults for a replica set
        (w: majority, retryable writes): inserts of new documents, updates
        of documents written before, and now and then a read of one from
        the primary and a read from a secondary. Whatever the driver does
        not hide from the application (an exception) is recorded. OUT gets
        {acked: [_id...], updated: {_id: n}, errors: [...], outages:
        [[s into the run, ms, the operation that ended it]...], ...}: an
        outage is a gap of over 100 ms between two acknowledged writes (as
        rpcbench failover counts them).

    replset.py check HOSTS SET OUT.json
        Every acknowledged insert and update of OUT is on the primary.

    replset.py count HOST
        The collection's documents on one member (a direct connection,
        reading as a secondary may), printed.

    replset.py members HOSTS OUT.json
        Every acknowledged insert and update of OUT on every member of
        HOSTS, each read through a direct connection as a secondary may,
        and the members holding the same documents: prints one line per
        member and exits 1 if any falls short or they differ.

    replset.py stray HOST SECONDS OUT.json
        A client connected to one member alone (directConnection) that
        inserts with w: majority for SECONDS: the client left with a
        primary cut off from the others. OUT gets {tried, acked, errors}.

HOSTS is "h:p,h:p,..."; the tests around it (tests/ternd_replset.sh,
tools/rpcbench/partition-doc.sh) kill the primary, or cut it off, while
`write` runs. SOCKET_TIMEOUT_MS (default: the driver's, none) bounds each
operation's wait on a connection (socketTimeoutMS and connectTimeoutMS):
a primary cut off by a partition holds its writes and sends nothing, so
without it the driver would wait for as long as the partition lasts.
"""
import json
import os
import sys
import time

import pymongo
from pymongo import ReadPreference
from pymongo.errors import PyMongoError


OUTAGE_S = 0.1


def timeouts(kw):
    if os.environ.get("SOCKET_TIMEOUT_MS"):
        kw["socketTimeoutMS"] = kw["connectTimeoutMS"] = int(os.environ["SOCKET_TIMEOUT_MS"])


def client(hosts, rs, **kw):
    # HEARTBEAT_MS: the driver's heartbeatFrequencyMS (its own default,
    # 10 s, unless set), to compare monitoring at other rates.
    if os.environ.get("HEARTBEAT_MS"):
        kw["heartbeatFrequencyMS"] = int(os.environ["HEARTBEAT_MS"])
    timeouts(kw)
    return pymongo.MongoClient("mongodb://%s/?replicaSet=%s" % (hosts, rs),
                               serverSelectionTimeoutMS=30000, **kw)


def write(hosts, rs, seconds, out):
    c = client(hosts, rs)
    coll = c.test.replset
    sec = coll.with_options(read_preference=ReadPreference.SECONDARY_PREFERRED)
    acked, updated, errors = [], {}, []
    primaries, reads, sec_reads, worst, stalls = set(), 0, 0, 0.0, []
    outages = []
    start = time.monotonic()
    last_ack = None
    end = start + seconds
    i = 0
    stop = os.environ.get("STOP_FILE")
    while time.monotonic() < end and not (stop and os.path.exists(stop)):
        t0 = time.monotonic()
        try:
            if i % 4 == 3 and acked:
                k = acked[(i * 7919) % len(acked)]
                coll.update_one({"_id": k}, {"$inc": {"n": 1}})
                updated[k] = updated.get(k, 0) + 1
            else:
                coll.insert_one({"_id": i, "v": "x" * 64, "n": 0})
                acked.append(i)
            now = time.monotonic()
            if last_ack is not None and now - last_ack > OUTAGE_S:
                outages.append((round(last_ack - start, 3), round((now - last_ack) * 1000, 1), i))
            last_ack = now
            if i % 50 == 0 and acked:
                d = coll.find_one({"_id": acked[-1]})
                if d is None:
                    errors.append("read of %d on the primary found nothing" % acked[-1])
                reads += 1
                sec.find_one({"_id": acked[0]})
                sec_reads += 1
            if c.primary:
                primaries.add("%s:%d" % c.primary)
        except PyMongoError as e:
            errors.append("%d: %s: %s" % (i, type(e).__name__, e))
        took = time.monotonic() - t0
        worst = max(worst, took)
        if took > 0.5:
            stalls.append((round(t0 - start, 1), round(took, 2)))
        i += 1
    if last_ack is not None and time.monotonic() - last_ack > OUTAGE_S:
        outages.append((round(last_ack - start, 3),
                        round((time.monotonic() - last_ack) * 1000, 1), i))
    json.dump({"acked": acked, "updated": {str(k): v for k, v in updated.items()},
               "errors": errors, "reads": reads, "secondary_reads": sec_reads,
               "primaries": sorted(primaries), "worst_op_s": round(worst, 3),
               "stalls": stalls, "outages": outages,
               "worst_outage_ms": max([o[1] for o in outages], default=0.0)},
              open(out, "w"))
    print("wrote %d, updated %d, errors %d, primaries %s, slowest operation %.2f s"
          % (len(acked), sum(updated.values()), len(errors), sorted(primaries), worst))
    print("operations over 0.5 s (s into the run: s): %s"
          % ", ".join("%.1f: %.2f" % x for x in stalls))
    for e in errors[:10]:
        print("  error:", e)
    return 0 if not errors else 1


def check(hosts, rs, out):
    r = json.load(open(out))
    coll = client(hosts, rs).test.replset
    have = {d["_id"]: d.get("n", 0) for d in coll.find({}, {"n": 1})}
    lost = [k for k in r["acked"] if k not in have]
    # An update acknowledged to the application is there; one the driver
    # retried after an error it hid may be there twice (at-least-once).
    short = [k for k, n in r["updated"].items() if have.get(int(k), 0) < n]
    print("acknowledged %d, on the primary %d, lost %d, updates short %d"
          % (len(r["acked"]), len(have), len(lost), len(short)))
    if lost:
        print("  lost:", lost[:20])
    if short:
        print("  short:", short[:20])
    return 0 if not lost and not short else 1


def direct(host, **kw):
    timeouts(kw)
    return pymongo.MongoClient("mongodb://%s/?directConnection=true" % host,
                               serverSelectionTimeoutMS=10000, **kw)


def members(hosts, out):
    r = json.load(open(out))
    want = {k: 0 for k in r["acked"]}
    for k, n in r["updated"].items():
        want[int(k)] = n
    held, rc = [], 0
    for h in hosts.split(","):
        coll = direct(h, read_preference=ReadPreference.SECONDARY_PREFERRED).test.replset
        have = {d["_id"]: d.get("n", 0) for d in coll.find({}, {"n": 1})}
        lost = [k for k in want if k not in have]
        short = [k for k, n in want.items() if k in have and have[k] < n]
        # A write whose reply the application never had (the driver gave
        # it an error) may be there too: held, not acknowledged.
        extra = [k for k in have if k not in want]
        print("%s holds %d documents: %d acknowledged, lost %d, updates short %d; "
              "%d held that were not acknowledged %s"
              % (h, len(have), len(want), len(lost), len(short), len(extra), extra[:5]))
        if lost or short:
            print("  lost:", lost[:20], "short:", short[:20])
            rc = 1
        held.append(set(have))
    if any(x != held[0] for x in held[1:]):
        print("the members differ: %s" % ", ".join("%s %d" % (h, len(x)) for h, x in
                                                   zip(hosts.split(","), held)))
        rc = 1
    return rc


def stray(host, seconds, out):
    # w: majority as the load's; a stray acknowledgement is what it looks for.
    coll = direct(host, w="majority").test.replset
    tried, acked, errors = 0, 0, {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tried += 1
        try:
            coll.insert_one({"_id": "cut-%d-%d" % (os.getpid(), tried), "v": "x" * 64, "n": 0})
            acked += 1
        except PyMongoError as e:
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            time.sleep(0.05)
    json.dump({"tried": tried, "acked": acked, "errors": errors}, open(out, "w"))
    print("%d of %d writes acknowledged; refusals: %s" % (acked, tried, errors))
    return 0


def count(host):
    c = pymongo.MongoClient("mongodb://%s/?directConnection=true" % host,
                            read_preference=ReadPreference.SECONDARY_PREFERRED,
                            serverSelectionTimeoutMS=10000)
    print(c.test.replset.count_documents({}))
    return 0


def main(argv):
    if len(argv) == 6 and argv[1] == "write":
        return write(argv[2], argv[3], float(argv[4]), argv[5])
    if len(argv) == 5 and argv[1] == "check":
        return check(argv[2], argv[3], argv[4])
    if len(argv) == 3 and argv[1] == "count":
        return count(argv[2])
    if len(argv) == 4 and argv[1] == "members":
        return members(argv[2], argv[3])
    if len(argv) == 5 and argv[1] == "stray":
        return stray(argv[2], float(argv[3]), argv[4])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))

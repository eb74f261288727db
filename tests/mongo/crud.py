#!/usr/bin/python3
# The CRUD script of tests/mongo/README.md through pymongo (Debian's
# python3-pymongo 3.11, so Debian's /usr/bin/python3: the pyenv python3
# first on PATH does not see it). Prints the canonical transcript on stdout,
# one JSON line per step; tests/mongo/run.sh diffs it against the other
# clients' and expected.jsonl.
#
#   /usr/bin/python3 tests/mongo/crud.py URI DB
import json
import sys

import pymongo
from bson.int64 import Int64
from bson.objectid import ObjectId
from pymongo.errors import BulkWriteError, DuplicateKeyError, PyMongoError


def canon(v):
    """The transcript's form of a value, the same in every client: keys
    sorted (by json.dumps), an ObjectId as the string "ObjectId" (its
    bytes differ by client and run), numbers without their BSON type (the
    Node driver cannot tell an int32 from an integral double), so an
    integral double prints as an integer."""
    if isinstance(v, dict):
        return {k: canon(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [canon(x) for x in v]
    if isinstance(v, ObjectId):
        return "ObjectId"
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, Int64)):
        return int(v)
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 2**53:
            return int(v)
        return v
    return "<%s>" % type(v).__name__


def emit(step, **fields):
    fields["step"] = step
    print(json.dumps(canon(fields), sort_keys=True, separators=(",", ":"),
                     ensure_ascii=False), flush=True)


def error_fields(e):
    """A failure the script did not expect, in a form that cannot match
    the expected line of its step."""
    return {"unexpected_error": "%s: %s" % (type(e).__name__, e)}


def step(name, fn):
    try:
        emit(name, **fn())
    except PyMongoError as e:
        emit(name, **error_fields(e))


def upd(r):
    return {"matched": r.matched_count, "modified": r.modified_count,
            "upserted_id": r.upserted_id}


def main():
    uri, dbname = sys.argv[1], sys.argv[2]
    client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=20000)
    db = client[dbname]
    people, big = db.people, db.big
    people.drop()
    big.drop()

    cities = ["Oslo", "Lima", "Pune", "Kyiv"]
    tags = [["a", "b"], ["b"], []]
    docs = [{"_id": i, "name": "p%02d" % i, "age": 20 + (i * 7) % 30,
             "city": cities[i % 4], "tags": tags[i % 3], "score": i / 2}
            for i in range(20)]
    step("insert_many", lambda: {"n": len(people.insert_many(docs).inserted_ids)})
    step("insert_noid", lambda: {"reply": {k: v for k, v in db.command(
        "insert", "people", documents=[{"name": "noid", "age": 60, "city": "Oslo",
                                        "tags": ["z"], "score": 0.25}]).items()
        if k in ("n", "ok")}})
    step("find_noid", lambda: {"doc": people.find_one({"name": "noid"})})
    step("find", lambda: {"docs": list(
        people.find({"age": {"$gte": 30}, "city": {"$in": ["Oslo", "Lima"]}},
                    {"name": 1, "age": 1, "_id": 0})
        .sort([("age", -1), ("name", 1)]).limit(4))})
    step("find_array", lambda: {"docs": list(
        people.find({"tags": "b"}, {"tags": 0, "score": 0})
        .sort("_id", 1).skip(1).limit(3))})
    step("find_one_missing", lambda: {"doc": people.find_one({"name": "nobody"})})

    step("insert_big", lambda: {"n": len(big.insert_many(
        [{"_id": i, "v": i % 97, "pad": "x" * 100} for i in range(10000)]).inserted_ids)})

    def cursor():
        n, first, last, ordered, sum_v, prev = 0, None, None, True, 0, -1
        for d in big.find({}).sort("_id", 1).batch_size(500):
            if first is None:
                first = d["_id"]
            last = d["_id"]
            ordered = ordered and d["_id"] > prev
            prev = d["_id"]
            sum_v += d["v"]
            n += 1
        return {"n": n, "first": first, "last": last, "ordered": ordered, "sum_v": sum_v}
    step("cursor", cursor)
    step("cursor_filter", lambda: {"n": sum(1 for _ in big.find({"v": {"$lt": 10}}))})

    step("update_many", lambda: upd(people.update_many(
        {"city": "Oslo"}, {"$inc": {"age": 1}, "$set": {"visited": True}})))
    step("upsert_many", lambda: upd(people.update_many(
        {"name": "zed"}, {"$set": {"age": 99}, "$setOnInsert": {"city": "Nowhere"}},
        upsert=True)))
    step("upsert_id", lambda: upd(people.update_many(
        {"_id": 100}, {"$set": {"name": "hundred", "age": 50}}, upsert=True)))
    step("upsert_again", lambda: upd(people.update_many(
        {"name": "zed"}, {"$set": {"age": 98}}, upsert=True)))
    step("find_upserted", lambda: {"docs": list(
        people.find({"age": {"$gte": 50}},
                    {"_id": 0, "name": 1, "age": 1, "city": 1, "visited": 1})
        .sort("name", 1))})

    step("delete_one", lambda: {"n": people.delete_one({"name": "p03"}).deleted_count})
    step("delete_many", lambda: {"n": people.delete_many({"age": {"$lt": 25}}).deleted_count})
    step("delete_none", lambda: {"n": people.delete_many({"name": "nobody"}).deleted_count})

    step("count", lambda: {"all": people.count_documents({}),
                           "lima": people.count_documents({"city": "Lima"}),
                           "none": people.count_documents({"city": "Atlantis"}),
                           "skip_limit": people.count_documents({}, skip=2, limit=5),
                           "big": big.count_documents({})})

    step("create_index", lambda: {"name": people.create_index([("name", 1)], unique=True)})
    step("list_indexes", lambda: {"indexes": sorted(
        ({k: ix[k] for k in ("key", "name", "unique") if k in ix}
         for ix in people.list_indexes()), key=lambda ix: ix["name"])})

    def dup(fn):
        try:
            fn()
            return {"code": None}
        except DuplicateKeyError as e:
            return {"code": e.code}

    def dup_many(batch, ordered):
        try:
            people.insert_many(batch, ordered=ordered)
            return {"code": None}
        except BulkWriteError as e:
            errs = e.details["writeErrors"]
            return {"code": errs[0]["code"], "index": errs[0]["index"],
                    "errors": len(errs), "inserted": e.details["nInserted"]}
    step("dup_one", lambda: dup(lambda: people.insert_one({"_id": 200, "name": "p01"})))
    step("dup_id", lambda: dup(lambda: people.insert_one({"_id": 1, "name": "other"})))
    step("dup_many", lambda: dup_many(
        [{"_id": 300, "name": "q1"}, {"_id": 301, "name": "p02"}, {"_id": 302, "name": "q3"}],
        True))
    step("dup_unordered", lambda: dup_many(
        [{"_id": 303, "name": "p04"}, {"_id": 304, "name": "q4"}], False))
    step("count_after", lambda: {"all": people.count_documents({})})

    step("aggregate", lambda: {"docs": list(people.aggregate([
        {"$match": {"age": {"$gte": 20}}},
        {"$group": {"_id": "$city", "n": {"$sum": 1}, "avg_age": {"$avg": "$age"},
                    "min_age": {"$min": "$age"}, "max_age": {"$max": "$age"}}},
        {"$sort": {"_id": 1}}]))})
    step("aggregate_big", lambda: {"docs": list(big.aggregate([
        {"$group": {"_id": None, "n": {"$sum": 1}, "total": {"$sum": "$v"}}}]))})
    client.close()


if __name__ == "__main__":
    try:
        main()
    except PyMongoError as e:
        print("crud.py: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        sys.exit(1)

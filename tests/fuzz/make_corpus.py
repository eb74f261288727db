#!/usr/bin/env python3
"""Write the seed corpora of tests/fuzz: a few valid inputs per target, in
each target's input format (see the comment at the top of fuzz_NAME.c), so
that the fuzzer starts from sound structure. Inputs that once crashed a
target are kept beside them as regress-*; this script leaves those alone.

    tests/fuzz/make_corpus.py [DIR]     (default: tests/fuzz/corpus)
"""
import os
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")


def u8(v): return struct.pack("<B", v & 0xff)
def u16(v): return struct.pack("<H", v & 0xffff)
def u32(v): return struct.pack("<I", v & 0xffffffff)
def u64(v): return struct.pack("<Q", v & 0xffffffffffffffff)


def resp(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else a.encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


SEEDS = {}

# fuzz_resp_parse: limit index, count of read sizes, the sizes, the stream.
cmds = resp("SET", "key", "value") + resp("GET", "key") + b"PING\r\n" + resp("MSET", "a", "1", "b", "2")
SEEDS["resp_parse"] = {
    "multibulk": u8(0) + u8(0) + cmds,
    "pieces": u8(0) + u8(4) + bytes([1, 3, 7, 2]) + cmds,
    "inline": u8(5) + u8(0) + b"SET k v\r\nGET k\r\n\r\n",
    "limits": u8(3) + u8(2) + bytes([5, 9]) + resp("SET", "k", "x" * 90),
    "empty": u8(0) + u8(0) + b"*0\r\n*-1\r\n",
}

# fuzz_resp_gw: flags (bit 0: the group commit fails), the client's bytes.
gw = (resp("SET", "k", "v") + resp("GET", "k") + resp("SET", "k", "w", "NX") +
      resp("SET", "n", "1", "XX") + resp("INCR", "n") + resp("INCRBY", "n", "10") +
      resp("DECRBY", "n", "3") + resp("DECR", "n") + resp("MSET", "a", "1", "b", "2") +
      resp("MGET", "a", "b", "c") + resp("EXISTS", "a", "c") + resp("DEL", "a") +
      resp("DBSIZE") + resp("ECHO", "hi") + resp("PING") + resp("INFO", "keyspace") +
      resp("CONFIG", "GET", "maxmemory") + resp("SELECT", "0") + resp("CLIENT", "SETNAME", "x") +
      resp("COMMAND", "COUNT") + resp("SET", "e", "1", "EX", "10") + resp("FLUSHDB") +
      resp("NOSUCH") + resp("QUIT"))
SEEDS["resp_gw"] = {
    "commands": u8(0) + gw,
    "sync-fails": u8(1) + resp("SET", "k", "v") + resp("GET", "k") + resp("MSET", "a", "b"),
    "inline": u8(0) + b"SET k v\r\nGET k\r\nMGET k k k\r\n",
    "big-mget": u8(0) + resp("SET", "big", "x" * 3000) + resp("MGET", *(["big"] * 4)),
    "bad": u8(0) + b"*2\r\n$3\r\nGET\r\n+oops\r\n",
    "introspection": u8(0) + resp("COMMAND") + resp("COMMAND", "INFO", "get", "nope") +
    resp("COMMAND", "DOCS", "set") + resp("COMMAND", "LIST") + resp("COMMAND", "HELP") +
    resp("CLIENT", "SETNAME", "me") + resp("CLIENT", "LIST", "ID", "1", "2") +
    resp("CLIENT", "INFO") + resp("CLIENT", "KILL", "ID", "2") +
    resp("CLIENT", "KILL", "ADDR", "?", "SKIPME", "no") + resp("CLIENT", "KILL", "1.2.3.4:5") +
    resp("HELLO", "2", "SETNAME", "y") + resp("HELLO", "3") + resp("CLIENT", "HELP"),
    "expiry-keys": u8(0) + resp("SET", "k", "v", "EX", "100", "GET") + resp("TTL", "k") +
    resp("PEXPIRE", "k", "5", "LT") + resp("EXPIRE", "k", "-1") + resp("SETEX", "s", "9", "v") +
    resp("PSETEX", "p", "1", "v") + resp("GETEX", "s", "PX", "20") + resp("PERSIST", "s") +
    resp("SET", "s", "w", "KEEPTTL") + resp("EXPIREAT", "s", "1") + resp("PTTL", "s") +
    resp("APPEND", "a", "xy") + resp("SETRANGE", "a", "9", "z") + resp("GETRANGE", "a", "-3", "-1") +
    resp("STRLEN", "a") + resp("RENAME", "a", "b") + resp("RENAMENX", "b", "c") +
    resp("MSETNX", "d", "1", "e", "2") + resp("TYPE", "d") + resp("GETDEL", "d") +
    resp("UNLINK", "e") + resp("SCAN", "0", "MATCH", "[a-c]*", "COUNT", "5", "TYPE", "string") +
    resp("KEYS", "*b\\?[^x]*") + resp("RANDOMKEY"),
}

# Collections (the gateway has a collection engine): lists, hashes, sets,
# sorted sets, and the key commands across them and strings.
SEEDS["resp_gw"].update({
    "coll-lists": u8(0) + resp("RPUSH", "l", "a", "b", "c", "d", "e") + resp("LPUSH", "l", "z", "y") +
    resp("LPOP", "l", "2") + resp("RPOP", "l", "1") + resp("LRANGE", "l", "0", "-1") +
    resp("LINSERT", "l", "BEFORE", "c", "x") + resp("LINSERT", "l", "AFTER", "nope", "q") +
    resp("LREM", "l", "-1", "x") + resp("LREM", "l", "0", "a") + resp("LSET", "l", "0", "first") +
    resp("LINDEX", "l", "-1") + resp("LTRIM", "l", "0", "2") + resp("LMOVE", "l", "m", "LEFT", "RIGHT") +
    resp("LMOVE", "m", "m", "RIGHT", "LEFT") + resp("RPOPLPUSH", "l", "m") + resp("LLEN", "m") +
    resp("LPUSHX", "nope", "v") + resp("RPUSHX", "m", "w") + resp("LRANGE", "m", "-100", "100") +
    resp("LPOP", "m", "0") + resp("RPOP", "m", "10") + resp("TYPE", "m"),
    "coll-hashes": u8(0) + resp("HSET", "h", "f1", "v1", "f2", "v2") + resp("HSETNX", "h", "f1", "x") +
    resp("HGET", "h", "f1") + resp("HMGET", "h", "f1", "nope") + resp("HINCRBY", "h", "n", "5") +
    resp("HINCRBYFLOAT", "h", "fl", "1.5") + resp("HINCRBYFLOAT", "h", "fl", "-0.25e1") +
    resp("HINCRBYFLOAT", "h", "f1", "1") + resp("HINCRBYFLOAT", "h", "fl", "inf") +
    resp("HSTRLEN", "h", "f2") + resp("HEXISTS", "h", "f2") + resp("HLEN", "h") +
    resp("HGETALL", "h") + resp("HKEYS", "h") + resp("HVALS", "h") +
    resp("HSCAN", "h", "0", "MATCH", "f*", "COUNT", "2") + resp("HMSET", "h", "a", "1") +
    resp("HDEL", "h", "f1", "f2", "nope") + resp("HDEL", "h", "n", "fl", "a") + resp("EXISTS", "h"),
    "coll-sets": u8(0) + resp("SADD", "s", "a", "b", "c", "d", "e") + resp("SADD", "t", "c", "d", "e", "f") +
    resp("SISMEMBER", "s", "a") + resp("SMISMEMBER", "s", "a", "z") + resp("SCARD", "s") +
    resp("SMEMBERS", "t") + resp("SPOP", "s", "2") + resp("SRANDMEMBER", "t", "-5") +
    resp("SRANDMEMBER", "t", "3") + resp("SINTER", "s", "t") + resp("SUNION", "s", "t") +
    resp("SDIFF", "s", "t") + resp("SINTERSTORE", "d", "s", "t") + resp("SUNIONSTORE", "u", "s", "t", "nope") +
    resp("SDIFFSTORE", "x", "t", "s") + resp("SINTERSTORE", "t", "t", "nope") + resp("SMOVE", "u", "s", "f") +
    resp("SSCAN", "u", "0", "COUNT", "1") + resp("SREM", "s", "a") + resp("SPOP", "u") + resp("SPOP", "u", "100"),
    "coll-zsets": u8(0) + resp("ZADD", "z", "1", "a", "2", "b", "3", "c") + resp("ZADD", "z", "NX", "5", "a", "6", "d") +
    resp("ZADD", "z", "GT", "CH", "0", "a", "10", "b") + resp("ZADD", "z", "INCR", "2.5", "c") +
    resp("ZADD", "z", "XX", "LT", "1", "d") + resp("ZADD", "z", "-inf", "lo", "+inf", "hi") +
    resp("ZADD", "z", "NX", "XX", "1", "a") + resp("ZADD", "z", "nan", "a") +
    resp("ZINCRBY", "z", "1", "a") + resp("ZSCORE", "z", "a") + resp("ZMSCORE", "z", "a", "nope") +
    resp("ZCARD", "z") + resp("ZRANK", "z", "b") + resp("ZREVRANK", "z", "b") +
    resp("ZCOUNT", "z", "(1", "+inf") + resp("ZRANGE", "z", "0", "-1", "WITHSCORES") +
    resp("ZRANGE", "z", "+inf", "(1", "BYSCORE", "REV", "LIMIT", "0", "2", "WITHSCORES") +
    resp("ZRANGEBYSCORE", "z", "-inf", "5", "LIMIT", "1", "1") + resp("ZREVRANGEBYSCORE", "z", "10", "0") +
    resp("ZREVRANGE", "z", "0", "1") + resp("ZPOPMAX", "z", "2") + resp("ZPOPMIN", "z") +
    resp("ZSCAN", "z", "0", "MATCH", "*", "COUNT", "10") + resp("ZREMRANGEBYRANK", "z", "0", "0") +
    resp("ZREMRANGEBYSCORE", "z", "-inf", "2") + resp("ZREM", "z", "hi", "nope") + resp("ZPOPMAX", "z", "100"),
    "coll-keys": u8(0) + resp("RPUSH", "l", "a") + resp("HSET", "h", "f", "v") + resp("SADD", "s", "m") +
    resp("ZADD", "z", "1", "m") + resp("SET", "str", "v") + resp("TYPE", "l") + resp("TYPE", "h") +
    resp("TYPE", "s") + resp("TYPE", "z") + resp("TYPE", "str") + resp("SCAN", "0", "TYPE", "list") +
    resp("SCAN", "0", "TYPE", "zset", "COUNT", "100") + resp("SCAN", "0", "MATCH", "*") + resp("KEYS", "*") +
    resp("EXISTS", "l", "h", "s", "z", "str") + resp("DBSIZE") + resp("RENAME", "l", "l2") +
    resp("RENAME", "h", "s") + resp("RENAMENX", "z", "str") + resp("RENAME", "str", "z") +
    resp("EXPIRE", "s", "100") + resp("TTL", "s") + resp("PEXPIRE", "l2", "1") + resp("PERSIST", "s") +
    resp("EXPIRE", "s", "0") + resp("TYPE", "s") + resp("DEL", "l2", "s", "z", "str") +
    resp("HSET", "h2", "f", "v") + resp("SET", "h2", "over") + resp("GET", "h2") + resp("LPUSH", "h2", "x") +
    resp("SADD", "s2", "m") + resp("GET", "s2") + resp("RANDOMKEY") + resp("UNLINK", "s2") + resp("FLUSHDB") +
    resp("DBSIZE"),
    "coll-set-over-list": u8(0) + resp("RPUSH", "k", "a", "b", "c") + resp("SET", "k", "v") + resp("TYPE", "k") +
    resp("LRANGE", "k", "0", "-1") + resp("GET", "k") + resp("LPUSH", "k", "x") + resp("RPUSH", "k2", "a") +
    resp("MSET", "k2", "1", "k3", "2") + resp("RPUSH", "k4", "a") + resp("APPEND", "k4", "z") +
    resp("GETDEL", "k4") + resp("INCR", "k4") + resp("RPUSH", "k5", "a") + resp("SET", "k5", "v", "NX") +
    resp("SET", "k5", "v", "XX", "GET") + resp("MSETNX", "k5", "1") + resp("SETEX", "k5", "10", "v") +
    resp("RENAME", "k2", "k5") + resp("TYPE", "k5"),
    "coll-sync-fails": u8(1) + resp("RPUSH", "l", "a", "b") + resp("LPOP", "l") + resp("HSET", "h", "f", "v") +
    resp("SADD", "s", "m") + resp("ZADD", "z", "1", "m") + resp("DEL", "l") + resp("SET", "h", "v"),
    "coll-big": u8(0) + resp("RPUSH", "big", *(["x" * 1500] * 4)) + resp("LRANGE", "big", "0", "-1") +
    resp("HSET", "bh", "f", "y" * 3000, "g", "y" * 3000) + resp("HGETALL", "bh") +
    resp("SADD", "bs", *[str(i) for i in range(300)]) + resp("SMEMBERS", "bs") +
    resp("SPOP", "bs", "250") + resp("ZADD", "bz", *sum(([str(i), "m%d" % i] for i in range(200)), [])) +
    resp("ZRANGE", "bz", "0", "-1", "WITHSCORES") + resp("ZRANGE", "bz", "(5", "150", "BYSCORE", "LIMIT", "10", "-1"),
})

# fuzz_select: uri buffer size - 1, policy length, policy, advertisement
# ("@=" stands for this host's node id).
ads = b"shm://tern-a@=;ntb://emu:dev@=;rdma://soft:127.0.0.1:5@=;tcp://127.0.0.1:9@other;"
SEEDS["select"] = {
    "all": u8(127) + u8(0) + ads,
    "policy": u8(127) + u8(7) + b"ntb,shm" + ads,
    "short-uri": u8(4) + u8(3) + b"shm" + ads,
    "foreign": u8(127) + u8(0) + b"shm://x@elsewhere;ntb://hw@=",
}

# fuzz_addr: the text itself.
SEEDS["addr"] = {
    "v4": b"127.0.0.1:8080", "v6": b"[::1]:443", "any": b":0", "uri": b"tcp://127.0.0.1:1",
    "ntb": b"ntb://emu:dev/1", "rdma": b"rdma://soft:10.0.0.1:7", "noport": b"host:",
}

# fuzz_pool: flags (1 header sum, 2 segment sums, 4 record sums, 8 resize
# by the i16 that follows), then patches: where (0: header, 1..6: segment,
# 0xff: any offset as u32), offset u16, length byte (1 + n % 32), bytes.
SEEDS["pool"] = {
    "as-made": u8(0),
    "layout-4": u8(1) + u8(0) + u16(8) + u8(3) + u32(4),
    "seg-seq": u8(3) + u8(1) + u16(0) + u8(7) + u64(99),
    "record": u8(7) + u8(1) + u16(64 + 8) + u8(3) + u32(0x10000000),
    "truncated": u8(8) + u16(0x10000 - 4096),
    "key-len": u8(7) + u8(2) + u16(64 + 16) + u8(1) + u16(2000),
}


# fuzz_tcp_wire: flags (bits 0-1 puts, 2-3 gets, 4-5 views held), records.
def tcp_msg(body): return u8(1) + u16(len(body)) + body
def tcp_put_real(data, off=0): return u8(0x82) + u16(len(data)) + u16(off) + data
def tcp_get_real(n, off=0): return u8(0x83) + u16(n) + u16(off)
def tcp_ack(status): return u8(4) + u32(status)
def tcp_get_resp(data): return u8(5) + u32(0) + u16(len(data)) + data


SEEDS["tcp_wire"] = {
    "msgs": u8(0x10) + tcp_msg(b"hello") + tcp_msg(b"x" * 300) + tcp_msg(b""),
    "onesided": u8(0) + tcp_put_real(b"data" * 4, 8) + tcp_get_real(64, 16),
    "answers": u8(0x05) + tcp_ack(0) + tcp_get_resp(b"\0" * 8),
    "bad-key": u8(0) + u8(2) + u16(4) + u32(12345) + u16(0) + b"abcd",
    "raw": u8(0) + u8(0) + u8(8) + u16(0x7e72) + u8(1) + u8(9) + u32(0),
}


# fuzz_rdma_wire: flags (bit 0: the hello from the input), operations.
def rd_write(off, data, imm=0): return u8(0) + u16(len(data)) + u32(imm) + u16(off) + data
def rd_record(data, imm=0): return u8(1) + u16(len(data)) + u32(imm) + data
def rd_send_imm(imm): return u8(2) + u32(imm)
def rd_send(n): return u8(3) + u8(n)
def rd_win(write, n, off, xor=None):
    return u8(4 if write else 5) + (u8(1) + u32(xor) if xor is not None else u8(0)) + u16(n) + u16(off)


SEEDS["rdma_wire"] = {
    "records": u8(0) + rd_record(b"hello") + rd_record(b"x" * 300) + rd_record(b"") +
               rd_send_imm(0),
    "window": u8(0) + rd_win(True, 64, 0) + rd_win(False, 64, 8) + rd_win(False, 16, 0, 0x100),
    "too-long": u8(0) + rd_record(b"y" * 4200),
    "misplaced": u8(0) + rd_write(100, b"\x10\0\0\0\x4d\0\0\0" + b"z" * 16) + rd_send(8),
    "crossed-keys": u8(0) + u8(6) + u8(0) + u8(6) + u8(1),
    "hello": u8(1) + u32(0x4d445274) + u16(2) + u8(12) + u8(1) + u64(4096) + u32(0) + u32(4096),
}


# fuzz_etcd_answer: a reader (0 range, 1 txn, 2 lease, 3 delete, 4 header,
# 5 error), then etcd's answer as its JSON gateway writes it.
SEEDS["etcd_answer"] = {
    "range": u8(0) + b'{"header":{"cluster_id":"14841639068965178418","member_id":"10276657743932975437",'
                     b'"revision":"7","raft_term":"2"},"kvs":[{"key":"L3QvYQ==","create_revision":"5",'
                     b'"mod_revision":"6","version":"2","value":"b25l","lease":"7587861564383592459"},'
                     b'{"key":"L3QvYw==","create_revision":"7","mod_revision":"7","version":"1"}],"count":"2"}',
    "range-empty": u8(0) + b'{"header":{"revision":"3"}}',
    "txn-lost": u8(1) + b'{"header":{"revision":"9"},"responses":[{"response_range":{"header":{"revision":"9"},'
                        b'"kvs":[{"key":"L2UvcHJpbWFyeQ==","create_revision":"8","mod_revision":"8",'
                        b'"version":"1","value":"bm9kZS1h","lease":"1"}],"count":"1"}}]}',
    "txn-won": u8(1) + b'{"header":{"revision":"10"},"succeeded":true,"responses":[{"response_put":{"header":{"revision":"10"}}}]}',
    "grant": u8(2) + b'{"header":{"revision":"4"},"ID":"7587861564383592459","TTL":"5"}',
    "keepalive": u8(2) + b'{"result":{"header":{"revision":"4"},"ID":"7587861564383592459","TTL":"5"}}',
    "keepalive-gone": u8(2) + b'{"result":{"header":{"revision":"4"},"ID":"7587861564383592459"}}',
    "delete": u8(3) + b'{"header":{"revision":"12"},"deleted":"3"}',
    "put": u8(4) + b'{"header":{"cluster_id":"1","member_id":"2","revision":"13","raft_term":"2"}}',
    "error": u8(5) + b'{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}',
    "map": u8(6) + b'{"id":"kv-0","epoch":3,"primary":"b","replicas":["a","b","c"]}',
    "map-new": u8(6) + b'{"id":"doc-main","epoch":0,"primary":"","replicas":["r1h1"]}',
    "node": u8(7) + b'{"node":"a","rack":"r1","pid":1,"services":["kv"],"listen":["shm://x","tcp://10.0.0.1:7300"]}',
    "stream-error": u8(5) + b'{"error":{"grpc_code":5,"http_code":404,"message":"etcdserver: requested lease not found","http_status":"Not Found"}}',
}


# fuzz_rpc_server: flags (bit 0: a small receive window), records.
def hello(credits=4, max_msg=4096): return u8(0) + u8(credits) + u16(max_msg)
def hello_token(token): return u8(0x10) + u8(4) + u16(4096) + u8(token)
def req(method, body, req_id=1): return u8(1) + u8(method) + u8(req_id) + u16(len(body)) + body
def req_resent(method, body, req_id): return u8(0x41) + u8(method) + u16(1) + u8(req_id) + u16(len(body)) + body


SEEDS["rpc_server"] = {
    "echo": u8(0) + hello() + req(1, b"ping") + req(2, u16(3000)) + req(3, b"x") + req(4, b"") + req(5, b"") + req(6, b"abc"),
    "replay": u8(0) + hello_token(1) + req(1, b"a", 5) + req_resent(1, b"a", 5) + req_resent(1, b"b", 6),
    "no-hello": u8(0) + req(1, b"ping"),
    "hello-twice": u8(0) + hello() + hello(),
    "backlog": u8(1) + hello() + b"".join(req(2, u16(4000), i) for i in range(20)),
    "short": u8(0) + hello() + u8(3) + u8(5) + b"\x03\x01\x07\x00\x01",
}


# fuzz_rpc_client: flags (bits 0-3 calls, 4 cancel the first, 7 token),
# records sent before the calls, records.
def ack(credits=8, max_msg=4096, ads=b""): return u8(0) + u8(credits) + u16(max_msg) + u8(0) + u8(len(ads)) + ads
def reply(pick, body, status_bits=0): return u8(0x41 | (status_bits << 2)) + u8(pick) + u16(7) + u16(0) + u16(len(body)) + body


SEEDS["rpc_client"] = {
    "calls": u8(4) + u8(1) + ack() + reply(0, b"one") + reply(1, b"two") + reply(2, b"", 1) + reply(3, b"four"),
    "ads": u8(0x82) + u8(1) + ack(ads=b"shm://tern-x@node;ntb://emu:d@node;") + reply(0, b"ok"),
    "cancel": u8(0x12) + u8(1) + ack() + reply(0, b"late") + reply(1, b"ok"),
    "no-ack": u8(2) + u8(0) + reply(0, b"early"),
    "twice": u8(1) + u8(1) + ack() + ack() + reply(0, b"x"),
}


# fuzz_kv_service: ops of (op, method % 12) and the method's fields.
def kv_key(k): return u8(k)                       # alphabet key, 1-4 letters
def kv_put(k, val): return u8(0) + u8(2) + u16(len(val)) + kv_key(k) + val
def kv_get(k): return u8(0) + u8(1) + kv_key(k)
def kv_del(k): return u8(0) + u8(3) + kv_key(k)
def kv_mget(*ks): return u8(0) + u8(4) + u8(len(ks)) + b"".join(kv_key(k) for k in ks)
def kv_scan(): return u8(0) + u8(5) + u8(0) + u8(16)
def kv_lease(): return u8(0) + u8(8)
def kv_lessee(k, val, intent=7): return u8(0) + u8(11) + kv_key(k) + u16(len(val)) + u32(intent) + val
def kv_pget(k, cap=4096): return u8(0) + u8(10) + u16(cap) + u16(0) + kv_key(k)


SEEDS["kv_service"] = {
    "basic": kv_put(5, b"value") + kv_get(5) + kv_mget(5, 6, 5) + kv_scan() + kv_del(5) + kv_get(5) + u8(0) + u8(6) + u8(0) + u8(7),
    "lease": kv_lease() + kv_lessee(9, b"leased value") + kv_get(9) + kv_lessee(10, b"second") + kv_pget(10),
    "pget": kv_put(13, b"pushed" * 10) + kv_pget(13) + kv_pget(13, 8),
    "scribble": kv_lease() + kv_lessee(9, b"v") + u8(1) + u8(11) + u16(0) + u8(3) + b"\xff\xff\xff\xff" + kv_get(9),
    "raw": u8(0x80) + u8(1) + u16(8) + u16(1) + u16(0) + u32(0) + b"k",
}


# fuzz_ring: views held, then steps: publish (op 0: channel, kind, kind's
# fields, length, bytes), scribble (op 1), poll (op 2 | n << 2), act (op 3).
def open_chan(ch): return u8(0) + u8(0) + u8(0) + u8(1) + u8(ch) + u16(0)
def msg(ch, body): return u8(0) + u8(ch) + u8(1) + u16(len(body)) + body
def frag(ch, total, off, body): return u8(0) + u8(ch) + u8(2) + u16(total) + u16(off) + u16(8 + len(body)) + body
def polls(n=7): return u8(2 | (n << 2))
def send(conn, n): return u8(3) + u8(conn) + u32(0) + u16(n)


SEEDS["ring"] = {
    "messages": u8(1) + open_chan(1) + polls() + msg(1, b"hello") + msg(1, b"") + polls() + send(0, 100) + polls(),
    "fragments": u8(0) + open_chan(2) + polls() + frag(2, 1500, 0, b"a" * 900) + polls() + frag(2, 1500, 900, b"b" * 600) + polls(),
    "close": u8(0) + open_chan(1) + polls() + u8(0) + u8(0) + u8(0) + u8(2) + u8(1) + u16(0) + polls(),
    "large-send": u8(0) + open_chan(1) + polls() + send(0, 5000) + polls() + polls(),
}


# fuzz_doc_filter: u16 length of the filter, the filter's BSON, the
# document's BSON. A small BSON writer of its own: Python dicts keep their
# order; a tuple is a regex (pattern, options).
class Regex(tuple): pass


def bson_doc(d):
    body = b""
    items = enumerate(d) if isinstance(d, list) else d.items()
    for k, v in items:
        k = str(k).encode() + b"\0"
        if v is None:
            body += b"\x0a" + k
        elif isinstance(v, bool):
            body += b"\x08" + k + u8(int(v))
        elif isinstance(v, int):
            body += b"\x10" + k + u32(v)
        elif isinstance(v, float):
            body += b"\x01" + k + struct.pack("<d", v)
        elif isinstance(v, str):
            e = v.encode()
            body += b"\x02" + k + u32(len(e) + 1) + e + b"\0"
        elif isinstance(v, Regex):
            body += b"\x0b" + k + v[0].encode() + b"\0" + v[1].encode() + b"\0"
        elif isinstance(v, list):
            body += b"\x04" + k + bson_doc(v)
        else:
            body += b"\x03" + k + bson_doc(v)
    return u32(len(body) + 5) + body + b"\0"


def filt(f, d): return u16(len(bson_doc(f))) + bson_doc(f) + bson_doc(d)


SEEDS["doc_filter"] = {
    "eq-array": filt({"a": 5}, {"a": [1, 5]}),
    "range": filt({"a": {"$gt": 1, "$lt": 10}}, {"a": 3}),
    "in-null": filt({"a": {"$in": [1, "x", None]}}, {}),
    "elemmatch-value": filt({"a.b": {"$elemMatch": {"$gte": 2}}}, {"a": [{"b": [1, 2]}]}),
    "or-regex": filt({"$or": [{"a": Regex(("^ab", ""))}, {"b": {"$exists": False}}]}, {"a": "abc"}),
    "type-size": filt({"a": {"$type": "number"}, "b": {"$size": 2}}, {"a": 1.5, "b": [1, 2]}),
    "not-regex": filt({"a": {"$not": {"$regex": "x", "$options": "i"}}}, {"a": "X"}),
    "all-nor": filt({"a": {"$all": [1, 2]}, "$nor": [{"c": None}]}, {"a": [2, 1], "c": 1}),
    "elemmatch-doc": filt({"a": {"$elemMatch": {"b": 1, "c": {"$ne": 2}}}}, {"a": [{"b": 1, "c": 3}]}),
    "positional": filt({"a.0": {"$lte": "z"}, "a.1.b": None}, {"a": ["q", {"c": 1}]}),
    "and-in-regex": filt({"$and": [{"a": {"$in": [Regex(("^x", "")), 2.5]}}, {"a": {"$nin": [3]}}]}, {"a": ["xy", 4]}),
    "eq-doc": filt({"a": {"b": 1, "c": [1, {"d": None}]}}, {"a": {"b": 1, "c": [1, {"d": None}]}}),
}


# fuzz_mongo_wire: limit index, count of read sizes, the sizes, the stream
# of messages. BSON is written by hand here: a few element types suffice.
def bson(*elems):
    body = b"".join(elems)
    return u32(len(body) + 5) + body + b"\0"
def b_int(k, v): return b"\x10" + k.encode() + b"\0" + u32(v)
def b_str(k, v): return b"\x02" + k.encode() + b"\0" + u32(len(v) + 1) + v.encode() + b"\0"
def b_doc(k, d): return b"\x03" + k.encode() + b"\0" + d
def b_arr(k, d): return b"\x04" + k.encode() + b"\0" + d
def mongo(req, op, body): return u32(16 + len(body)) + u32(req) + u32(0) + u32(op) + body
def op_msg(req, flags, *sections): return mongo(req, 2013, u32(flags) + b"".join(sections))
def kind0(d): return u8(0) + d
def kind1(ident, *docs):
    payload = ident.encode() + b"\0" + b"".join(docs)
    return u8(1) + u32(4 + len(payload)) + payload
def op_query(req, ns, q): return mongo(req, 2004, u32(0) + ns.encode() + b"\0" + u32(0) + u32(0xffffffff) + q)


def crc32c(data):
    crc = 0xffffffff
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xffffffff


def with_crc(msg):
    msg = u32(len(msg) + 4) + msg[4:]
    return msg + u32(crc32c(msg))


hello = op_query(1, "admin.$cmd", bson(b_int("isMaster", 1), b_doc("client", bson(b_str("app", "x")))))
ping = op_msg(2, 0, kind0(bson(b_int("ping", 1), b_str("$db", "admin"))))
insert = op_msg(3, 0, kind0(bson(b_str("insert", "c"), b_str("$db", "test"))),
                kind1("documents", bson(b_int("_id", 1), b_str("v", "one")), bson(b_int("_id", 2))))
update = op_msg(4, 0x10000, kind1("updates", bson(b_doc("q", bson(b_int("_id", 1))),
                                                 b_doc("u", bson(b_doc("$set", bson(b_int("a", 2))))))),
                kind0(bson(b_str("update", "c"), b_str("$db", "test"))))
deep = bson(b_int("x", 1))
for _ in range(50):
    deep = bson(b_doc("a", deep), b_arr("l", bson(b_int("0", 1))))
SEEDS["mongo_wire"] = {
    "handshake": u8(0) + u8(0) + hello + ping,
    "insert": u8(0) + u8(3) + bytes([1, 17, 5]) + insert + update,
    "checksum": u8(0) + u8(0) + with_crc(op_msg(5, 1, kind0(bson(b_int("ping", 1))))),
    "more-to-come": u8(0) + u8(0) + op_msg(6, 2, kind0(bson(b_str("insert", "c")))) + ping,
    "deep": u8(6) + u8(0) + op_msg(7, 0, kind0(bson(b_int("find", 1), b_doc("filter", deep)))),
    "limit": u8(4) + u8(2) + bytes([9, 30]) + ping + insert,
    "bad-length": u8(0) + u8(0) + ping + u32(10) + u32(8) + u32(0) + u32(2013),
}

# fuzz_mongo_gw: flags (bit 0: the group commit fails, bit 1: a small
# output cap), the client's bytes.
write = op_msg(8, 0, kind0(bson(b_str("write", "c"), b_str("$db", "test"))),
               kind1("documents", bson(b_int("_id", 1))))
SEEDS["mongo_gw"] = {
    "session": u8(0) + hello + ping + insert + write + update + ping,
    "sync-fails": u8(1) + ping + write + ping + write,
    "small-output": u8(2) + ping * 20,
    "more-to-come": u8(0) + op_msg(6, 2, kind0(bson(b_str("write", "c")))) + ping,
    "bad": u8(0) + ping + op_msg(9, 4, kind0(bson(b_int("ping", 1)))) + ping + u32(5) + u32(1) + u32(0) + u32(2013),
}
# ... and with bit 2, MongoDB's commands through the real command layer.
def cmd(req, *elems, seq=None):
    secs = [kind0(bson(*elems, b_str("$db", "test")))]
    if seq:
        secs.append(kind1(*seq))
    return op_msg(req, 0, *secs)


def b_array(k, *docs): return b_arr(k, bson(*[b_doc(str(i), d) for i, d in enumerate(docs)]))


crud = (hello +
        cmd(10, b_str("insert", "c"), seq=("documents", bson(b_int("_id", 1), b_int("a", 5)),
                                            bson(b_int("_id", 2), b_str("s", "x")))) +
        cmd(11, b_str("find", "c"), b_doc("filter", bson(b_doc("a", bson(b_int("$gt", 1))))),
            b_doc("sort", bson(b_int("a", -1))), b_int("batchSize", 1)) +
        cmd(12, b_str("update", "c"), seq=("updates", bson(b_doc("q", bson(b_int("_id", 1))),
                                                          b_doc("u", bson(b_doc("$inc", bson(b_int("a", 1)))))))) +
        cmd(13, b_str("aggregate", "c"), b_array("pipeline", bson(b_doc("$match", bson())),
                                                    bson(b_doc("$group", bson(b_int("_id", 1), b_doc("n", bson(b_int("$sum", 1))))))),
            b_doc("cursor", bson())) +
        cmd(14, b_str("createIndexes", "c"), b_array("indexes", bson(b_doc("key", bson(b_int("a", 1))), b_str("name", "a_1")))) +
        cmd(15, b_str("delete", "c"), seq=("deletes", bson(b_doc("q", bson()), b_int("limit", 0)))) +
        cmd(16, b_int("listCollections", 1)) + cmd(17, b_str("count", "c")) + cmd(18, b_int("nosuch", 1)))
SEEDS["mongo_gw"]["real-crud"] = u8(4) + crud
# Awaitable hellos: waiting, streamed with exhaustAllowed (0x10000), and
# through the command layer (another process's topologyVersion: answered
# at once, then streamed).
def aw_hello(req, flags, *elems): return op_msg(req, flags, kind0(bson(b_int("hello", 1), *elems)))
def b_i64(k, v): return b"\x12" + k.encode() + b"\0" + u64(v)
def b_oid(k, v): return b"\x07" + k.encode() + b"\0" + v
SEEDS["mongo_gw"]["await"] = u8(0) + aw_hello(20, 0, b_int("maxAwaitTimeMS", 30), b_int("current", 1)) + ping
SEEDS["mongo_gw"]["stream"] = u8(0) + aw_hello(21, 0x10000, b_int("maxAwaitTimeMS", 5), b_int("current", 1)) + ping
SEEDS["mongo_gw"]["stream-stale"] = u8(2) + aw_hello(22, 0x10000, b_int("maxAwaitTimeMS", 0))
SEEDS["mongo_gw"]["real-stream"] = u8(4) + op_msg(23, 0x10000, kind0(bson(
    b_int("ismaster", 1), b_doc("topologyVersion", bson(b_oid("processId", bytes(range(12))), b_i64("counter", 0))),
    b_int("maxAwaitTimeMS", 20), b_str("$db", "admin"))))
SEEDS["mongo_gw"]["real-getmore"] = u8(4) + crud[:-len(cmd(18, b_int("nosuch", 1)))] + \
    cmd(19, b_str("find", "c"), b_int("batchSize", 0))


# ---- block: blocks of the block-sync service (services/blocksync/bs_block.h)
import hashlib


def _sha(b): return hashlib.sha256(b).digest()


def _merkle(txs):
    if not txs:
        return _sha(b"")
    lvl = [_sha(b"\x00" + t) for t in txs]
    while len(lvl) > 1:
        nxt = [_sha(b"\x01" + lvl[i] + lvl[i + 1]) for i in range(0, len(lvl) - 1, 2)]
        if len(lvl) % 2:
            nxt.append(lvl[-1])
        lvl = nxt
    return lvl[0]


def block(height, parent, txs, chain=7):
    body = b"".join(u32(len(t)) + t for t in txs)
    return (b"TBLK" + u32(1) + u64(height) + u64(1000 * height) + parent + _merkle(txs) +
            u32(len(txs)) + u32(len(body)) + u64(chain) + bytes(8) + body)


SEEDS["block"] = {
    "empty": block(0, bytes(32), []),
    "one": block(1, bytes(range(32)), [b"tx"]),
    "eos-like": block(2, bytes(32), [bytes([i]) * 170 for i in range(25)]),
    "odd-five": block(3, bytes(32), [b"a" * i for i in range(5)]),
}

# ---- bs_wire: the block-sync messages and log spans (services/blocksync/bs_wire.h)
def hello(head=3, lib=2, node=9, chain=7):
    return (u32(1) + u32(0) + u64(chain) + u64(node) + u64(head) + u64(lib) +
            bytes([1]) * 32 + bytes([2]) * 32 + bytes([3]) * 32)


def record(h, blk):
    rec = u32(0x31524254) + u32(len(blk)) + u64(h) + u64(0) + u64(0) + blk
    return rec + bytes(-len(rec) % 64)


_b0 = block(0, bytes(32), [b"genesis"])
_b1 = block(1, _sha(_b0[:112]), [b"a" * 170, b"b" * 120])
_span = record(0, _b0) + record(1, _b1)
SEEDS["bs_wire"] = {
    "hello": u8(0) + hello(),
    "hello-rep": u8(1) + u32(0) + u32(0) + hello(),
    "hello-refused": u8(1) + u32(3) + u32(0) + hello(),
    "headers-req": u8(2) + u64(5) + u32(100) + u32(0),
    "headers-rep": u8(3) + u64(0) + u32(2) + u32(0) + _b0[:112] + _b1[:112],
    "range-req": u8(4) + u64(0) + u64(2) + u64(0) + u32(1 << 20) + u32(0) + u64(0) + bytes(24),
    "range-req-put": u8(4) + u64(0) + u64(2) + u64(0) + u32(4096) + u32(1) + u64(64) +
                     u64(0x1000) + u64(8192) + u32(5) + u32(2),
    "range-rep": u8(5) + u64(len(_span)) + u64(0) + u32(len(_span)) + u32(0) + _span,
    "range-rep-put": u8(5) + u64(4096) + u64(64) + u32(128) + u32(1),
    "span": u8(13) + u64(0) + u16(2) + _span,
    "subscribe": u8(9) + u32(0) + u32(1) + u64(5) + bytes(32),
    "subscribe-rep": u8(10) + u32(0) + u32(0) + u64(1) + u64(5) + u64(9),
    "feed": u8(11) + u64(1) + u64(5) + u32(16) + u32(65536) + bytes(32),
    "feed-rep": u8(12) + u64(3) + u64(1) + u32(2) + u32(0) + u32(0) + u32(0) +
                u32(len(_b1)) + _b1 + u32(len(_b1)) + _b1,
    "feed-rep-headers": u8(12) + u64(3) + u64(1) + u32(2) + u32(1) + u32(0) + u32(0) +
                        _b0[:112] + _b1[:112],
    "append": u8(6) + u64(0) + u32(0) + u32(0) + _b0,
    "append-rep": u8(7) + u32(0) + u32(0) + u64(5) + bytes(32),
    "info": u8(8) + u64(7) + u64(9) + u64(10) + u64(8) + bytes(32) + u64(100) + u64(1000) +
            u64(64) + u32(2) + u32(0),
}

# ---- chain_file: edits of a sound chain file (tests/fuzz/fuzz_chain_file.c)
def patch(where, at, data, wide=False):
    return u8(where) + (u32(at) if where % 4 >= 2 else u16(at)) + u8(len(data)) + data


SEEDS["chain_file"] = {
    "as-is": u8(0),
    "committed-word": u8(1) + patch(0, 256, u64(43)),
    "committed-past-index": u8(1) + patch(0, 256, u64(1000)),
    "irreversible-past": u8(1) + patch(0, 320, u64(41)),
    "entry-offset": u8(2) + patch(1, 64 * 7, u64(12345)),
    "entry-height": u8(2) + patch(1, 64 * 9 + 48, u64(3)),
    "record-len": u8(4) + patch(2, 64 + 4, u32(1 << 30)),
    "record-body": u8(4) + patch(2, 300, b"\xff" * 16),
    "cut-short": u8(8) + u16(0x10000 - 9000),
}


# ---- ternd_conf: ternd's configuration file (tests/fuzz/fuzz_ternd_conf.c)
_example = open(os.path.join(os.path.dirname(__file__), "..", "..", "tools", "ternd",
                             "ternd.conf"), "rb").read()
SEEDS["ternd_conf"] = {
    "example": _example,
    "every-section": b"[node]\nname = a\nrack = r\nlisten = tcp://127.0.0.1:0\nlisten = shm://x\n"
                     b"log_file = /tmp/x.log\n[kv]\npool_size = 4m\nseg_size = 64k\n"
                     b"range = 1:2\nresp_port = off\n[doc]\nenabled = no\n[chain]\n"
                     b"enabled = yes\npeer = tcp://b:1\nworkers = 2\nfault = stall\n"
                     b"[policy]\nsame_rack = shm,ntb\nsubnet = 10.0.0.0/8 rdma\n"
                     b"[peer b]\naddress = tcp://b:1\nrack = r\n",
    "twice": b"[node]\nname = a\nname = b\n",
    "unclosed": b"[node\nname = a\n",
    "continued": b"[node]\nname = a\n  b\n",
    "inline-comment": b"[node]\nname = a ; b\nlisten =;tcp://x:1\n",
}


# ---- node_status: a node's STATUS reply (tests/fuzz/fuzz_node_status.c)
SEEDS["node_status"] = {
    "two-peers": b'{"node":"a","rack":"r1","uptime_s":12.5,"pid":42,"version":"0.1.0",'
                 b'"services":["kv","doc"],"listen":["tcp://127.0.0.1:7300"],"peers":['
                 b'{"node":"b","rack":"r1","address":"tcp://10.0.0.2:7300","state":"up",'
                 b'"fabric":"ntb","policy":"ntb,tcp","calls":100,"calls_per_s":5.0,'
                 b'"errors":0,"bytes":6400,"failovers":1,"moves":1,"credits":32,'
                 b'"rtt_us":12.5,"standby":true,"last_error":null},'
                 b'{"node":"c","rack":"r2","state":"down","fabric":null,"last_error":"refused"}]}',
    "replicated": b'{"node":"a","services":["kv"],"replication":{"shard":"kv0","state":"primary",'
                  b'"epoch":3,"position":"30000000010","committed":"3000000000f","held":2,'
                  b'"replicas":[{"node":"b","state":"streaming","position":"3000000000f","lag":1},'
                  b'{"node":"c","state":"needs copy","position":"0","lag":0}]},"peers":[]}',
    "wrong-types": b'{"node":1,"services":{"a":1},"peers":[1,"x",{"calls":"many"}]}',
    "not-object": b'[1,2,3]',
    "nul-inside": b'{"node":"a\x00b"}',
}



# ---- repl: a backup's replication messages (tests/fuzz/fuzz_repl.c). An op
# is kind, epoch pick (0 older, 1 seen, 2 newer), then what the kind builds;
# an APPEND is n, shard pick, then per record: key byte, type, value length,
# the value, the version step.
def rec(key, typ, val, step): return u8(key) + u8(typ) + u8(len(val)) + val + u8(step)
def append(epoch_pick, recs): return u8(1) + u8(epoch_pick) + u8(len(recs)) + u8(1) + b"".join(recs)
SEEDS["repl"] = {
    "state": b"\xff" + b"tern-repl 1\nshard s1\nepoch 5\ncopying 0\n",
    "appends": append(1, [rec(1, 1, b"one", 0), rec(2, 1, b"two", 1), rec(1, 2, b"", 0)]) +
               append(2, [rec(3, 1, b"three", 0)]) + append(0, [rec(4, 1, b"stale", 0)]),
    "ask": u8(4) + u8(2) + u8(5) + u8(1) + u8(0) + u16(4096) + u8(1),
    "gap": u8(3) + u8(1) + u64(7) + u8(2) + u8(1) + rec(1, 1, b"x", 0) + rec(2, 1, b"y", 0),
    "expiring": append(1, [rec(1, 7, u64(1) + b"gone", 0), rec(2, 7, u64(1 << 62) + b"stays", 1),
                           rec(3, 7, b"short", 0), rec(1, 5, b"", 0)]),
}


# ---- coll_file: the collection pool's records (tests/fuzz/fuzz_coll_file.c).
# An op is kind | m << 3, then its fields; GEN 0x80 is a fresh generation,
# 0..0x7f head i's; SEQ 0x78 is 0, 0xf5 the last one + 1; SCORE 6 is no
# value, 7 a VALUE, >= 10 (that - 136) / 4.
def ck(k): return u8(len(k)) + k
def cv(v): return (u8(len(v)) if len(v) < 255 else u8(0xff) + u16(len(v))) + v
def c_head(key, t, gen=0x80, dl=0, m=0): return u8(m << 3) + ck(key) + u8(ord(t) if isinstance(t, str) else t) + u8(gen) + u8(dl)
def c_list(gen, seq, v): return u8(1) + u8(gen) + u8(seq) + cv(v)
def c_mem(gen, suffix, score, extra=b""): return u8(2) + u8(gen) + ck(suffix) + u8(score) + extra
def c_run(gen, count, seq, step, vlen): return u8(3) + u8(gen) + u8(count - 1) + u8(seq) + u8(step) + u8(vlen)
def c_mems(gen, count, score): return u8(4) + u8(gen) + u8(count - 1) + u8(score)
def c_del(h): return u8(5) + u8(h)
def c_raw(k, v): return u8(6) + u8(len(k)) + k + cv(v)
def c_rewrite(h, v): return u8(7) + u8(h) + cv(v)


SEEDS["coll_file"] = {
    "list": c_head(b"L", "l") + c_list(0, 0x78, b"a") + c_list(0, 0xf5, b"b") + c_list(0, 0xf5, b"c") +
            c_run(0, 5, 0xf5, 1, 3),
    "hash": c_head(b"H", "h") + c_mem(0, b"f1", 7, cv(b"v1")) + c_mem(0, b"f2", 7, cv(b"")) +
            c_mem(0, b"f3", 6) + c_rewrite(1, b"v1 again"),
    "set": c_head(b"S", "s") + c_mem(0, b"a", 6) + c_mem(0, b"b", 6) + c_mems(0, 10, 6),
    "zset": c_head(b"Z", "z") + c_mem(0, b"x", 16) + c_mem(0, b"y", 140) + c_mem(0, b"w", 140) +
            c_mem(0, b"inf", 2) + c_mem(0, b"-inf", 3) + c_mem(0, b"neg0", 4) + c_mem(0, b"zero", 136) +
            c_mems(0, 8, 130),
    "all-four": c_head(b"l", "l", dl=0x10) + c_head(b"h", "h", dl=0x90) + c_head(b"s", "s") + c_head(b"z", "z") +
                c_run(0, 3, 0x78, 1, 2) + c_mem(1, b"f", 7, cv(b"v")) + c_mem(2, b"m", 6) + c_mem(3, b"m", 150),
    "orphan": c_head(b"L", "l") + c_list(0, 0x78, b"a") + c_list(0xc5, 0x78, b"orphan") +
              c_mem(0xc6, b"m", 6) + c_mem(0x90, b"fresh", 6),
    "gap": c_head(b"L", "l") + c_run(0, 10, 0x78, 2, 4) + c_list(0, 0xf7, b"z"),
    "two-heads": c_head(b"A", "s") + c_head(b"B", "s", gen=0x00) + c_mem(0, b"m", 6) + c_mem(1, b"n", 6),
    "tombstones": c_head(b"L", "l") + c_run(0, 4, 0x78, 1, 1) + c_head(b"S", "s") + c_mem(1, b"m", 6) +
                  c_del(2) + c_del(4) + c_del(0),
    "empty-head": c_head(b"E", "h") + c_head(b"L", "l") + c_list(1, 0x78, b"x"),
    "nan-score": c_head(b"Z", "z") + c_mem(0, b"x", 16) + c_mem(0, b"y", 0),
    "bad-type": c_head(b"Q", "q") + c_head(b"R", "l", m=6) + cv(b"l" + bytes(7) + u64(5) + u64(0)),
    "raw-keys": c_head(b"L", "l") + c_list(0, 0x78, b"a") + c_raw(b"X", b"what") + c_raw(b"M\x01", b""),
    "list-bad-suffix": c_head(b"L", "l") + c_list(0, 0x78, b"a") + c_mem(0, b"short", 6),
    "list-far-apart": c_head(b"L", "l") + c_list(0, 0xf0, b"min") + c_list(0, 0xf3, b"max-1") +
                      c_list(0, 0x78, b""),
    "list-at-int64-max": c_head(b"L", "l") + c_list(0, 0xf1, b"max"),
}

for target, seeds in SEEDS.items():
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)

#!/bin/sh
# rpcbench blocksync catches a small chain up over every fabric, from one
# and two peers, inline and one-sided, and with a staller and a liar among
# the peers; every run ends checked (--verify) with the JSON keys the
# issue names; rpcbench feed delivers every block to every subscriber.
# Not a speed test: the figures are only checked to be there and sane.
set -eu
bench=$1
"$bench" blocksync --help >/dev/null 2>&1 || { echo "SKIP: rpcbench blocksync not built"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/tern-bs-smoke-XXXXXX")
[ -d /dev/shm ] && { rmdir "$dir"; dir=$(mktemp -d /dev/shm/tern-bs-smoke-XXXXXX); }
trap 'rm -rf "$dir"' EXIT
out=$dir/out
err=$dir/err
if ! "$bench" blocksync --fabric all --bytes 16m --peers 1,2 --verify --json --dir "$dir" \
    >"$out" 2>"$err"; then
    echo "rpcbench blocksync failed"; cat "$err" "$out"; exit 1
fi
if ! "$bench" blocksync --fabric tcp --bytes 16m --peers 2 --staller --liar --verify --json \
    --no-ceiling --dir "$dir" >>"$out" 2>"$err"; then
    echo "rpcbench blocksync with a staller and a liar failed"; cat "$err" "$out"; exit 1
fi
if ! "$bench" feed --fabric all --subscribers 6 --slow 1 --rate 20 --seconds 2 --json \
    >"$dir/feed" 2>"$err"; then
    echo "rpcbench feed failed"; cat "$err" "$dir/feed"; exit 1
fi
python3 - "$out" "$dir/feed" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
keys = ["workload", "fabric", "chain", "peers", "blocks", "bytes", "seconds", "gb_per_s",
        "blocks_per_s", "ceiling_gb_per_s", "ceiling_ratio", "client_cpu_s", "server_cpu_s"]
fabrics = set()
for o in rows:
    missing = [k for k in keys if k not in o]
    assert not missing, f"row without {missing}: {o}"
    assert o["workload"] == "blocksync" and o["status"] == "ok" and o["verified"], o
    assert o["blocks"] > 3000 and o["bytes"] >= 16 << 20 and o["gb_per_s"] > 0, o
    fabrics.add(o["fabric"])
    if o["staller"] or o["liar"]:
        assert o["dropped"] in ("stalled", "bad merkle root"), o
    elif o["fabric"] != "tcp" and o["ceiling_gb_per_s"] is None:
        raise AssertionError(f"no copy ceiling: {o}")
assert len(rows) >= 9, f"{len(rows)} rows"
feed = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
assert feed, "no feed rows"
for o in feed:
    assert o["status"] == "ok" and o["lost"] == 0 and o["errors"] == 0, o
    assert o["blocks"] == 40 and o["lag_max_ms"] > 0, o
print(f"rpcbench blocksync smoke: ok ({len(rows)} runs on {sorted(fabrics)}, "
      f"{len(feed)} feed rows)")
PY

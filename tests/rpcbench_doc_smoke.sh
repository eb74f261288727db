#!/bin/sh
# rpcbench doc runs every workload end to end on every fabric, its JSON
# carries the keys of the other workloads plus its own with sane values,
# finds return the documents the index holds, and no pool file is left
# behind. Not a speed test.
set -eu
bench=$1
"$bench" doc --help >/dev/null 2>&1 || { echo "SKIP: rpcbench doc not built"; exit 77; }
out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
ls /dev/shm 2>/dev/null | grep '^rpcbench-doc-' >/dev/null && before=1 || before=0
if ! "$bench" doc --fabric all --workload insert,read,find,update,delete,A,F --records 300 \
    --iters 100 --window 4 --path rpc,onesided --json >"$out" 2>"$err"; then
    echo "rpcbench doc failed"; cat "$err" "$out"; exit 1
fi
python3 - "$out" "$("$bench" doc --help | sed -n 's/^FABRIC: one of \(.*\) (this build.*/\1/p')" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
fabrics = sys.argv[2].split()
keys = ["workload", "fabric", "size", "window", "iters", "p50_ns", "p99_ns", "ops_per_s",
        "mb_per_s", "client_rss_kb", "server_rss_kb", "dist", "records", "persist", "path",
        "server_busy_us_per_op", "batches_inline", "batches_pushed", "docs_found"]
want = {"doc-insert", "doc-read", "doc-find", "doc-update", "doc-delete", "doc-A", "doc-F"}
seen = {}
for o in rows:
    missing = [k for k in keys if k not in o]
    assert not missing, f"row without {missing}: {o}"
    assert o["iters"] == 100 and o["ops_per_s"] > 0, o
    seen.setdefault(o["fabric"].split("-")[0], set()).add(o["workload"])
    if o["workload"] == "doc-find":
        # 300 documents, f1 = id mod 31: about ten per find.
        assert o["docs_found"] >= 9 * 110, o
assert len(seen) == len(fabrics), f"fabrics {sorted(seen)} of {fabrics}"
for f, ws in seen.items():
    assert ws == want, f"{f}: {sorted(ws)}"
print(f"rpcbench doc smoke: ok ({len(rows)} rows, {len(seen)} fabrics)")
PY
if [ $before -eq 0 ] && ls /dev/shm 2>/dev/null | grep '^rpcbench-doc-' >/dev/null; then
    echo "rpcbench doc left pools in /dev/shm"; exit 1
fi

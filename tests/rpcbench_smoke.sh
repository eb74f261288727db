#!/bin/sh
# rpcbench runs end to end and its JSON carries the documented keys with
# sane values. Not a speed test: any positive figures pass.
set -eu
bench=$1
ntb_files() { ls /dev/shm 2>/dev/null | grep -c '^tern-ntb\.' || true; }
ntb_before=$(ntb_files)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$bench" echo --fabric all --size 64,4k --window 1,4 --iters 2000 --json >"$out" 2>/dev/null
# tcp, shm and ntb-emu always; rdma too when built with rdma-core (rdma-emu
# on softverbs, rdma on a NIC).
want=12
# (The usage's FABRIC line names the fabrics of this build; a failing
# rdma run must fail this test, not read as "no rdma".)
if "$bench" --help 2>&1 | grep '^FABRIC: one of' | grep -qw rdma; then
    want=16
fi
lines=$(wc -l <"$out")
[ "$lines" -eq "$want" ] || { echo "expected $want JSON lines, got $lines"; cat "$out"; exit 1; }
python3 - "$out" <<'PY'
import json, sys
keys = ["workload", "fabric", "size", "window", "iters", "p50_ns", "p99_ns",
        "p999_ns", "ops_per_s", "mb_per_s"]
for line in open(sys.argv[1]):
    o = json.loads(line)
    missing = [k for k in keys if k not in o]
    assert not missing, f"missing keys {missing}"
    assert o["workload"] == "echo" and o["fabric"] in ("tcp", "shm", "ntb-emu", "rdma-emu", "rdma"), o
    assert o["iters"] == 2000, o
    assert 0 < o["p50_ns"] <= o["p99_ns"] <= o["p999_ns"], o
    assert o["ops_per_s"] > 0 and o["mb_per_s"] > 0, o
fabrics = {json.loads(l)["fabric"] for l in open(sys.argv[1])}
assert {"tcp", "shm", "ntb-emu"} <= fabrics, fabrics
print("rpcbench smoke: ok")
PY
# The table form prints a header and one row.
"$bench" echo --iters 1000 2>/dev/null | grep -q '^echo *tcp *64 ' || { echo "no table row"; exit 1; }
# One-sided latency on every fabric, direct and served.
fabrics="tcp shm ntb"
[ "$want" -eq 16 ] && fabrics="$fabrics rdma"
for f in $fabrics; do
    for how in "" --served; do
        "$bench" get --fabric $f --iters 2000 --json $how >"$out" 2>/dev/null ||
            { echo "get over $f $how failed"; exit 1; }
        python3 - "$out" "$f" <<'PY'
import json, sys
o = json.loads(open(sys.argv[1]).read())
assert o["workload"] == "get" and o["fabric"] == sys.argv[2], o
assert 0 < o["p50_ns"] <= o["p99_ns"] and o["ops_per_s"] > 0, o
PY
    done
done
for f in $fabrics; do
    "$bench" put --fabric $f --size 4k --iters 2000 | grep -q "^put over $f" ||
        { echo "put over $f failed"; exit 1; }
done
# Emulated NTB devices are removed by the last side out; softverbs
# segments by the process that exits.
[ "$(ls /dev/shm 2>/dev/null | grep -c '^softverbs\.' || true)" -eq 0 ] ||
    { echo "rpcbench left /dev/shm/softverbs.* files"; ls /dev/shm; exit 1; }
[ "$(ntb_files)" -le "$ntb_before" ] || { echo "rpcbench left /dev/shm/tern-ntb.* files"; exit 1; }
# The floor measurement runs and reports.
"$bench" floor --iters 20000 | grep -q 'ping-pong' || { echo "floor failed"; exit 1; }
# Bad options are refused with a usage message, not a crash.
if "$bench" echo --size banana >/dev/null 2>&1; then echo "bad --size accepted"; exit 1; fi
if "$bench" client --connect tcp://127.0.0.1:1 --iters 10 >/dev/null 2>&1; then
    echo "client to a closed port succeeded"; exit 1
fi

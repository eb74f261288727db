#!/bin/sh
# rpcbench kv runs the YCSB workloads end to end on every fabric, its JSON
# carries echo's keys plus dist/records/persist with sane values, and no pool
# file or /dev/shm segment is left behind. Not a speed test.
set -eu
bench=$1
# What a run may leave in /dev/shm: its pools, its emulated NTB devices, and
# softverbs segments and completion-channel sockets (softverbs.PID[.INC.chN])
# of processes that are gone (other programs running meanwhile have live
# ones).
leftovers() {
    for f in $(ls /dev/shm 2>/dev/null); do
        case $f in
        rpcbench-kv-* | tern-ntb.rpcbench-kv-*) echo "$f" ;;
        softverbs.*) p=${f#softverbs.}; [ -d "/proc/${p%%.*}" ] || echo "$f" ;;
        esac
    done
}
before=$(leftovers)
out=$(mktemp)
err=$(mktemp)
dir=$(mktemp -d)
trap 'rm -rf "$out" "$err" "$dir"' EXIT
run() {
    "$bench" kv "$@" >"$out" 2>"$err" || { echo "rpcbench kv $* failed"; cat "$err" "$out"; exit 1; }
}
# check FILE LINES ARGS...: LINES JSON objects, each a sane kv (or echo) row.
check() {
    python3 - "$out" "$@" <<'PY'
import json, sys
path, want, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
opt = {args[i]: args[i + 1] for i in range(0, len(args), 2)}
lines = open(path).read().splitlines()
assert len(lines) == want, f"expected {want} JSON lines, got {len(lines)}:\n" + "\n".join(lines)
keys = ["workload", "fabric", "size", "window", "iters", "p50_ns", "p99_ns", "p999_ns",
        "ops_per_s", "mb_per_s", "client_rss_kb", "server_rss_kb"]
kv_keys = ["dist", "records", "persist"]
seen = set()
for line in lines:
    o = json.loads(line)
    missing = [k for k in keys if k not in o]
    assert not missing, f"missing keys {missing}: {o}"
    assert o["fabric"] in ("tcp", "shm", "ntb-emu", "rdma-emu", "rdma"), o
    assert 0 < o["p50_ns"] <= o["p99_ns"] <= o["p999_ns"], o
    assert o["ops_per_s"] > 0 and o["mb_per_s"] > 0, o
    assert o["iters"] == int(opt["iters"]), o
    assert o["size"] == int(opt.get("size", 64)), o
    seen.add((o["fabric"], o["workload"]))
    if o["workload"] == "echo":
        continue
    missing = [k for k in kv_keys if k not in o]
    assert not missing, f"missing keys {missing}: {o}"
    assert o["workload"] in opt["workloads"].split(","), o
    assert o["records"] == int(opt["records"]), o
    assert o["persist"] in ("flush", "msync"), o
    assert o["persist"] == opt.get("persist", o["persist"]), o
    want_dist = "latest" if o["workload"] == "kv-D" else opt.get("dist", "uniform")
    assert o["dist"] == want_dist, o
    assert o["server_rss_kb"][1] > 0, o
    if "baseline" in opt:
        assert o["ratio_to_echo_p50"] > 0, o
assert len(seen) == want, f"duplicate rows: {sorted(seen)}"
PY
}
# tcp, shm and ntb-emu always; rdma too when built with rdma-core (the
# usage's FABRIC line names this build's fabrics; a failing rdma run must
# fail this test, not read as "no rdma").
nfab=3
if "$bench" --help 2>&1 | grep '^FABRIC: one of' | grep -qw rdma; then
    nfab=4
fi
run --fabric all --workload A,C,F,put --records 1000 --iters 2000 --json
check $((4 * nfab)) iters 2000 records 1000 workloads kv-A,kv-C,kv-F,kv-put
python3 - "$out" "$nfab" <<'PY'
import json, sys
fabrics = {json.loads(l)["fabric"] for l in open(sys.argv[1])}
assert {"tcp", "shm", "ntb-emu"} <= fabrics and len(fabrics) == int(sys.argv[2]), fabrics
PY
# Both paths side by side on every fabric: a row per path, in order; on shm
# and rdma the one-sided GETs really go one-sided and the PUTs through a
# leased segment, and the server's CPU per GET is below the RPC path's.
run --fabric all --workload get,put --path rpc,onesided --records 1000 --iters 2000 --json
python3 - "$out" "$nfab" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 4 * int(sys.argv[2]), len(rows)
for rpc, os_ in zip(rows[0::2], rows[1::2]):
    assert rpc["path"] == "rpc" and os_["path"] == "onesided", (rpc, os_)
    assert (rpc["fabric"], rpc["workload"]) == (os_["fabric"], os_["workload"]), (rpc, os_)
    assert rpc["gets_direct"] == 0 and rpc["puts_onesided"] == 0, rpc
    if os_["workload"] == "kv-get":
        assert os_["gets_direct"] > 0.9 * os_["iters"], os_
        if os_["fabric"] in ("shm", "rdma-emu", "rdma"):
            assert os_["server_busy_us_per_op"] < rpc["server_busy_us_per_op"], (rpc, os_)
    else:
        assert os_["puts_onesided"] > 0.9 * os_["iters"], os_
PY
# Zipfian requests (D: latest), every YCSB workload, a window of 4.
run --fabric shm --workload A,B,C,D,F --dist zipfian --records 1000 --iters 2000 --window 4 --json
check 5 iters 2000 records 1000 dist zipfian workloads kv-A,kv-B,kv-C,kv-D,kv-F
# 4 KiB values.
run --fabric shm --workload C,put --value-size 4k --records 500 --iters 1000 --json
check 2 iters 1000 size 4096 records 500 workloads kv-C,kv-put
# The echo baseline first, then the ratio on the kv row.
run --fabric shm --workload get --records 500 --iters 1000 --baseline --json
check 2 iters 1000 records 500 workloads kv-get baseline 1
head -1 "$out" | grep -q '"workload":"echo"' || { echo "baseline row missing"; cat "$out"; exit 1; }
# A pool directory of our choosing (msync unless it is on tmpfs); it is left empty.
persist=msync
[ "$(stat -f -c %T "$dir")" = tmpfs ] && persist=flush
run --fabric tcp --workload A --records 500 --iters 1000 --pool-dir "$dir" --json
check 1 iters 1000 records 500 workloads kv-A persist $persist
[ -z "$(ls -A "$dir")" ] || { echo "pool file left in $dir"; ls -la "$dir"; exit 1; }
# The table form: a persist line, the header and a row.
run --fabric tcp --workload get --records 100 --iters 500
grep -q '^kv: .*persist \(flush\|msync\)' "$out" || { echo "no persist line"; cat "$out"; exit 1; }
grep -q '^kv-get *tcp *64 ' "$out" || { echo "no table row"; cat "$out"; exit 1; }
# Nothing left in /dev/shm: pools, NTB devices, softverbs segments.
new=$(leftovers | grep -vxF -e "${before:-^}" || true)
[ -z "$new" ] || { echo "rpcbench kv left files in /dev/shm:" $new; exit 1; }
# Bad options are refused with a usage message, not a crash.
for bad in "--workload Z" "--dist pareto" "--value-size banana" "--key-size 6" "--fabric nope" \
           "--path nope" "--path rpc,rpc,rpc,rpc,rpc"; do
    # shellcheck disable=SC2086
    if "$bench" kv $bad --iters 10 >/dev/null 2>&1; then echo "kv $bad accepted"; exit 1; fi
done
echo "rpcbench kv smoke: ok"

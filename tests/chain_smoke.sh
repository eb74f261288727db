#!/usr/bin/env bash
# tern chain and ternd --chain as a user meets them: gen, info and verify
# on a file; a corrupted file is named by its height (status 1); ternd
# serves a chain, takes producers' blocks (tern chain append --uri) and a
# second ternd catches up from it at start ("ternd chain in-sync"), both
# verified over --uri and on their files after a clean stop; a peer that
# lies is dropped with its reason and the catch-up still ends checked.
#
#   tests/chain_smoke.sh BUILD_DIR
set -euo pipefail

build=$1
tern=$build/tools/tern/tern
ternd=$build/tools/ternd/ternd
"$tern" chain --help >/dev/null 2>&1 || { echo "SKIP: tern chain not built"; exit 77; }
base=/tmp
[ -d /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/tern-chain-XXXXXX")
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$dir"' EXIT
fail() { echo "chain smoke: $*" >&2; exit 1; }

# A file: made, shown, checked.
"$tern" chain gen "$dir/a.chain" --blocks 2000 --reversible 50 >"$dir/gen" || fail "gen"
grep -q "2000 blocks" "$dir/gen" || fail "gen said: $(cat "$dir/gen")"
"$tern" chain info "$dir/a.chain" | grep -q "^irreversible  1950$" || fail "info"
"$tern" chain verify "$dir/a.chain" | grep -q "^sound: 2000 blocks" || fail "verify"
set +e
"$tern" chain gen "$dir/a.chain" --blocks 5 2>/dev/null; rc1=$?
"$tern" chain gen "$dir/x" 2>/dev/null; rc2=$?
set -e
[ $rc1 -eq 2 ] || fail "gen over a chain: status $rc1"
[ $rc2 -eq 2 ] || fail "gen without a size: status $rc2"

# A flipped byte in block 1234's body (its offset from the index entry).
cp "$dir/a.chain" "$dir/bad.chain"
off=$(python3 - "$dir/bad.chain" <<'PY'
import struct, sys
f = open(sys.argv[1], "rb").read()
cap = struct.unpack_from("<Q", f, 40)[0]
data = struct.unpack_from("<Q", f, 48)[0]
rec = struct.unpack_from("<Q", f, 4096 + 1234 * 64)[0]
print(data + rec + 32 + 200)
PY
)
printf '\xff' | dd of="$dir/bad.chain" bs=1 seek="$off" conv=notrunc status=none
set +e
"$tern" chain verify "$dir/bad.chain" >"$dir/v" 2>&1; rc=$?
set -e
[ $rc -eq 1 ] || fail "verify of a corrupted chain: status $rc"
grep -q "height 1234" "$dir/v" || fail "verify did not name the height: $(cat "$dir/v")"

# Two nodes: A serves the chain and takes producers' blocks; B catches up.
start() {   # DIR OUT ARGS...
    local d=$1 o=$2; shift 2
    mkdir -p "$d"
    "$ternd" --data-dir "$d" --listen tcp://127.0.0.1:0 --no-doc "$@" >"$o" 2>"$o.err" &
    pids+=($!)
    for _ in $(seq 100); do grep -q "ternd ready" "$o" && break; sleep 0.05; done
    grep -q "ternd ready" "$o" || fail "ternd did not start: $(cat "$o.err")"
}
mkdir -p "$dir/na"
cp "$dir/a.chain" "$dir/na/chain.pool"
start "$dir/na" "$dir/na.out" --chain --chain-producers
uri_a=$(sed -n 's/^ternd ready \(tcp:[^ ]*\).*/\1/p' "$dir/na.out")
"$tern" chain append --uri "$uri_a" --blocks 20 | grep -q "appended 20 blocks" || fail "append"
"$tern" chain info --uri "$uri_a" | grep -q "^blocks        2020 " || fail "info --uri"
mkdir -p "$dir/nl"
cp "$dir/a.chain" "$dir/nl/chain.pool"
start "$dir/nl" "$dir/nl.out" --chain --chain-fault merkle
uri_l=$(sed -n 's/^ternd ready \(tcp:[^ ]*\).*/\1/p' "$dir/nl.out")
start "$dir/nb" "$dir/nb.out" --chain --chain-peer "$uri_l" --chain-peer "$uri_a"
for _ in $(seq 200); do grep -q "ternd chain" "$dir/nb.out" && break; sleep 0.05; done
grep -q "ternd chain in-sync blocks=2020 " "$dir/nb.out" || fail "B: $(cat "$dir/nb.out" "$dir/nb.out.err")"
grep -q "bad merkle root" "$dir/nb.out.err" || fail "the liar was not named: $(cat "$dir/nb.out.err")"
uri_b=$(sed -n 's/^ternd ready \(tcp:[^ ]*\).*/\1/p' "$dir/nb.out")
"$tern" chain verify --uri "$uri_b" | grep -q "^sound: 2020 blocks" || fail "verify --uri B"
# A node without producers refuses them, saying so.
set +e
"$tern" chain append --uri "$uri_b" --blocks 1 >/dev/null 2>"$dir/e"; rc=$?
set -e
[ $rc -eq 2 ] && grep -q "takes no producers" "$dir/e" || fail "append to B: $rc $(cat "$dir/e")"
for p in "${pids[@]}"; do kill -TERM "$p"; wait "$p" || fail "a ternd did not stop cleanly"; done
pids=()
"$tern" chain verify "$dir/nb/chain.pool" | grep -q "^sound: 2020 blocks" || fail "B's file"
echo "chain smoke: ok"

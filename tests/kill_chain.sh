#!/usr/bin/env bash
# kill -9 at random points of a chain's life, end to end with real
# processes:
#   appends:  `tern chain append` to a file, killed ROUNDS times at random
#             moments; after each kill the file opens, verifies whole (no
#             committed block is invalid) and holds at least what it held;
#   catch-up: a ternd catching up from a peer ternd, killed ROUNDS times
#             at random moments and started again; it resumes from its
#             committed height (never below what a kill left), every file
#             the kills leave verifies, and the last run ends at the
#             peer's head, checked.
#
#   tests/kill_chain.sh BUILD_DIR [ROUNDS]     (default 50)
set -euo pipefail

build=$1
rounds=${2:-50}
tern=$build/tools/tern/tern
ternd=$build/tools/ternd/ternd
"$tern" chain --help >/dev/null 2>&1 || { echo "SKIP: tern chain not built"; exit 77; }
base=/tmp
[ -d /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/tern-kill-XXXXXX")
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$dir"' EXIT
fail() { echo "kill chain: $*" >&2; exit 1; }
blocks_of() { "$tern" chain info "$1" | sed -n 's/^blocks *\([0-9]*\) .*/\1/p'; }
rand_ms() { local v=$(( $1 + RANDOM % ($2 - $1 + 1) )); printf '%d.%03d' $((v / 1000)) $((v % 1000)); }

# ---- appends ----
"$tern" chain gen "$dir/app.chain" --blocks 10 --size 2g >/dev/null
prev=10
mid=0
for r in $(seq "$rounds"); do
    # More appending than the kill, 1 to 60 ms later, leaves time for.
    "$tern" chain append "$dir/app.chain" --blocks 100000 --seed "$r" >/dev/null 2>&1 &
    p=$!
    sleep "$(rand_ms 1 60)"
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
    "$tern" chain verify "$dir/app.chain" >"$dir/v" || fail "appends, round $r: $(cat "$dir/v")"
    now=$(blocks_of "$dir/app.chain")
    [ "$now" -ge "$prev" ] || fail "appends, round $r: $now blocks after $prev"
    [ "$now" -gt "$prev" ] && [ "$now" -lt $((prev + 100000)) ] && mid=$((mid + 1))
    prev=$now
done
[ "$mid" -ge $((rounds / 2)) ] || fail "appends: only $mid of $rounds kills landed mid-way"
echo "kill chain: appends: $rounds kills, $mid mid-way, $prev blocks, every file sound"

# ---- catch-up ----
rm -f "$dir/app.chain"
"$tern" chain gen "$dir/src.chain" --blocks 40000 --reversible 50 >/dev/null
head=$(blocks_of "$dir/src.chain")
mkdir -p "$dir/a" "$dir/b"
cp "$dir/src.chain" "$dir/a/chain.pool"
"$ternd" --data-dir "$dir/a" --listen tcp://127.0.0.1:0 --no-doc --chain >"$dir/a.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "ternd ready" "$dir/a.out" && break; sleep 0.05; done
uri=$(sed -n 's/^ternd ready \(tcp:[^ ]*\).*/\1/p' "$dir/a.out")
[ -n "$uri" ] || fail "peer did not start: $(cat "$dir/a.out")"
start_b() {
    "$ternd" --data-dir "$dir/b" --listen tcp://127.0.0.1:0 --no-doc --no-shm --chain \
        --chain-size 256m --chain-peer "$uri" >"$dir/b.out" 2>&1 &
    p=$!
    for _ in $(seq 400); do grep -q "ternd ready" "$dir/b.out" && break; sleep 0.005; done
}
# How long a whole catch-up takes here: the kills land anywhere in it.
start_b
for _ in $(seq 600); do grep -q "ternd chain" "$dir/b.out" && break; sleep 0.05; done
sync_ms=$(sed -n 's/.*seconds=\([0-9.]*\).*/\1/p' "$dir/b.out" | awk '{printf "%d", $1 * 1000 + 1}')
kill -9 "$p" 2>/dev/null || true
wait "$p" 2>/dev/null || true
[ -n "$sync_ms" ] || fail "the first catch-up did not end: $(cat "$dir/b.out")"
rm -rf "$dir/b"
prev=0
mid=0
for r in $(seq "$rounds"); do
    start_b
    sleep "$(rand_ms 0 "$sync_ms")"
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
    [ -f "$dir/b/chain.pool" ] || continue
    "$tern" chain verify "$dir/b/chain.pool" >"$dir/v" || fail "catch-up, round $r: $(cat "$dir/v")"
    now=$(blocks_of "$dir/b/chain.pool")
    [ "$now" -ge "$prev" ] || fail "catch-up, round $r: $now blocks after $prev"
    [ "$now" -gt 0 ] && [ "$now" -lt "$head" ] && mid=$((mid + 1))
    prev=$now
    # Caught up already: start the next rounds over from nothing.
    if [ "$now" -eq "$head" ]; then rm -rf "$dir/b"; prev=0; fi
done
[ "$mid" -ge 3 ] || fail "catch-up: only $mid kills landed mid-way"
# The last run, not killed, ends at the peer's head.
start_b
pids+=($p)
for _ in $(seq 600); do grep -q "ternd chain" "$dir/b.out" && break; sleep 0.05; done
grep -q "ternd chain in-sync blocks=$head " "$dir/b.out" || fail "last run: $(cat "$dir/b.out")"
for p in "${pids[@]}"; do kill -TERM "$p"; wait "$p" || fail "a ternd did not stop cleanly"; done
pids=()
"$tern" chain verify "$dir/b/chain.pool" | grep -q "^sound: $head blocks" || fail "final file"
echo "kill chain: catch-up: $rounds kills, $mid mid-way, resumed to the head ($head blocks)"

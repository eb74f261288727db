#!/usr/bin/env bash
# rpcbench results drawn as a PNG (tools/rpcbench/plot.py): a short echo
# run over shm and tcp, sizes and windows, through --json into the plot;
# the file must be a PNG of the size asked for whose pixels are not all
# one colour (lines were drawn), and bad input must be refused.
#
#   tests/plot_smoke.sh RPCBENCH
set -euo pipefail

rpcbench=$1
plot=$(cd "$(dirname "$0")/.." && pwd)/tools/rpcbench/plot.py
command -v gnuplot >/dev/null || { echo "SKIP: gnuplot is not installed (Debian: gnuplot-nox)"; exit 77; }
dir=$(mktemp -d /tmp/tern-plot-XXXXXX)
trap 'rm -rf "$dir"' EXIT

for f in shm tcp; do
    timeout 120 "$rpcbench" echo --fabric "$f" --size 64,4k --window 1,4 --iters 500 --json \
        >>"$dir/runs.json"
done
[ "$(wc -l <"$dir/runs.json")" -eq 8 ] || { echo "plot smoke: expected 8 runs: $(cat "$dir/runs.json")" >&2; exit 1; }
"$plot" "$dir/runs.json" -o "$dir/runs.png" --title "plot smoke"
python3 - "$dir/runs.png" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, ihdr = 8, b"", None
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        ihdr = struct.unpack(">IIBBBBB", body)
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
w, h, depth, ctype = ihdr[:4]
assert (w, h) == (1200, 500), f"size {w}x{h}"
raw = zlib.decompress(idat)
bpp = {2: 3, 6: 4, 0: 1, 4: 2}.get(ctype, 3) * depth // 8
row = w * bpp + 1
assert len(raw) == row * h, "truncated image"
# Undo the row filters (PNG spec, section 9), then look for colour: axes,
# grid and labels are grey; only a drawn line is not.
prev = bytearray(row - 1)
colours = set()
for y in range(h):
    f, line = raw[y * row], bytearray(raw[y * row + 1:(y + 1) * row])
    for i in range(len(line)):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1:
            line[i] = (line[i] + a) & 0xff
        elif f == 2:
            line[i] = (line[i] + b) & 0xff
        elif f == 3:
            line[i] = (line[i] + (a + b) // 2) & 0xff
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xff
    prev = line
    for x in range(0, len(line), bpp):
        r, g, b = line[x:x + 3] if bpp >= 3 else (line[x],) * 3
        if max(r, g, b) - min(r, g, b) > 60:
            colours.add((r >> 4, g >> 4, b >> 4))
assert len(colours) >= 2, f"{len(colours)} colours besides grey: an empty plot"
print(f"plot smoke: {w}x{h} PNG, {len(colours)} colours besides grey")
PY
# Input that is not rpcbench's: refused with a message, no file.
echo '{"not": "a run"}' >"$dir/bad.json"
if "$plot" "$dir/bad.json" -o "$dir/bad.png" 2>"$dir/err"; then
    echo "plot smoke: input without runs was accepted" >&2; exit 1
fi
grep -q "no rpcbench runs" "$dir/err" || { echo "plot smoke: $(cat "$dir/err")" >&2; exit 1; }
[ ! -e "$dir/bad.png" ] || { echo "plot smoke: a PNG from bad input" >&2; exit 1; }
echo "plot smoke: ok"

#!/usr/bin/env python3
"""Draw rpcbench results as a PNG: latency against message size and
throughput against window, one line per fabric, as UCX users draw
ucx_perftest's.

    rpcbench echo --fabric all --size 64,1k,4k,64k --window 1,4,16 --json > runs.json
    tools/rpcbench/plot.py runs.json -o runs.png      (or read stdin: -)

Input: rpcbench's --json output, one object per run (workload, fabric,
size, window, p50_ns, p99_ns, ops_per_s). Left: the median and 99th
percentile (dashed) at window 1, log-log, against size. Right: operations
a second against window at the smallest size. Runs of several workloads
are kept apart by name ("echo shm"). Drawn by gnuplot (Debian's
gnuplot-nox, its pngcairo terminal); without gnuplot it says so and exits
with status 77, as a skipped test does.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile


def load(paths):
    runs = []
    for path in paths:
        f = sys.stdin if path == "-" else open(path, encoding="utf-8")
        with f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"plot.py: {path}:{n}: not JSON: {e}")
                if not isinstance(r, dict):
                    sys.exit(f"plot.py: {path}:{n}: not one rpcbench run")
                if {"fabric", "size", "window", "p50_ns", "ops_per_s"} <= r.keys():
                    runs.append(r)
    if not runs:
        sys.exit("plot.py: no rpcbench runs in the input (rpcbench ... --json)")
    return runs


def series(runs):
    """{name: {"lat": [(size, p50_us, p99_us)], "tput": [(window, ops)]}}"""
    out = {}
    workloads = {r.get("workload", "") for r in runs}
    min_size = {}
    for r in runs:
        name = r["fabric"] if len(workloads) < 2 else f'{r.get("workload", "")} {r["fabric"]}'
        min_size[name] = min(min_size.get(name, r["size"]), r["size"])
    for r in runs:
        name = r["fabric"] if len(workloads) < 2 else f'{r.get("workload", "")} {r["fabric"]}'
        s = out.setdefault(name, {"lat": [], "tput": []})
        if r["window"] == 1:
            s["lat"].append((max(r["size"], 1), r["p50_ns"] / 1e3,
                             r.get("p99_ns", r["p50_ns"]) / 1e3))
        if r["size"] == min_size[name]:
            s["tput"].append((r["window"], r["ops_per_s"]))
    for s in out.values():
        s["lat"].sort()
        s["tput"].sort()
    return out


def script(data, png, title, tmp):
    lines = [
        "set terminal pngcairo size 1200,500 enhanced font 'sans,10'",
        f"set output {json.dumps(png)}",
        "set multiplot layout 1,2 title " + json.dumps(title),
        "set grid",
        "set key top left",
        "set logscale xy",
        "set xlabel 'message size (bytes)'",
        "set ylabel 'latency (us), window 1'",
    ]
    plots = []
    for i, (name, s) in enumerate(sorted(data.items()), 1):
        if not s["lat"]:
            continue
        path = os.path.join(tmp, f"lat{i}.dat")
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(f"{a} {b} {c}\n" for a, b, c in s["lat"])
        plots.append(f"{json.dumps(path)} using 1:2 with linespoints lc {i} dt 1 "
                     f"title {json.dumps(name + ' p50')}")
        plots.append(f"{json.dumps(path)} using 1:3 with linespoints lc {i} dt 2 "
                     f"title {json.dumps(name + ' p99')}")
    lines.append("plot " + ", ".join(plots) if plots else "plot 1/0 title 'no window-1 runs'")
    lines += ["unset logscale y", "set logscale x 2", "set xlabel 'window (calls in flight)'",
              "set ylabel 'operations per second, smallest size'", "set format y '%.1s%c'",
              "set yrange [0:*]"]
    plots = []
    for i, (name, s) in enumerate(sorted(data.items()), 1):
        if not s["tput"]:
            continue
        path = os.path.join(tmp, f"tput{i}.dat")
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(f"{a} {b}\n" for a, b in s["tput"])
        plots.append(f"{json.dumps(path)} using 1:2 with linespoints lc {i} "
                     f"title {json.dumps(name)}")
    lines.append("plot " + ", ".join(plots) if plots else "plot 1/0 title 'no runs'")
    lines.append("unset multiplot")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="*", default=["-"], help="rpcbench --json output (- = stdin)")
    ap.add_argument("-o", "--output", required=True, help="the PNG to write")
    ap.add_argument("--title", default="rpcbench", help="the figure's title")
    a = ap.parse_args()
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        print("plot.py: SKIP: gnuplot is not installed (Debian: gnuplot-nox)", file=sys.stderr)
        return 77
    data = series(load(a.inputs))
    with tempfile.TemporaryDirectory(prefix="tern-plot-") as tmp:
        prog = script(data, os.path.abspath(a.output), a.title, tmp)
        done = subprocess.run([gnuplot], input=prog, text=True, capture_output=True, check=False)
        if done.returncode != 0:
            sys.exit(f"plot.py: gnuplot failed: {done.stderr.strip()}")
    print(f"plot.py: {a.output}: {len(data)} lines", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# compare-ucx.sh - tern vs UCX (ucx_perftest), side by side.
#
# --test lat (default): tern echo round trip vs ucx_perftest ucp_am_lat.
# Runs `rpcbench echo --window 1` and a ucx_perftest ucp_am_lat ping-pong
# alternately for a few rounds on the same fabric and message size, takes the
# median round trip of each run, then the median over rounds of each side,
# and prints a table with the ratio tern/UCX.
#
# ucx_perftest reports ONE-WAY latency (half the ping-pong round trip), so the
# UCX round trip is 2 x its 50%ile column.  Note that ucx_perftest (1.13)
# takes that percentile over its last 2048 iterations only (a ring of
# samples), while rpcbench's p50 covers every measured call (HDR histogram,
# within 1.6%).  Both sides busy-poll; both get the same warm-up.
#
# --test bw: one-way streaming bandwidth, `rpcbench sink` (requests carry the
# payload, the server reads every byte of it, replies are empty, --window
# calls in flight; UCX's receiver too has its data in its own cache) vs ucx_perftest
# ucp_am_bw, whose "bandwidth overall" column is taken.  ucx_perftest's MB is
# 2^20 bytes, rpcbench's is 10^6 bytes; this script converts UCX's figure so
# that both sides are in MB/s of 10^6 bytes.  ucx_perftest is left its own
# send window (no -O; its test table gives ucp_am_bw 32 outstanding sends).
#
# Both tests report the ratio of the medians and the median of the per-round
# ratios.  On a machine that flips between a fast and a slow state between
# rounds the per-round ratio (both sides measured back to back) is the robust
# figure; bw's verdict uses it, lat's verdict stays on the ratio of medians.
#
# With --fabric shm each round starts with `rpcbench floor` (cache-line
# ping-pong between two processes, and single-core memcpy bandwidth): lat
# reports tern's p50 over the floor's p50, bw tern's MB/s over memcpy's MB/s.
#
# Exit status: 0 on success and when ucx_perftest is not installed (SKIP);
# 1 when a command failed; 2 on bad usage.  The ratio never changes it.

set -euo pipefail
export LC_ALL=C

script_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd -- "$script_dir/../.." && pwd)

test_kind=lat
fabric=tcp
size=
window=
iters=
rounds=3
rpcbench="$repo_root/build/tools/rpcbench/rpcbench"
json=0
cpu=
run_timeout=
floor_iters=300000

usage() {
    cat <<EOF
usage: ${0##*/} [--test lat|bw] [--fabric tcp|shm] [--size S] [--iters N] [--rounds 3]
       ${0##*/} --test bw ... [--window 16]
       ${0##*/} ... [--rpcbench PATH] [--cpu C,S] [--timeout SECONDS] [--json]

--test lat (default): tern's echo round trip (rpcbench echo --window 1)
against UCX (ucx_perftest -t ucp_am_lat).  --test bw: tern's one-way
streaming bandwidth (rpcbench sink --window W) against UCX (ucx_perftest -t
ucp_am_bw).  The two sides alternate for --rounds rounds on the same fabric
and size; the script prints the median over rounds of each side, the ratio
tern/UCX of those medians and the median of the per-round ratios.  With
--fabric shm every round also runs rpcbench floor, and tern is reported
against it (lat: p50 / floor p50; bw: MB/s / single-core memcpy MB/s).

  --test T        lat (default) or bw
  --fabric F      tcp (default) or shm; rdma is mapped for later use
  --size N        payload bytes (default 64 for lat, 65536 for bw; k/m suffixes)
  --window N      bw only: tern's calls in flight (default 16)
  --iters N       measured calls per run (default 200000 for lat, 100000 for bw)
  --rounds N      alternating rounds (default 3; with an even number the
                  median over rounds is the mean of the middle two)
  --rpcbench PATH rpcbench binary (default: build/tools/rpcbench/rpcbench
                  under the repo root)
  --cpu C,S       pin client to cpu C and server to cpu S on both sides
                  (default: no pinning)
  --timeout S     bound on each single run (default: 30 + iters/2000 s)
  --json          also print one JSON line; the human-readable text then goes
                  to stderr so that stdout holds only the JSON line
EOF
}

die() { echo "${0##*/}: $*" >&2; exit 1; }
bad_usage() { echo "${0##*/}: $*" >&2; usage >&2; exit 2; }

need_arg() { [[ $# -ge 2 && -n $2 ]] || bad_usage "option $1 needs a value"; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --test)     need_arg "$@"; test_kind=$2; shift 2 ;;
        --fabric)   need_arg "$@"; fabric=$2; shift 2 ;;
        --size)     need_arg "$@"; size=$2; shift 2 ;;
        --window)   need_arg "$@"; window=$2; shift 2 ;;
        --iters)    need_arg "$@"; iters=$2; shift 2 ;;
        --rounds)   need_arg "$@"; rounds=$2; shift 2 ;;
        --rpcbench) need_arg "$@"; rpcbench=$2; shift 2 ;;
        --cpu)      need_arg "$@"; cpu=$2; shift 2 ;;
        --timeout)  need_arg "$@"; run_timeout=$2; shift 2 ;;
        --json)     json=1; shift ;;
        -h|--help)  usage; exit 0 ;;
        *)          bad_usage "unknown argument: $1" ;;
    esac
done

# --- argument checks ---------------------------------------------------------

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
is_pos() { is_uint "$1" && ((10#$1 > 0)); }

case $test_kind in
    lat) : "${size:=64}" "${iters:=200000}"
         [[ -z $window ]] || bad_usage "--window applies to --test bw only (lat runs --window 1)" ;;
    bw)  : "${size:=65536}" "${iters:=100000}" "${window:=16}" ;;
    *)   bad_usage "unknown --test: $test_kind (lat, bw)" ;;
esac

case $size in
    *[kK]) n=${size%?}; is_uint "$n" || bad_usage "bad --size: $size"; size=$((10#$n * 1024)) ;;
    *[mM]) n=${size%?}; is_uint "$n" || bad_usage "bad --size: $size"; size=$((10#$n * 1048576)) ;;
    *)     is_uint "$size" || bad_usage "bad --size: $size"; size=$((10#$size)) ;;
esac
is_pos "$iters" || bad_usage "bad --iters: $iters"
is_pos "$rounds" || bad_usage "bad --rounds: $rounds"
iters=$((10#$iters))
rounds=$((10#$rounds))
if [[ $test_kind == bw ]]; then
    is_pos "$window" || bad_usage "bad --window: $window"
    window=$((10#$window))
    ((size > 0)) || bad_usage "--test bw needs a --size above 0"
fi
if [[ -n $cpu ]]; then
    [[ $cpu =~ ^([0-9]+),([0-9]+)$ ]] || bad_usage "bad --cpu (want C,S): $cpu"
    cpu_client=${BASH_REMATCH[1]}
    cpu_server=${BASH_REMATCH[2]}
fi
if [[ -n $run_timeout ]]; then
    is_pos "$run_timeout" || bad_usage "bad --timeout: $run_timeout"
else
    run_timeout=$((30 + iters / 2000))
fi
run_timeout=$((10#$run_timeout))

# Fabric -> UCX transports.  tern has tcp and shm today.
ucx_env=()
case $fabric in
    tcp)  ucx_env=(UCX_TLS=tcp UCX_NET_DEVICES=lo) ;;
    shm)  ucx_env=("UCX_TLS=posix,self") ;;
    rdma) ucx_env=("UCX_TLS=rc_verbs,self" "UCX_NET_DEVICES=${UCX_NET_DEVICES:-all}") ;;
    *)    bad_usage "unknown --fabric: $fabric (tcp, shm, rdma)" ;;
esac
with_floor=0
[[ $fabric == shm ]] && with_floor=1

# Human-readable text goes to stdout, or to stderr under --json.
if ((json)); then exec 3>&2; else exec 3>&1; fi
say() { printf '%s\n' "$*" >&3; }

# --- machine facts -----------------------------------------------------------

cpu_model=$(awk -F: '/^(model name|Hardware|cpu model)[ \t]*:/ {
                         sub(/^[ \t]+/, "", $2); print $2; exit }' /proc/cpuinfo 2>/dev/null || true)
say "machine: nproc=$(nproc), cpu=${cpu_model:-unknown}, kernel=$(uname -r)"

ucx_perftest=$(command -v ucx_perftest || true)
if [[ -z $ucx_perftest ]]; then
    say "SKIP: ucx_perftest not found (apt-get install ucx-utils)"
    exit 0
fi
command -v timeout >/dev/null || die "timeout(1) not found (coreutils)"
[[ -x $rpcbench && ! -d $rpcbench ]] || die "rpcbench not found or not executable: $rpcbench (build with: ninja -C $repo_root/build)"

ucx_version=
if command -v ucx_info >/dev/null; then
    ucx_version=$(ucx_info -v 2>/dev/null | awk '/^# Version/ { print $3; exit }' || true)
fi
# Same warm-up as rpcbench: iters/10, at most 10000.
warmup=$((iters / 10 < 10000 ? iters / 10 : 10000))

if [[ $test_kind == lat ]]; then
    tern_args=(echo --fabric "$fabric" --size "$size" --iters "$iters" --window 1 --json)
    ucx_test=ucp_am_lat
    say "tern: $rpcbench echo --fabric $fabric --size $size --iters $iters --window 1${cpu:+ --cpu $cpu}"
else
    tern_args=(sink --fabric "$fabric" --size "$size" --window "$window" --iters "$iters" --json)
    ucx_test=ucp_am_bw
    say "tern: $rpcbench sink --fabric $fabric --size $size --window $window --iters $iters${cpu:+ --cpu $cpu}"
fi
[[ -n $cpu ]] && tern_args+=(--cpu "$cpu")
say "ucx:  ${ucx_env[*]} ucx_perftest -t $ucx_test -s $size -n $iters -w $warmup (UCX ${ucx_version:-version unknown})${cpu:+, client -c $cpu_client, server -c $cpu_server}"
if [[ $test_kind == bw ]]; then
    say "      (UCX's own send window, no -O; its MiB/s are converted to MB/s = 10^6 B/s)"
fi
floor_args=(floor --iters "$floor_iters" --json)
[[ -n $cpu ]] && floor_args+=(--cpu "$cpu")
if ((with_floor)); then
    say "floor: $rpcbench floor --iters $floor_iters${cpu:+ --cpu $cpu} (at the start of each round)"
fi

# --- process handling --------------------------------------------------------

tmp=$(mktemp -d "${TMPDIR:-/tmp}/compare-ucx.XXXXXX")
server_pid=
child_pid=

# Stop one of our background `timeout` processes; timeout passes the signal
# on to its whole process group (the benchmark and anything it forked).
stop_pid() {
    local pid=$1
    [[ -n $pid ]] || return 0
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    stop_pid "$child_pid"
    stop_pid "$server_pid"
    rm -rf -- "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Run a command bounded by timeout, in the background so that a signal to this
# script is handled at once; stdout to $1, stderr to $2.  Returns its status.
run_bounded() {
    local out=$1 err=$2 rc=0
    shift 2
    timeout -k 5 "$run_timeout" "$@" >"$out" 2>"$err" 3>&- &
    child_pid=$!
    wait "$child_pid" || rc=$?
    child_pid=
    return "$rc"
}

show_log() {  # file label
    [[ -s $1 ]] || return 0
    echo "---- $2 ----" >&2
    tail -n 20 "$1" >&2
}

# Is anything bound to local TCP port $1 (any state)?  With $2 = listen, is
# something listening on it?
port_in_use() {
    local hex f files=()
    hex=$(printf '%04X' "$1")
    for f in /proc/net/tcp /proc/net/tcp6; do
        [[ -r $f ]] && files+=("$f")
    done
    ((${#files[@]})) || die "cannot read /proc/net/tcp"
    awk -v p="$hex" -v want="${2:-any}" '
        FNR > 1 { n = split($2, a, ":")
                  if (a[n] == p && (want == "any" || $4 == "0A")) found = 1 }
        END { exit !found }' "${files[@]}"
}

pick_port() {
    local port i
    for ((i = 0; i < 100; i++)); do
        port=$((20000 + RANDOM % 40000))
        if ! port_in_use "$port"; then
            echo "$port"
            return 0
        fi
    done
    return 1
}

# numbers on stdin -> median (mean of the middle two if even), printed with
# the printf format $1 (default %.0f)
median() {
    sort -g | awk -v fmt="${1:-%.0f}\n" '{ v[NR] = $1 }
        END { if (NR == 0) exit 1
              if (NR % 2) printf fmt, v[(NR + 1) / 2]
              else printf fmt, (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# a / b with the printf format $3 (default %.6f)
div() { awk -v a="$1" -v b="$2" -v fmt="${3:-%.6f}\n" 'BEGIN { printf fmt, a / b }'; }

is_num() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]]; }
is_pos_num() { is_num "$1" && awk -v n="$1" 'BEGIN { exit !(n > 0) }'; }

# The number after "key": in a one-line JSON file (the last such line wins).
json_num() {  # file key
    awk -v k="\"$2\"" '
        index($0, k) { s = substr($0, index($0, k) + length(k))
                       sub(/^[ \t]*:[ \t]*/, "", s)
                       if (match(s, /^[0-9]+(\.[0-9]+)?/)) v = substr(s, 1, RLENGTH) }
        END { print v }' "$1"
}

# --- rpcbench runs -----------------------------------------------------------
# (The runs set globals rather than print, so that they stay in this shell,
# where the traps know their processes.)

# Run rpcbench with the given arguments; its stdout lands in $rb_out.
rb_out=
run_rpcbench() {  # tag args...
    local tag=$1 rc=0
    shift
    rb_out="$tmp/$tag.out"
    local err="$tmp/$tag.err"
    run_bounded "$rb_out" "$err" "$rpcbench" "$@" || rc=$?
    if ((rc != 0)); then
        show_log "$rb_out" "rpcbench $1 stdout"; show_log "$err" "rpcbench $1 stderr"
        ((rc == 124)) && die "rpcbench $1 timed out after ${run_timeout}s"
        die "rpcbench $1 failed (exit $rc)"
    fi
}

# One tern run: sets tern_val to its median round trip in ns (lat) or to its
# MB/s (bw).
tern_val=
run_tern() {
    local round=$1 v key=p50_ns
    [[ $test_kind == bw ]] && key=mb_per_s
    run_rpcbench "tern.$round" "${tern_args[@]}"
    v=$(json_num "$rb_out" "$key")
    if ! is_pos_num "$v"; then
        show_log "$rb_out" "rpcbench stdout"; show_log "$tmp/tern.$round.err" "rpcbench stderr"
        die "no $key in rpcbench output"
    fi
    tern_val=$v
}

# One floor run (shm): sets floor_p50 (ns) and floor_mbs (memcpy MB/s).
floor_p50=
floor_mbs=
run_floor() {
    local round=$1
    run_rpcbench "floor.$round" "${floor_args[@]}"
    floor_p50=$(json_num "$rb_out" p50_ns)
    floor_mbs=$(json_num "$rb_out" memcpy_mb_per_s)
    if ! is_pos_num "$floor_p50" || ! is_pos_num "$floor_mbs"; then
        show_log "$rb_out" "rpcbench floor stdout"; show_log "$tmp/floor.$round.err" "rpcbench floor stderr"
        die "no p50_ns / memcpy_mb_per_s in rpcbench floor output"
    fi
}

# --- one UCX run: sets ucx_val to its median round trip in ns (2 x one-way,
# lat) or to its overall bandwidth in MB/s of 10^6 bytes (bw) ---------------

ucx_val=
run_ucx() {
    local round=$1 port attempt rc src i v
    local cout="$tmp/ucx.$round.client" sout="$tmp/ucx.$round.server"
    local common=(-t "$ucx_test" -s "$size" -n "$iters" -w "$warmup")
    local scpu=() ccpu=()
    [[ -n $cpu ]] && scpu=(-c "$cpu_server") && ccpu=(-c "$cpu_client")

    for ((attempt = 1; ; attempt++)); do
        port=$(pick_port) || die "no free TCP port found"
        timeout -k 5 "$run_timeout" env "${ucx_env[@]}" \
            "$ucx_perftest" "${common[@]}" -p "$port" "${scpu[@]}" >"$sout" 2>&1 3>&- &
        server_pid=$!
        # Wait until the server listens (the client does not retry connect()).
        for ((i = 0; i < 200; i++)); do
            port_in_use "$port" listen && break
            kill -0 "$server_pid" 2>/dev/null || break
            sleep 0.05
        done
        if port_in_use "$port" listen; then
            break
        fi
        stop_pid "$server_pid"
        server_pid=
        # Lost a race for the port: try another one.
        if grep -q 'Address already in use' "$sout" && ((attempt < 5)); then
            continue
        fi
        show_log "$sout" "ucx_perftest server"
        die "ucx_perftest server did not start listening on port $port"
    done

    rc=0
    run_bounded "$cout" "$cout.err" env "${ucx_env[@]}" \
        "$ucx_perftest" 127.0.0.1 "${common[@]}" -p "$port" "${ccpu[@]}" || rc=$?
    if ((rc != 0)); then
        show_log "$cout" "ucx_perftest client stdout"; show_log "$cout.err" "ucx_perftest client stderr"
        show_log "$sout" "ucx_perftest server"
        ((rc == 124)) && die "ucx_perftest client timed out after ${run_timeout}s"
        die "ucx_perftest client failed (exit $rc)"
    fi

    # The server exits by itself once the client is done; give it a moment.
    for ((i = 0; i < 100; i++)); do
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.05
    done
    src=0
    if kill -0 "$server_pid" 2>/dev/null; then
        stop_pid "$server_pid"
    else
        wait "$server_pid" || src=$?
    fi
    server_pid=
    if ((src != 0)); then
        show_log "$sout" "ucx_perftest server"
        die "ucx_perftest server failed (exit $src)"
    fi

    # "Final:  iterations  50%ile  average  overall  bw-average  bw-overall
    #  msgrate-average  msgrate-overall"  (latency in usec, one-way; MB = 2^20 B)
    if [[ $test_kind == lat ]]; then
        v=$(awk '$1 == "Final:" && NF >= 3 { v = $3 } END { print v }' "$cout")
    else
        v=$(awk '$1 == "Final:" && NF >= 7 { v = $7 } END { print v }' "$cout")
    fi
    if ! is_num "$v"; then
        show_log "$cout" "ucx_perftest client stdout"; show_log "$cout.err" "ucx_perftest client stderr"
        die "no 'Final:' line with a $([[ $test_kind == lat ]] && echo latency || echo bandwidth) in ucx_perftest output"
    fi
    if [[ $test_kind == lat ]]; then
        v=$(awk -v u="$v" 'BEGIN { printf "%.0f\n", 2 * u * 1000 }')
        ((v > 0)) || die "ucx_perftest reported a zero latency"
    else
        v=$(awk -v m="$v" 'BEGIN { printf "%.2f\n", m * 1048576 / 1000000 }')
        is_pos_num "$v" || die "ucx_perftest reported a zero bandwidth"
    fi
    ucx_val=$v
}

us() { awk -v n="$1" 'BEGIN { printf "%.2f", n / 1000 }'; }
mbs() { awk -v n="$1" 'BEGIN { printf "%.0f", n }'; }

tern_all=()
ucx_all=()
ratio_all=()
floor_all=()
vs_floor_all=()
for ((r = 1; r <= rounds; r++)); do
    ((with_floor)) && run_floor "$r"
    # Alternate which side goes first, so that drift hits both alike.
    if ((r % 2)); then
        run_tern "$r"
        run_ucx "$r"
    else
        run_ucx "$r"
        run_tern "$r"
    fi
    tern_all+=("$tern_val")
    ucx_all+=("$ucx_val")
    ratio_all+=("$(div "$tern_val" "$ucx_val")")
    rratio=$(div "$tern_val" "$ucx_val" %.3f)
    if [[ $test_kind == lat ]]; then
        line="round $r/$rounds: tern p50 RTT $(us "$tern_val") us, UCX p50 RTT $(us "$ucx_val") us, ratio tern/UCX $rratio"
        if ((with_floor)); then
            floor_all+=("$floor_p50")
            vs_floor_all+=("$(div "$tern_val" "$floor_p50")")
            line+=", floor p50 $(us "$floor_p50") us, tern/floor $(div "$tern_val" "$floor_p50" %.2f)"
        fi
    else
        line="round $r/$rounds: tern $(mbs "$tern_val") MB/s, UCX $(mbs "$ucx_val") MB/s, ratio tern/UCX $rratio"
        if ((with_floor)); then
            floor_all+=("$floor_mbs")
            vs_floor_all+=("$(div "$tern_val" "$floor_mbs")")
            line+=", memcpy $(mbs "$floor_mbs") MB/s, tern/memcpy $(div "$tern_val" "$floor_mbs" %.3f)"
        fi
    fi
    say "$line"
done

ratio_med=$(printf '%s\n' "${ratio_all[@]}" | median %.3f)
if ((with_floor)); then
    floor_med=$(printf '%s\n' "${floor_all[@]}" | median)
    vs_floor_med=$(printf '%s\n' "${vs_floor_all[@]}" | median %.3f)
fi

if [[ $test_kind == lat ]]; then
    tern_p50=$(printf '%s\n' "${tern_all[@]}" | median)
    ucx_p50=$(printf '%s\n' "${ucx_all[@]}" | median)
    ratio=$(div "$tern_p50" "$ucx_p50" %.3f)
    if ((tern_p50 <= ucx_p50)); then verdict="tern <= UCX"; else verdict="tern > UCX"; fi

    say ""
    say "median over $rounds round(s), $iters round trips each:"
    say ""
    {
        printf '| %-6s | %-8s | %-17s | %-29s | %-14s | %-11s |\n' \
            fabric "size (B)" "tern p50 RTT (us)" "UCX p50 RTT (us, 2x one-way)" "ratio tern/UCX" verdict
        printf '|%s|%s|%s|%s|%s|%s|\n' --------  ---------- ------------------- \
            ------------------------------- ---------------- -------------
        printf '| %-6s | %8s | %17s | %29s | %14s | %-11s |\n' \
            "$fabric" "$size" "$(us "$tern_p50")" "$(us "$ucx_p50")" "$ratio" "$verdict"
    } >&3
    say ""
    say "median of per-round ratios tern/UCX: $ratio_med (the table's ratio is of the medians)"
    if ((with_floor)); then
        say "tern p50 / floor p50 (cache-line ping-pong): median of per-round ratios $vs_floor_med (floor p50 median $(us "$floor_med") us)"
    fi

    if ((json)); then
        extra=
        if ((with_floor)); then
            extra=",\"floor_p50_ns\":$floor_med,\"floor_ratio_median\":$vs_floor_med"
        fi
        printf '{"fabric":"%s","size":%s,"iters":%s,"rounds":%s,"tern_p50_ns":%s,"ucx_p50_rtt_ns":%s,"ratio":%s,"test":"lat","ratio_median":%s%s}\n' \
            "$fabric" "$size" "$iters" "$rounds" "$tern_p50" "$ucx_p50" "$ratio" "$ratio_med" "$extra"
    fi
else
    tern_mbs=$(printf '%s\n' "${tern_all[@]}" | median %.2f)
    ucx_mbs=$(printf '%s\n' "${ucx_all[@]}" | median %.2f)
    ratio=$(div "$tern_mbs" "$ucx_mbs" %.3f)
    if awk -v m="$ratio_med" 'BEGIN { exit !(m >= 1) }'; then
        verdict="tern >= UCX"
    else
        verdict="tern < UCX"
    fi

    say ""
    say "median over $rounds round(s), $iters messages of $size B each, MB = 10^6 B:"
    say ""
    {
        printf '| %-6s | %-8s | %-6s | %-11s | %-10s | %-16s | %-16s | %-11s |\n' \
            fabric "size (B)" window "tern (MB/s)" "UCX (MB/s)" "ratio of medians" "median of ratios" verdict
        printf '|%s|%s|%s|%s|%s|%s|%s|%s|\n' -------- ---------- -------- ------------- \
            ------------ ------------------ ------------------ -------------
        printf '| %-6s | %8s | %6s | %11s | %10s | %16s | %16s | %-11s |\n' \
            "$fabric" "$size" "$window" "$(mbs "$tern_mbs")" "$(mbs "$ucx_mbs")" "$ratio" "$ratio_med" "$verdict"
    } >&3
    say ""
    say "verdict by the median of per-round ratios tern/UCX"
    if ((with_floor)); then
        say "tern MB/s / single-core memcpy MB/s: median of per-round ratios $vs_floor_med (memcpy median $(mbs "$floor_med") MB/s)"
    fi

    if ((json)); then
        extra=
        if ((with_floor)); then
            extra=",\"memcpy_mb_per_s\":$floor_med,\"memcpy_fraction_median\":$vs_floor_med"
        fi
        printf '{"test":"bw","fabric":"%s","size":%s,"window":%s,"iters":%s,"rounds":%s,"tern_mb_per_s":%s,"ucx_mb_per_s":%s,"ratio_median":%s%s}\n' \
            "$fabric" "$size" "$window" "$iters" "$rounds" "$tern_mbs" "$ucx_mbs" "$ratio_med" "$extra"
    fi
fi

#!/usr/bin/env bash
# compare-ucx.sh - tern echo round trip vs UCX (ucx_perftest ucp_am_lat), side by side.
#
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
# Exit status: 0 on success and when ucx_perftest is not installed (SKIP);
# 1 when a command failed; 2 on bad usage.  The ratio never changes it.

set -euo pipefail
export LC_ALL=C

script_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd -- "$script_dir/../.." && pwd)

fabric=tcp
size=64
iters=200000
rounds=3
rpcbench="$repo_root/build/tools/rpcbench/rpcbench"
json=0
cpu=
run_timeout=

usage() {
    cat <<EOF
usage: ${0##*/} [--fabric tcp] [--size 64] [--iters 200000] [--rounds 3]
       ${0##*/} ... [--rpcbench PATH] [--cpu C,S] [--timeout SECONDS] [--json]

Measures tern's echo round trip (rpcbench echo --window 1) against UCX
(ucx_perftest -t ucp_am_lat) on the same fabric and size, alternating the two
for --rounds rounds, and prints the median over rounds of each side's median
round trip with the ratio tern/UCX.

  --fabric F      tcp (default); shm and rdma are mapped for later use
  --size N        payload bytes (default 64; k/m suffixes)
  --iters N       measured round trips per run (default 200000)
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
        --fabric)   need_arg "$@"; fabric=$2; shift 2 ;;
        --size)     need_arg "$@"; size=$2; shift 2 ;;
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

case $size in
    *[kK]) n=${size%?}; is_uint "$n" || bad_usage "bad --size: $size"; size=$((10#$n * 1024)) ;;
    *[mM]) n=${size%?}; is_uint "$n" || bad_usage "bad --size: $size"; size=$((10#$n * 1048576)) ;;
    *)     is_uint "$size" || bad_usage "bad --size: $size"; size=$((10#$size)) ;;
esac
is_pos "$iters" || bad_usage "bad --iters: $iters"
is_pos "$rounds" || bad_usage "bad --rounds: $rounds"
iters=$((10#$iters))
rounds=$((10#$rounds))
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

# Fabric -> UCX transports.  Only tcp exists in tern today.
ucx_env=()
case $fabric in
    tcp)  ucx_env=(UCX_TLS=tcp UCX_NET_DEVICES=lo) ;;
    shm)  ucx_env=("UCX_TLS=posix,self") ;;
    rdma) ucx_env=("UCX_TLS=rc_verbs,self" "UCX_NET_DEVICES=${UCX_NET_DEVICES:-all}") ;;
    *)    bad_usage "unknown --fabric: $fabric (tcp, shm, rdma)" ;;
esac

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

say "tern: $rpcbench echo --fabric $fabric --size $size --iters $iters --window 1${cpu:+ --cpu $cpu}"
say "ucx:  ${ucx_env[*]} ucx_perftest -t ucp_am_lat -s $size -n $iters -w $warmup (UCX ${ucx_version:-version unknown})${cpu:+, client -c $cpu_client, server -c $cpu_server}"

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

median() {  # numbers on stdin -> median (mean of the middle two if even)
    sort -n | awk '{ v[NR] = $1 }
        END { if (NR == 0) exit 1
              if (NR % 2) printf "%.0f\n", v[(NR + 1) / 2]
              else printf "%.0f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# --- one tern run: sets tern_rtt to its median round trip in ns -------------
# (The runs set globals rather than print, so that they stay in this shell,
# where the traps know their processes.)

tern_rtt=
run_tern() {
    local round=$1 rc=0 p50
    local out="$tmp/tern.$round.out" err="$tmp/tern.$round.err"
    local args=(echo --fabric "$fabric" --size "$size" --iters "$iters" --window 1 --json)
    [[ -n $cpu ]] && args+=(--cpu "$cpu")
    run_bounded "$out" "$err" "$rpcbench" "${args[@]}" || rc=$?
    if ((rc != 0)); then
        show_log "$out" "rpcbench stdout"; show_log "$err" "rpcbench stderr"
        ((rc == 124)) && die "rpcbench timed out after ${run_timeout}s"
        die "rpcbench failed (exit $rc)"
    fi
    p50=$(awk '/"p50_ns"[ \t]*:/ { s = $0; sub(/.*"p50_ns"[ \t]*:[ \t]*/, "", s)
                                   sub(/[^0-9].*/, "", s); v = s }
               END { print v }' "$out")
    if ! is_uint "$p50" || ((p50 == 0)); then
        show_log "$out" "rpcbench stdout"; show_log "$err" "rpcbench stderr"
        die "no p50_ns in rpcbench output"
    fi
    tern_rtt=$p50
}

# --- one UCX run: sets ucx_rtt to its median round trip in ns (2 x one-way) -

ucx_rtt=
run_ucx() {
    local round=$1 port attempt rc src i oneway rtt
    local cout="$tmp/ucx.$round.client" sout="$tmp/ucx.$round.server"
    local common=(-t ucp_am_lat -s "$size" -n "$iters" -w "$warmup")
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

    # "Final:  iterations  50%ile  average  overall  ..." (latency in usec, one-way)
    oneway=$(awk '$1 == "Final:" && NF >= 3 { v = $3 } END { print v }' "$cout")
    if ! [[ $oneway =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
        show_log "$cout" "ucx_perftest client stdout"; show_log "$cout.err" "ucx_perftest client stderr"
        die "no 'Final:' line with a latency in ucx_perftest output"
    fi
    rtt=$(awk -v u="$oneway" 'BEGIN { printf "%.0f\n", 2 * u * 1000 }')
    ((rtt > 0)) || die "ucx_perftest reported a zero latency"
    ucx_rtt=$rtt
}

us() { awk -v n="$1" 'BEGIN { printf "%.2f", n / 1000 }'; }

tern_all=()
ucx_all=()
for ((r = 1; r <= rounds; r++)); do
    # Alternate which side goes first, so that drift hits both alike.
    if ((r % 2)); then
        run_tern "$r"
        run_ucx "$r"
    else
        run_ucx "$r"
        run_tern "$r"
    fi
    tern_all+=("$tern_rtt")
    ucx_all+=("$ucx_rtt")
    say "round $r/$rounds: tern p50 RTT $(us "$tern_rtt") us, UCX p50 RTT $(us "$ucx_rtt") us"
done

tern_p50=$(printf '%s\n' "${tern_all[@]}" | median)
ucx_p50=$(printf '%s\n' "${ucx_all[@]}" | median)
ratio=$(awk -v t="$tern_p50" -v u="$ucx_p50" 'BEGIN { printf "%.3f", t / u }')
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

if ((json)); then
    printf '{"fabric":"%s","size":%s,"iters":%s,"rounds":%s,"tern_p50_ns":%s,"ucx_p50_rtt_ns":%s,"ratio":%s}\n' \
        "$fabric" "$size" "$iters" "$rounds" "$tern_p50" "$ucx_p50" "$ratio"
fi

#!/usr/bin/env bash
# Run libFuzzer targets of a -Dfuzz=true build for a fixed time each.
#
#   tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]
#
# TARGET is a name as in tests/fuzz/meson.build (resp_parse, pool, ...);
# none: every target built in BUILD_DIR. Each starts from its seed corpus
# (tests/fuzz/corpus/TARGET, read only) and writes what it finds to
# BUILD_DIR/fuzz-work/TARGET. A crash, a leak, a sanitizer report, a
# harness check that failed or a run over 25 s fails the target; its
# reproducer is kept in BUILD_DIR/fuzz-work/TARGET/artifacts/ and its path
# printed:
#
#   BUILD_DIR/tests/fuzz/fuzz_TARGET ARTIFACT     (runs that input once)
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run.sh BUILD_DIR SECONDS [TARGET...]}
secs=${2:?usage: run.sh BUILD_DIR SECONDS [TARGET...]}
shift 2
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for f in "$build"/tests/fuzz/fuzz_*; do
        [ -x "$f" ] && [ -f "$f" ] && targets+=("$(basename "$f" | sed 's/^fuzz_//')")
    done
fi

rc=0
for t in "${targets[@]}"; do
    bin=$build/tests/fuzz/fuzz_$t
    work=$build/fuzz-work/$t
    mkdir -p "$work/corpus" "$work/artifacts"
    [ -x "$bin" ] || { echo "fuzz $t: $bin not built" >&2; rc=1; continue; }
    log=$work/last.log
    # TERN_LOG: the targets silence expected warnings themselves.
    if "$bin" "$work/corpus" "$here/corpus/$t" -max_total_time="$secs" -timeout=25 \
        -rss_limit_mb=2048 -artifact_prefix="$work/artifacts/" -print_final_stats=1 \
        >"$log" 2>&1; then
        stats=$(grep -E '^stat::number_of_executed_units|^stat::average_exec_per_sec' "$log" |
                awk '{printf "%s %s  ", $1, $2}')
        echo "fuzz $t: ok, $secs s: $stats"
    else
        rc=1
        echo "fuzz $t: FAILED" >&2
        grep -E 'ERROR|SUMMARY|fuzz harness|runtime error' "$log" | head -5 >&2
        for a in "$work"/artifacts/*; do
            [ -f "$a" ] && echo "fuzz $t: reproduce with: $bin $a" >&2
        done
        echo "fuzz $t: full log: $log" >&2
    fi
done
exit $rc

#!/usr/bin/env bash
# Set up tern on a fresh Debian 12 machine and run it.
#
#   ./setup.sh bench   install what is missing, build, run rpcbench against a
#                      local server over every fabric built in, print a table
#   ./setup.sh test    install what is missing, build, run every test suite,
#                      also under AddressSanitizer + UBSan, then each fuzz
#                      target for FUZZ_SECONDS (15), and pymongo, libmongoc
#                      and mongosh against ternd's MongoDB gateway (mongosh
#                      from npm into tests/mongo/node); ends with
#                      "N passed, N failed" (after a line "N skipped" when
#                      a check could not run here, such as a client not
#                      installed)
#
# Packages come from Debian (apt-get; sudo is used when not root), and
# mongosh, which Debian does not have, from npm.
set -euo pipefail

cd "$(dirname "$0")"

PKGS=(build-essential meson ninja-build pkg-config check libsubunit-dev python3
      libibverbs-dev librdmacm-dev    # rdma-core: the rdma fabric and its tests (softverbs)
      libpmem-dev libxxhash-dev   # the services: pool; checksums and key hash
      libbson-dev libpcre2-dev    # the document service: BSON; $regex
      libssl-dev                  # the block-sync service: SHA-256 (libcrypto)
      libinih-dev                 # ternd's configuration file (INI)
      libmicrohttpd-dev curl      # ternd's Prometheus metrics; the test that reads them
      iproute2                    # tools/rack: hosts in network namespaces
      libjson-c-dev               # tern status: the node's JSON; etcd's answers
      libcurl4-openssl-dev        # ternd's [cluster]: etcd's v3 JSON gateway
      etcd-server                 # the cluster suite starts etcd processes of its own
      etcd-client                 # etcdctl: tools/rack and the cluster script ask etcd's health
      scdoc                       # the man pages, built from docs/man/*.scd
      iperf3                      # rpcbench blocksync: the tcp ceiling it compares with
      gnuplot-nox                 # tools/rpcbench/plot.py: rpcbench's results as a PNG
      redis-tools                     # redis-cli/redis-benchmark against the RESP gateway
      python3-pymongo libmongoc-dev   # MongoDB clients against the gateway (tests/mongo)
      clang)                          # libFuzzer: the fuzz targets of tests/fuzz
# Optional: without them the build leaves the matching parts out.
OPTIONAL=(libdpdk-dev)   # DPDK 22.11: the ntb rawdev glue (transport/ntb)

log() { printf '== %s\n' "$*" >&2; }

missing_of() {
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || echo "$p"
    done
}

install_deps() {
    local missing optional sudo=()
    mapfile -t missing < <(missing_of "${PKGS[@]}")
    mapfile -t optional < <(missing_of "${OPTIONAL[@]}")
    [ ${#missing[@]} -eq 0 ] && [ ${#optional[@]} -eq 0 ] && return 0
    [ "$(id -u)" -ne 0 ] && sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    if [ ${#optional[@]} -gt 0 ]; then
        log "installing ${optional[*]} (optional)"
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${optional[@]}" \
            >/dev/null || log "could not install ${optional[*]}; building without them"
    fi
}

# mongosh 2.x, the third client of tests/mongo/run.sh, into tests/mongo/node
# (gitignored): Debian has none. 2.12.0 is the one checked here; it needs
# Node.js 20.19 or later (its driver, mongodb 7.9). Without it run.sh says
# SKIP for mongosh.
MONGOSH_VERSION=2.12.0
install_mongosh() {
    local sudo=()
    [ -x tests/mongo/node/node_modules/.bin/mongosh ] && return 0
    if ! command -v npm >/dev/null; then
        [ "$(id -u)" -ne 0 ] && sudo=(sudo)
        log "installing npm (for mongosh)"
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq npm >/dev/null ||
            { log "could not install npm; tests/mongo/run.sh will skip mongosh"; return 0; }
    fi
    log "installing mongosh@$MONGOSH_VERSION from npm into tests/mongo/node"
    npm install --prefix tests/mongo/node --no-audit --no-fund --loglevel=error \
        "mongosh@$MONGOSH_VERSION" >/dev/null ||
        log "could not install mongosh; tests/mongo/run.sh will skip it"
}

# build DIR [meson options...]: configure once, then (re)build.
build() {
    local dir=$1; shift
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" "$@" >/dev/null || return 1
    fi
    # Quiet when it works; the compiler's words when it does not.
    ninja -C "$dir" >"$dir/ninja.log" 2>&1 || { grep -E 'error|FAILED' "$dir/ninja.log" | head -20 >&2; return 1; }
}

run_bench() {
    build build -Dwerror=false
    log "rpcbench echo over every fabric (server and client on this host)"
    build/tools/rpcbench/rpcbench echo --fabric all --size 64,4k,64k --window 1,16 \
        --iters 100000 --cpu 0,1
    # The key-value service on a file-backed pool (--pool-dir: an ordinary
    # file, persisted with msync), YCSB mixes over every fabric.
    # Each run twice, side by side: every call by RPC, then the one-sided
    # paths where they are the faster way (auto: shm and rdma).
    log "rpcbench kv: YCSB A, B, C, F against the KV service on a file-backed pool, rpc and auto paths"
    mkdir -p tern-data
    build/tools/rpcbench/rpcbench kv --fabric all --workload A,B,C,F --dist zipfian \
        --records 10000 --iters 20000 --pool-dir tern-data --cpu 0,1 --path rpc,auto
    # The document service on a file-backed pool: ~1 KiB documents with an
    # index, inserts, reads by _id, finds by the indexed field (inline and
    # by one-sided batches where they pay), updates and YCSB mixes.
    if [ -x build/tools/rpcbench/rpcbench ] && build/tools/rpcbench/rpcbench doc --help >/dev/null 2>&1; then
        log "rpcbench doc: documents on a file-backed pool, every fabric"
        build/tools/rpcbench/rpcbench doc --fabric all --workload insert,read,find,update,A,B,C,F \
            --records 10000 --iters 5000 --pool-dir tern-data --cpu 0,1 --path rpc,auto
    fi
    # Block sync: a fresh node catches up a 256 MB EOS-like chain from one
    # and two peers over every fabric (the chain is made once, in
    # tern-data, and kept), against iperf3 (tcp) and a two-process copy
    # (the others) measured in the same run; then the block feed, 100
    # subscribers of a node taking 50 blocks a second, one reading ten
    # times slower.
    if [ -x build/tools/rpcbench/rpcbench ] && build/tools/rpcbench/rpcbench blocksync --help >/dev/null 2>&1; then
        log "rpcbench blocksync: catch-up from 1 and 2 peers, every fabric"
        build/tools/rpcbench/rpcbench blocksync --fabric all --shape eos --bytes 256m \
            --peers 1,2 --path put --dir tern-data
        # Each subscriber is an endpoint of its own: tcp and shm carry a
        # hundred of them in one process, softverbs and an NTB link do not.
        log "rpcbench feed: 100 subscribers, one slow, 50 blocks a second"
        for f in tcp shm; do
            build/tools/rpcbench/rpcbench feed --fabric "$f" --subscribers 100 --slow 1 \
                --rate 50 --seconds 5
        done
    fi
}

PASSED=0
FAILED=0
SKIPPED=0

# count NAME CMD...: run a check that is one test. Exit 77 means it could
# not run here (automake's and meson's SKIP): neither a pass nor a failure.
count() {
    local name=$1 rc=0; shift
    "$@" || rc=$?
    if [ $rc -eq 0 ]; then
        PASSED=$((PASSED + 1)); log "PASS $name"
    elif [ $rc -eq 77 ]; then
        SKIPPED=$((SKIPPED + 1)); log "SKIP $name"
    else
        FAILED=$((FAILED + 1)); log "FAIL $name"
    fi
}

# suite DIR: the Check runner of one build; adds its counts.
suite() {
    local out line
    out=$(mktemp)
    "$1/tests/tern-tests" 2>&1 | tee "$out" | grep -E '^[0-9]+%|:[EF]:' || true
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$out" | tail -n 1)
    rm -f "$out"
    if [ -z "$line" ]; then
        log "FAIL $1/tests/tern-tests printed no summary (crashed?)"
        FAILED=$((FAILED + 1))
        return
    fi
    PASSED=$((PASSED + $(echo "$line" | cut -d' ' -f1)))
    FAILED=$((FAILED + $(echo "$line" | cut -d' ' -f3)))
}

# An application outside the tree builds against the installed library.
consumer() {
    local dest pc
    dest=$(mktemp -d)
    meson install -C build --destdir "$dest" >/dev/null || return 1
    pc=$(dirname "$(find "$dest" -name tern.pc | head -n 1)")
    # shellcheck disable=SC2046  # pkg-config's flags are meant to split
    PKG_CONFIG_SYSROOT_DIR=$dest PKG_CONFIG_PATH=$pc \
        cc -std=gnu11 -Wall -Werror examples/hello.c \
        $(PKG_CONFIG_SYSROOT_DIR=$dest PKG_CONFIG_PATH=$pc pkg-config --cflags --libs tern) \
        -o "$dest/hello" || return 1
    # shellcheck disable=SC2046
    # The sysroot moves tern's own paths into $dest, and so libbson's that
    # tern.pc requires (doc.h includes it): those come from the system.
    PKG_CONFIG_SYSROOT_DIR=$dest PKG_CONFIG_PATH=$pc \
        c++ -std=c++17 -Wall -Werror -pthread tests/abi/consumer.cc \
        $(PKG_CONFIG_SYSROOT_DIR=$dest PKG_CONFIG_PATH=$pc pkg-config --cflags --libs tern) \
        $(pkg-config --cflags libbson-1.0 2>/dev/null) \
        -o "$dest/consumer-cxx" || return 1
    local libdir rc=0
    libdir=$(dirname "$(find "$dest" -name 'libtern.so' | head -n 1)")
    LD_LIBRARY_PATH=$libdir timeout 20 "$dest/hello" | grep -q '^hello, world$' || rc=1
    LD_LIBRARY_PATH=$libdir timeout 20 "$dest/consumer-cxx" || rc=1
    sh tests/abi/exports.sh "$libdir/libtern.so" "$(dirname "$(find "$dest" -name tern.h | head -n 1)")" || rc=1
    # ternd's man pages (where scdoc is), unit and example configuration.
    local f
    for f in ternd.service ternd.conf.example $(command -v scdoc >/dev/null &&
                                               echo ternd.8 ternd.conf.5 tern.1 rpcbench.1); do
        [ -n "$(find "$dest" -name "$f" | head -n 1)" ] || { log "not installed: $f"; rc=1; }
    done
    rm -rf "$dest"
    return $rc
}

# The libFuzzer targets (docs/FUZZING.md), each a test: a crash, a leak or
# a sanitizer report fails it, and tests/fuzz/run.sh prints the path of the
# input that did it.
fuzz() {
    local secs=${FUZZ_SECONDS:-15} t
    log "fuzz targets, ${secs} s each (clang, libFuzzer, ASan + UBSan)"
    if ! CC=clang build build-fuzz -Dfuzz=true -Db_sanitize=address,undefined \
        -Db_lundef=false -Db_lto=false -Dtests=false; then
        FAILED=$((FAILED + 1)); log "FAIL build-fuzz"
        return
    fi
    for t in build-fuzz/tests/fuzz/fuzz_*; do
        [ -f "$t" ] && [ -x "$t" ] || continue
        t=${t##*/fuzz_}
        count "fuzz-$t" tests/fuzz/run.sh build-fuzz "$secs" "$t"
    done
}

run_tests() {
    log "build with warnings as errors"
    if build build -Dwerror=true; then
        log "test suites"
        suite build
        count cli-smoke tests/cli_smoke.sh build
        count rpcbench-smoke tests/rpcbench_smoke.sh build/tools/rpcbench/rpcbench
        count plot-smoke tests/plot_smoke.sh build/tools/rpcbench/rpcbench
        count rpcbench-kv-smoke tests/rpcbench_kv_smoke.sh build/tools/rpcbench/rpcbench
        count rpcbench-doc-smoke tests/rpcbench_doc_smoke.sh build/tools/rpcbench/rpcbench
        count rpcbench-blocksync-smoke tests/rpcbench_bs_smoke.sh build/tools/rpcbench/rpcbench
        count chain-smoke tests/chain_smoke.sh build
        count chain-kill-50 tests/kill_chain.sh build 50
        count ternd-smoke tests/ternd_smoke.sh build
        count ternd-resp tests/ternd_resp.sh build
        count ternd-config tests/ternd_config.sh build
        count ternd-peers tests/ternd_peers.sh build
        count ternd-cluster tests/ternd_cluster.sh build
        count ternd-failover tests/ternd_failover.sh build
        count ternd-members tests/ternd_members.sh build
        count rack tests/rack.sh build
        count ternd-partition tests/ternd_partition.sh build
        count ternd-partition-doc tests/ternd_partition_doc.sh build
        count ternd-replset tests/ternd_replset.sh build
        count installed-library-consumer consumer
        # One CRUD script through three real MongoDB clients against
        # ternd's gateway and through the native API; each transcript
        # against the expected one and the others (tests/mongo/README.md).
        for c in native pymongo mongoc mongosh; do
            count "mongo-$c" tests/mongo/run.sh build "$c"
        done
    else
        FAILED=$((FAILED + 1)); log "FAIL build"
    fi
    log "the same suites under AddressSanitizer + UBSan"
    if build build-asan -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false \
        -Dbuildtype=debug; then
        ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
            UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 suite build-asan
    else
        FAILED=$((FAILED + 1)); log "FAIL build-asan"
    fi
    fuzz
    # The last line is exactly "N passed, N failed" (CI reads it); checks
    # that could not run here are said on the line before.
    [ "$SKIPPED" -eq 0 ] || echo "$SKIPPED skipped (see SKIP above)"
    echo "$PASSED passed, $FAILED failed"
    [ "$FAILED" -eq 0 ]
}

case "${1:-}" in
    bench) install_deps; run_bench ;;
    test) install_deps; install_mongosh; run_tests ;;
    *) echo "usage: $0 bench|test" >&2; exit 2 ;;
esac

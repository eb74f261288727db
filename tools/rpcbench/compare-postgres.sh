#!/usr/bin/env bash
# ternd's document service against PostgreSQL 15 with a JSONB table, on the
# same documents and operations, in one run (issue 18's bar; the design is
# docs of the research, mongo-wire.md section 4).
#
#   tools/rpcbench/compare-postgres.sh [--ternd PATH] [--mongo-load PATH]
#       [--records N] [--keys K] [--clients C] [--seconds S] [--rounds R]
#       [--modes durable,memory] [--py-ops N] [--disk-dir DIR]
#
# Documents: rpcbench doc's, about 1 KiB: _id, f1 the text of id mod K
# (the indexed field, N/K hits per find; K = N/10 + 1 by default), nine
# more fields of 96 letters, and cnt.
# PostgreSQL: CREATE TABLE docs (id bigint PRIMARY KEY, doc jsonb) with an
# expression index on (doc->>'f1'); pgbench -M prepared with one custom
# script per operation. ternd: --mongo-port, driven through the MongoDB C
# driver by mongo-load (same documents, same operations, same key
# distribution: uniform).
#   insert  one new document         INSERT ... jsonb_build_object(...)
#   read    find {_id: k} limit 1    SELECT doc WHERE id = k
#   find    find {f1: v}             SELECT doc WHERE doc->>'f1' = v
#   update  $inc cnt, $set f2        UPDATE ... SET doc = doc || jsonb_build_object(...)
# Both over TCP on 127.0.0.1 with the same number of clients, each one call
# at a time; the server pinned to CPU 0 and the load to CPU 1.
#
# Modes, each a fresh server and data directory:
#   durable  PostgreSQL with fsync, synchronous_commit and full_page_writes
#            on (wal_sync_method fdatasync); ternd's pool on the same disk
#            (every write msync()ed before its reply). Both in --disk-dir
#            (default /var/tmp).
#   memory   PGDATA on tmpfs (/dev/shm), fsync still on; ternd's pool on
#            tmpfs with PMEM_IS_PMEM_FORCE=1 (libpmem flushes cache lines
#            before each reply).
# Server CPU per operation: the growth of utime+stime over the phase, for
# PostgreSQL of the postmaster and all its children, those reaped
# included (the postmaster's cutime+cstime, read once pgbench's backends
# are reaped), for ternd of its process; divided by the operations done.
#
# Then the same four operations from Python, one client, --py-ops each:
# psycopg2 against PostgreSQL, pymongo against ternd (Debian's packages, so
# Debian's /usr/bin/python3). This is the latency a Python program sees; the
# Python client is most of it.
#
# Then, apart (its client is not pgbench's kind: one client with C calls in
# flight, find one cursor at a time, and the server's busy time as rpcbench
# measures it rather than /proc), tern's native RPC path over tcp on the same
# documents: rpcbench doc, with a server of its own on a pool in the mode's
# directory.
#
# Prints a row per (mode, client, op, system) with the medians over rounds,
# then the ratios tern/PostgreSQL. Needs root (runs PostgreSQL as the
# postgres user) or a user that may run PostgreSQL.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
TERND=${TERND:-$here/../../build/tools/ternd/ternd}
MONGO_LOAD=${MONGO_LOAD:-$here/../../build/tools/rpcbench/mongo-load}
RPCBENCH=${RPCBENCH:-$here/../../build/tools/rpcbench/rpcbench}
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
RECORDS=100000
KEYS=""
CLIENTS=4
SECONDS_=10
ROUNDS=1
MODES=durable,memory
PY_OPS=3000
DISK_DIR=/var/tmp

usage() {
    echo "usage: $0 [--ternd PATH] [--mongo-load PATH] [--records N] [--keys K] [--clients C]" \
         "[--seconds S] [--rounds R] [--modes durable,memory] [--py-ops N] [--disk-dir DIR]" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || usage
    case $1 in
        --ternd) TERND=$2 ;;
        --mongo-load) MONGO_LOAD=$2 ;;
        --records) RECORDS=$2 ;;
        --keys) KEYS=$2 ;;
        --clients) CLIENTS=$2 ;;
        --seconds) SECONDS_=$2 ;;
        --rounds) ROUNDS=$2 ;;
        --modes) MODES=$2 ;;
        --py-ops) PY_OPS=$2 ;;
        --disk-dir) DISK_DIR=$2 ;;
        *) usage ;;
    esac
    shift 2
done
[ -n "$KEYS" ] || KEYS=$((RECORDS / 10 + 1))

skip() { echo "SKIP: $*" >&2; exit 0; }
[ -x "$PGBIN/postgres" ] && [ -x "$PGBIN/pgbench" ] ||
    skip "no PostgreSQL 15 in $PGBIN (apt-get install postgresql-15)"
[ -x "$TERND" ] || { echo "no ternd at $TERND (build first, or --ternd PATH)" >&2; exit 2; }
help=$("$TERND" --help 2>&1 || true)   # whole: grep -q would leave early (SIGPIPE)
grep -q -- --mongo-port <<<"$help" || skip "$TERND has no --mongo-port"
[ -x "$MONGO_LOAD" ] ||
    skip "no mongo-load at $MONGO_LOAD (it is built when libmongoc-dev is installed)"
PY=/usr/bin/python3
py_pair=1
$PY -c 'import pymongo, psycopg2' 2>/dev/null || {
    echo "# no Python pair: Debian's python3-pymongo and python3-psycopg2 are needed" >&2
    py_pair=0
}
# PostgreSQL refuses to run as root: it runs as the postgres user then.
as_pg=()
if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || skip "running as root and there is no postgres user"
    as_pg=(runuser -u postgres --)
fi
cpu_server=(taskset -c 0)
cpu_client=(taskset -c 1)
[ "$(nproc)" -ge 2 ] || { cpu_server=(); cpu_client=(); }

HZ=$(getconf CLK_TCK)
PGPORT=$((20000 + RANDOM % 10000))
results=$(mktemp)
native=$(mktemp)
DATA=""
PG_DATA=""
TPID=""

cleanup() {
    if [ -n "$PG_DATA" ]; then
        "${as_pg[@]}" "$PGBIN/pg_ctl" -D "$PG_DATA" -m immediate stop >/dev/null 2>&1 || true
    fi
    if [ -n "$TPID" ]; then
        kill "$TPID" 2>/dev/null && wait "$TPID" 2>/dev/null || true
    fi
    [ -n "$DATA" ] && rm -rf "$DATA"
    rm -f "$results" "$native"
}
trap cleanup EXIT

# utime+stime of a process, and of its reaped children with --reaped.
ticks() {
    awk -v r="${2:-}" '{sub(/^.*\) /, ""); t = $12 + $13; if (r) t += $14 + $15; print t}' \
        "/proc/$1/stat" 2>/dev/null || echo 0
}

# All of PostgreSQL: the postmaster with what it reaped, and its children.
pg_ticks() {
    local pm t c
    pm=$(head -n 1 "$PG_DATA/postmaster.pid")
    t=$(ticks "$pm" reaped)
    for c in $(ps --ppid "$pm" -o pid=); do
        t=$((t + $(ticks "$c")))
    done
    echo "$t"
}

pg_children() { ps --ppid "$(head -n 1 "$PG_DATA/postmaster.pid")" --no-headers | wc -l; }

# Until the backends of a finished pgbench are reaped (their time is in the
# postmaster's cutime only then; it takes up to a second), at most 10 s.
pg_settle() {
    for _ in $(seq 200); do
        [ "$(pg_children)" -le "$1" ] && return 0
        sleep 0.05
    done
}

tern_ticks() { ticks "$TPID"; }

# record SYSTEM MODE CLIENT OP OPS SECONDS TICKS
record() {
    awk -v s="$1" -v m="$2" -v c="$3" -v o="$4" -v n="$5" -v secs="$6" -v t="$7" -v hz="$HZ" \
        'BEGIN {printf "%s %s %s %s %.1f %.2f\n", s, m, c, o, n / secs, t / hz / n * 1e6}' \
        >>"$results"
}

psql_() { psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PGPORT" -U postgres "$@"; }

start_pg() {
    local mode=$1
    PG_DATA=$DATA/pg
    mkdir -p "$PG_DATA"
    touch "$DATA/pg.log"
    [ ${#as_pg[@]} -eq 0 ] || chown postgres: "$PG_DATA" "$DATA/pg.log"
    "${as_pg[@]}" "$PGBIN/initdb" -D "$PG_DATA" -U postgres --auth=trust -E UTF8 >/dev/null
    cat >>"$PG_DATA/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $PGPORT
unix_socket_directories = '$PG_DATA'
shared_buffers = 1GB
max_connections = 100
fsync = on
synchronous_commit = on
full_page_writes = on
wal_sync_method = fdatasync
max_wal_size = 8GB
checkpoint_timeout = 30min
EOF
    "${cpu_server[@]}" "${as_pg[@]}" "$PGBIN/pg_ctl" -D "$PG_DATA" -l "$DATA/pg.log" -w start \
        >/dev/null
    echo "# $mode: PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}') in $PG_DATA" \
         "($(stat -f -c %T "$PG_DATA"))" >&2
    psql_ -d postgres -c "CREATE DATABASE bench" >/dev/null
    # The document of rpcbench doc and mongo-load.c: fj is 96 copies of the
    # letter 'a' + (id + j) mod 26, f1 the text of id mod K; cnt 0.
    psql_ -d bench >/dev/null <<EOF
CREATE FUNCTION l(i bigint, j int) RETURNS text IMMUTABLE LANGUAGE sql AS \$\$
  SELECT repeat(chr(97 + ((i + j) % 26)::int), 96)
\$\$;
CREATE FUNCTION mkdoc(i bigint) RETURNS jsonb IMMUTABLE LANGUAGE sql AS \$\$
  SELECT jsonb_build_object('_id', i, 'f0', l(i, 0), 'f1', (i % $KEYS)::text,
    'f2', l(i, 2), 'f3', l(i, 3), 'f4', l(i, 4), 'f5', l(i, 5), 'f6', l(i, 6),
    'f7', l(i, 7), 'f8', l(i, 8), 'f9', l(i, 9), 'cnt', 0)
\$\$;
CREATE TABLE docs (id bigint PRIMARY KEY, doc jsonb NOT NULL);
CREATE SEQUENCE ins START 1099511627776;
INSERT INTO docs SELECT i, mkdoc(i) FROM generate_series(0, $RECORDS - 1) AS i;
CREATE INDEX docs_f1 ON docs ((doc->>'f1'));
VACUUM ANALYZE docs;
CHECKPOINT;
EOF
}

stop_pg() {
    "${as_pg[@]}" "$PGBIN/pg_ctl" -D "$PG_DATA" -m fast -w stop >/dev/null
    PG_DATA=""
}

start_ternd() {
    local mode=$1 env=() port
    [ "$mode" = memory ] && env=(PMEM_IS_PMEM_FORCE=1)
    env "${env[@]}" "${cpu_server[@]}" "$TERND" --data-dir "$DATA/ternd" \
        --listen tcp://127.0.0.1:0 --no-shm --mongo-port 0 ${TERND_ARGS:-} \
        >"$DATA/ternd.out" 2>"$DATA/ternd.err" &
    TPID=$!
    for _ in $(seq 200); do
        port=$(sed -n 's/.* mongo=[^ ]*:\([0-9][0-9]*\).*/\1/p' "$DATA/ternd.out")
        [ -n "$port" ] && break
        kill -0 "$TPID" 2>/dev/null || break
        sleep 0.05
    done
    [ -n "$port" ] || { echo "ternd did not start: $(cat "$DATA/ternd.out" "$DATA/ternd.err")" >&2; exit 1; }
    TURI=mongodb://127.0.0.1:$port
    echo "# $mode: $(head -n 1 "$DATA/ternd.out") ($(stat -f -c %T "$DATA"))" >&2
    "${cpu_client[@]}" "$MONGO_LOAD" --uri "$TURI" --db bench --op load --records "$RECORDS" \
        --keys "$KEYS" >&2
}

stop_ternd() {
    kill "$TPID"
    wait "$TPID" || echo "# ternd exited with $? on SIGTERM" >&2
    TPID=""
}

# pgbench script of each operation.
write_scripts() {
    printf '%s\n' "INSERT INTO docs SELECT i, mkdoc(i) FROM (SELECT nextval('ins') AS i) AS s;" \
        >"$DATA/insert.sql"
    printf '%s\n' "\\set id random(0, $((RECORDS - 1)))" \
        'SELECT doc FROM docs WHERE id = :id;' >"$DATA/read.sql"
    printf '%s\n' "\\set v random(0, $((KEYS - 1)))" \
        "SELECT doc FROM docs WHERE doc->>'f1' = :v::text;" >"$DATA/find.sql"
    printf '%s\n' "\\set id random(0, $((RECORDS - 1)))" \
        "UPDATE docs SET doc = doc || jsonb_build_object('cnt', (doc->>'cnt')::int + 1, 'f2', repeat('u', 96)) WHERE id = :id;" \
        >"$DATA/update.sql"
}

OPS=(insert read find update)

run_pg() {
    local mode=$1 op before after out n secs base
    for op in "${OPS[@]}"; do
        base=$(pg_children)
        before=$(pg_ticks)
        out=$("${cpu_client[@]}" "$PGBIN/pgbench" -h 127.0.0.1 -p "$PGPORT" -U postgres -n \
              -M prepared -c "$CLIENTS" -j 1 -T "$SECONDS_" -f "$DATA/$op.sql" bench 2>&1) ||
            { echo "pgbench $op: $out" >&2; exit 1; }
        pg_settle "$base"
        after=$(pg_ticks)
        n=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
        secs=$(echo "$out" | awk -v n="$n" '/^tps = / {print n / $3; exit}')
        [ "$(echo "$out" | sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p')" = 0 ] ||
            { echo "pgbench $op failed transactions: $out" >&2; exit 1; }
        record postgres "$mode" c "$op" "$n" "$secs" $((after - before))
    done
}

run_tern() {
    local mode=$1 op before after out n secs
    for op in "${OPS[@]}"; do
        before=$(tern_ticks)
        out=$("${cpu_client[@]}" "$MONGO_LOAD" --uri "$TURI" --db bench --op "$op" \
              --clients "$CLIENTS" --seconds "$SECONDS_" --records "$RECORDS" --keys "$KEYS" 2>&1) ||
            { echo "mongo-load $op: $out" >&2; exit 1; }
        after=$(tern_ticks)
        n=$(echo "$out" | sed -n 's/.* ops=\([0-9]*\) .*/\1/p')
        secs=$(echo "$out" | sed -n 's/.* seconds=\([0-9.]*\) .*/\1/p')
        echo "$out" | grep -q ' misses=0 ' || echo "# tern $op: $out" >&2
        record tern "$mode" c "$op" "$n" "$secs" $((after - before))
    done
}

# The Python pair: "SYSTEM OP OPS SECONDS TICKS" lines from compare-postgres.py.
run_py() {
    local sys=$1 mode=$2 line
    [ "$py_pair" = 1 ] || return 0
    while read -r line; do
        # shellcheck disable=SC2086  # the fields are meant to split
        record $sys "$mode" py $line
    done < <("${cpu_client[@]}" $PY "$here/compare-postgres.py" "$sys" \
             "$([ "$sys" = postgres ] && echo "127.0.0.1:$PGPORT" || echo "$TURI")" \
             "$([ "$sys" = postgres ] && head -n 1 "$PG_DATA/postmaster.pid" || echo "$TPID")" \
             "$PY_OPS" "$RECORDS" "$KEYS")
}

# rpcbench doc over tcp, same documents and client count: "MODE OP OPS/S BUSY_US".
run_native() {
    local mode=$1
    "$RPCBENCH" doc --help >/dev/null 2>&1 || return 0
    "$RPCBENCH" doc --fabric tcp --workload insert,read,find,update --records "$RECORDS" \
        --iters $((PY_OPS * 10)) --window "$CLIENTS" --cpu 1,0 --pool-dir "$DATA" --json 2>&1 |
        $PY -c '
import json, sys
for line in sys.stdin:
    try:
        j = json.loads(line)
    except ValueError:
        print("# rpcbench doc: " + line.strip(), file=sys.stderr)
        continue
    print(sys.argv[1], j["workload"].split("-", 1)[1], j["ops_per_s"], j["server_busy_us_per_op"])
' "$mode" >>"$native"
}

echo "# $RECORDS documents, $KEYS values of f1, $CLIENTS clients, ${SECONDS_} s per phase," \
     "$ROUNDS rounds; Python: $PY_OPS calls per op" >&2
for round in $(seq "$ROUNDS"); do
    for mode in ${MODES//,/ }; do
        case $mode in
            durable) DATA=$(mktemp -d "$DISK_DIR/tern-pgcmp-XXXXXX") ;;
            memory) DATA=$(mktemp -d /dev/shm/tern-pgcmp-XXXXXX) ;;
            *) echo "unknown mode $mode (durable, memory)" >&2; exit 2 ;;
        esac
        chmod 755 "$DATA"
        write_scripts
        start_pg "$mode"
        run_pg "$mode"
        run_py postgres "$mode"
        stop_pg
        start_ternd "$mode"
        run_tern "$mode"
        run_py tern "$mode"
        stop_ternd
        run_native "$mode"
        rm -rf "$DATA"
        DATA=""
    done
    echo "# round $round done" >&2
done

$PY - "$results" "$native" "$CLIENTS" <<'EOF'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    s, m, c, o, ops, cpu = line.split()
    rows.setdefault((m, c, o, s), []).append((float(ops), float(cpu)))
med = {k: (statistics.median(r for r, _ in v), statistics.median(c for _, c in v))
       for k, v in rows.items()}
order = {"insert": 0, "read": 1, "find": 2, "update": 3}
keys = sorted({k[:3] for k in med}, key=lambda k: (k[0], k[1], order.get(k[2], 9)))
print(f"{'mode':8} {'client':6} {'op':7} {'pg ops/s':>10} {'tern ops/s':>11} {'ratio':>6}"
      f" {'pg us/op':>9} {'tern us/op':>11} {'ratio':>6}")
for m, c, o in keys:
    pg, t = med.get((m, c, o, "postgres")), med.get((m, c, o, "tern"))
    if not pg or not t:
        continue
    cpu_ratio = f"{t[1] / pg[1]:>6.2f}" if pg[1] else f"{'-':>6}"
    print(f"{m:8} {c:6} {o:7} {pg[0]:>10.0f} {t[0]:>11.0f} {t[0] / pg[0]:>6.2f}"
          f" {pg[1]:>9.1f} {t[1]:>11.1f} {cpu_ratio}")
print("ratio = tern / PostgreSQL: above 1 is more ops/s for tern, below 1 less server CPU per op;"
      " us/op = server CPU microseconds per operation")
nat = {}
for line in open(sys.argv[2]):
    m, o, ops, busy = line.split()
    nat.setdefault((m, o), []).append((float(ops), float(busy)))
if nat:
    print(f"\ntern native RPC over tcp (rpcbench doc, window {sys.argv[3]}, find one at a time;"
          " server busy us/op as rpcbench measures it)")
    print(f"{'mode':8} {'op':7} {'ops/s':>10} {'busy us/op':>11}")
    for m, o in sorted(nat, key=lambda k: (k[0], order.get(k[1], 9))):
        v = nat[(m, o)]
        print(f"{m:8} {o:7} {statistics.median(r for r, _ in v):>10.0f}"
              f" {statistics.median(b for _, b in v):>11.1f}")
EOF

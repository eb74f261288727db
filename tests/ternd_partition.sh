#!/usr/bin/env bash
# A replicated KV shard on rack hosts (network namespaces, root), its
# primary's host cut off twice under YCSB-A with w=majority while a client
# on that host writes to it alone: no write acknowledged to that client, no
# acknowledged write lost by the other, writes back within twice the lease,
# the shard converged after each heal. The benchmark script does the work
# (tools/rpcbench/partition-kv.sh); this is its short form for the test run.
#
#   tests/ternd_partition.sh BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../tools/rpcbench/partition-kv.sh" "${1:?usage: ternd_partition.sh BUILD_DIR}" 2 6 2

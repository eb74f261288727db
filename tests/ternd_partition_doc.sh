#!/usr/bin/env bash
# A replicated document shard on rack hosts (network namespaces, root), its
# primary's host cut off twice while pymongo writes from another host with
# w: majority and a client on the cut-off host writes to the old primary
# alone: no write acknowledged to that client, no acknowledged write lost
# by the application, writes back within twice the lease, the shard
# converged after each heal and every member holding every acknowledged
# write. The benchmark script does the work (tools/rpcbench/
# partition-doc.sh); this is its short form for the test run.
#
#   tests/ternd_partition_doc.sh BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../tools/rpcbench/partition-doc.sh" "${1:?usage: ternd_partition_doc.sh BUILD_DIR}" 2 6 2

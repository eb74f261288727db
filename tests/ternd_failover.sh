#!/usr/bin/env bash
# A replicated KV shard of three ternds and an etcd on this host, YCSB-A
# with w=majority against it, its primary killed with SIGKILL three times:
# no acknowledged write lost, writes back within twice the lease. The
# benchmark script does the work (tools/rpcbench/failover-kv.sh, 50 rounds
# there); this is its short form for the test run. Then etcd is killed and
# started again 5 s later (writes must go on meanwhile), and then the
# primary killed (an election right after etcd came back), and then the new
# primary stopped for 5 s with its clients connected (SIGSTOP).
#
#   tests/ternd_failover.sh BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: ternd_failover.sh BUILD_DIR}
"$here/../tools/rpcbench/failover-kv.sh" "$build" 3 2 5
VICTIM=mixed ETCD_DOWN=5 exec "$here/../tools/rpcbench/failover-kv.sh" "$build" 3 2 4

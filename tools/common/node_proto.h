/* The node service: what a running ternd says about itself, asked by
 * `tern ping` and `tern status` over tern RPC (any fabric).
 *
 *   NODE_M_PING    request: up to NODE_PING_MAX bytes; reply: the same bytes.
 *   NODE_M_STATUS  request: empty; reply: one JSON object (UTF-8, no NUL):
 *       {"node", "rack", "uptime_s", "pid", "version", "services": [...],
 *        "listen": [...], "clients",
 *        "peers": [{"node", "rack", "address", "state" ("up", "down",
 *                   "connecting"), "fabric", "policy", "calls", "calls_per_s",
 *                   "errors", "bytes", "failovers", "moves", "credits",
 *                   "rtt_us", "standby", "last_error"}]}
 *
 * The reply is built by ternd (tools/ternd/node.c) and read by the CLI
 * with json-c (tools/tern/node.c); a field may be added, never changed.
 */
#ifndef TERN_NODE_PROTO_H
#define TERN_NODE_PROTO_H

#define NODE_SERVICE_ID 0x6e64       /* "nd" */
#define NODE_M_PING 1
#define NODE_M_STATUS 2
#define NODE_PING_MAX 64

#endif

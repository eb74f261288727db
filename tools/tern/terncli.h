/* tern's subcommands beside `tern pool`. */
#ifndef TERN_CLI_H
#define TERN_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* `tern doc PATH` or `tern doc --uri URI`: argv holds what follows "doc".
 * Returns the exit status. */
int tern_doc_cmd(int argc, char **argv);

/* `tern chain gen|append|info|verify ...`: argv holds what follows
 * "chain". Returns the exit status. */
int tern_chain_cmd(int argc, char **argv);

/* `tern ping ...` and `tern status ...` (cmd: "ping" or "status"); argv
 * holds what follows the command. Returns the exit status. */
int tern_node_cmd(const char *cmd, int argc, char **argv);

/* `tern shard define|list ...` (built with services/cluster). */
int tern_shard_cmd(int argc, char **argv);

/* An RPC endpoint holding the cluster key of key_file, else of
 * $TERN_KEY_FILE, else none; what went wrong is said on stderr. The
 * caller closes it (tern_rpc_close). */
struct tern_rpc_ep;
int tern_cli_endpoint(const char *key_file, struct tern_rpc_ep **ep);

/* ADDRESS as a URI: HOST:PORT becomes auto://HOST:PORT, a URI stays. */
void tern_cli_uri(const char *addr, char *uri, size_t cap);

/* `tern kv get|put|del|scan|stat ADDRESS ...` over the native KV RPC
 * (kv.c); argv holds what follows "kv". Returns the exit status. */
int tern_kv_cmd(int argc, char **argv);

/* `tern info [--json] [--ntb-eal ARGS]`: the fabrics of this host and the
 * settings in force (info.c). */
int tern_info_cmd(int argc, char **argv);

/* `tern ntb pull|plug ntb://emu:NAME`. */
int tern_ntb_cmd(int argc, char **argv);

/* A node's STATUS reply (tools/common/node_proto.h) as a table, or as the
 * JSON it is (checked first): 0, or -1 if it is not one JSON object. */
int tern_status_print(FILE *f, const char *reply, size_t len, bool as_json);

#endif

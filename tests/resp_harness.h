/* A test's RESP gateway on a store in a temporary pool, and clients of it
 * in the same process: a client sends with MSG_DONTWAIT and, while it waits
 * for a reply, polls the gateway itself (pump()), and a collection engine on
 * a pool of its own. Shared by the resp, resp_keys and resp_coll suites;
 * setup()/teardown() are their fixture. */
#ifndef TERN_TEST_RESP_HARNESS_H
#define TERN_TEST_RESP_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/coll/coll.h"
#include "kv_store.h"
#include "resp.h"

#define WAIT_MS 5000
#define POOL_SIZE (8u << 20)
#define SEG_SIZE (64u * 1024)

struct conn {
    int fd;
    bool eof;
    char *buf;              /* received, not yet consumed */
    size_t len, cap;
};

extern char dir[64];
extern char pool_path[128];
extern char coll_path[128];
extern struct kvs *store;
extern struct kvc *coll;        /* every gateway's collection engine */
extern struct resp_gw *gw;
extern long cmds_run;

void store_open(void);
void coll_open(void);
void store_recreate(uint64_t pool_size, uint32_t seg_size);
void gw_open(const struct resp_config *cfg);
void gw_close(void);
void setup(void);
void teardown(void);
void pump(void);
struct conn *conn_open_port(uint16_t port);
struct conn *conn_open(void);
void conn_close(struct conn *c);
void conn_drain(struct conn *c);
void conn_send(struct conn *c, const void *data, size_t len);
void conn_sends(struct conn *c, const char *s);
void conn_cmdv(struct conn *c, int argc, const char *const *argv, const size_t *lens);
void conn_cmd(struct conn *c, ...);
void conn_wait(struct conn *c, size_t want);
void conn_consume(struct conn *c, size_t n);
const char *show(const char *p, size_t n);
void expect_n(struct conn *c, const char *want, size_t len);
void expect(struct conn *c, const char *want);
void expect_prefix(struct conn *c, const char *prefix);
size_t reply_size(const char *b, size_t n);
char *next_reply(struct conn *c, size_t *len);
bool conn_closed(struct conn *c);
unsigned long long info_number(struct conn *c, const char *section, const char *field);
#define CMD(c, ...) conn_cmd((c), __VA_ARGS__, (const char *)NULL)

#endif

/* The etcd client and a node's membership (services/cluster) against a
 * real etcd (Debian's etcd-server), which each test starts on ports of
 * its own in a directory of its own and kills at the end. Without
 * /usr/bin/etcd the tests say SKIP. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "etcd.h"
#include "helpers.h"
#include "member.h"
#include "shard.h"
#include "suites.h"
#include "tern.h"

#define ETCD_BIN "/usr/bin/etcd"

struct etcd_proc {
    pid_t pid;
    char dir[64];
    int client_port, peer_port;
    char url[64];
};

static int free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port;

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static bool have_etcd(void)
{
    if (access(ETCD_BIN, X_OK) == 0)
        return true;
    printf("SKIP: %s is not installed (Debian's etcd-server)\n", ETCD_BIN);
    return false;
}

/* Start (or restart, same directory and ports) and wait until it takes a
 * put. */
static void etcd_run(struct etcd_proc *p)
{
    struct cl_etcd *e;
    double end;
    int rc = -1;

    if (!p->dir[0]) {
        snprintf(p->dir, sizeof(p->dir), "/tmp/tern-etcd.XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(p->dir));
        p->client_port = free_port();
        p->peer_port = free_port();
        snprintf(p->url, sizeof(p->url), "http://127.0.0.1:%d", p->client_port);
    }
    p->pid = fork();
    ck_assert_int_ge(p->pid, 0);
    if (p->pid == 0) {
        char data[96], client[64], peer[64], cluster[96];
        int devnull = open("/dev/null", O_WRONLY);

        snprintf(data, sizeof(data), "%s/data", p->dir);
        snprintf(client, sizeof(client), "http://127.0.0.1:%d", p->client_port);
        snprintf(peer, sizeof(peer), "http://127.0.0.1:%d", p->peer_port);
        snprintf(cluster, sizeof(cluster), "t=%s", peer);
        dup2(devnull, 1);
        dup2(devnull, 2);
        execl(ETCD_BIN, "etcd", "--name", "t", "--data-dir", data, "--listen-client-urls",
              client, "--advertise-client-urls", client, "--listen-peer-urls", peer,
              "--initial-advertise-peer-urls", peer, "--initial-cluster", cluster,
              "--log-level", "error", (char *)NULL);
        _exit(127);
    }
    ck_assert_int_eq(cl_etcd_open(p->url, 500, &e), 0);
    for (end = now_ms() + 20000; now_ms() < end; usleep(50000))
        if ((rc = cl_etcd_put(e, "/up", "1", 1, 0, NULL)) == 0)
            break;
    cl_etcd_close(e);
    ck_assert_msg(rc == 0, "etcd never came up: %s", tern_strerror(rc));
}

static void etcd_kill(struct etcd_proc *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        p->pid = 0;
    }
}

static void etcd_stop(struct etcd_proc *p)
{
    char cmd[96];

    etcd_kill(p);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", p->dir);
    ck_assert_int_eq(system(cmd), 0);
}

struct seen {
    unsigned n;
    char keys[8][64];
    char vals[8][64];
    int64_t lease[8];
};

static int collect(void *arg, const struct cl_kv *kv)
{
    struct seen *s = arg;

    if (s->n < 8) {
        snprintf(s->keys[s->n], 64, "%.*s", (int)kv->key_len, kv->key);
        snprintf(s->vals[s->n], 64, "%.*s", (int)kv->value_len, (const char *)kv->value);
        s->lease[s->n] = kv->lease;
    }
    s->n++;
    return 0;
}

START_TEST(keys_put_get_and_delete)
{
    struct etcd_proc p = {0};
    struct cl_etcd *e;
    struct seen s = {0};
    int64_t rev = 0, rev2 = 0, n = 0;
    char big[CL_KEY_MAX + 2];

    if (!have_etcd())
        return;
    etcd_run(&p);
    ck_assert_int_eq(cl_etcd_open(p.url, 0, &e), 0);
    ck_assert_int_eq(cl_etcd_put(e, "/t/b", "two", 3, 0, &rev), 0);
    ck_assert_int_eq(cl_etcd_put(e, "/t/a", "one", 3, 0, &rev2), 0);
    ck_assert_int_gt(rev2, rev);
    ck_assert_int_eq(cl_etcd_put(e, "/t/c", "", 0, 0, NULL), 0);       /* empty value */
    ck_assert_int_eq(cl_etcd_put(e, "/u", "x", 1, 0, NULL), 0);
    ck_assert_int_eq(cl_etcd_get(e, "/t/", true, collect, &s, NULL), 0);
    ck_assert_uint_eq(s.n, 3);      /* in key order, /u left out */
    ck_assert_str_eq(s.keys[0], "/t/a");
    ck_assert_str_eq(s.vals[0], "one");
    ck_assert_str_eq(s.keys[1], "/t/b");
    ck_assert_str_eq(s.keys[2], "/t/c");
    ck_assert_str_eq(s.vals[2], "");
    memset(&s, 0, sizeof(s));
    ck_assert_int_eq(cl_etcd_get(e, "/t/b", false, collect, &s, NULL), 0);
    ck_assert_uint_eq(s.n, 1);
    memset(&s, 0, sizeof(s));
    ck_assert_int_eq(cl_etcd_get(e, "/none", false, collect, &s, NULL), 0);
    ck_assert_uint_eq(s.n, 0);
    ck_assert_int_eq(cl_etcd_delete(e, "/t/", true, &n), 0);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(cl_etcd_get(e, "/t/", true, collect, &s, NULL), 0);
    ck_assert_uint_eq(s.n, 0);
    /* What is refused before anything is sent. */
    memset(big, 'k', sizeof(big) - 1);
    big[0] = '/';
    big[sizeof(big) - 1] = 0;
    ck_assert_int_eq(cl_etcd_put(e, big, "x", 1, 0, NULL), TERN_E2BIG);
    ck_assert_int_eq(cl_etcd_put(e, "", "x", 1, 0, NULL), TERN_EINVAL);
    ck_assert_int_eq(cl_etcd_put(e, "/v", "x", CL_VALUE_MAX + 1, 0, NULL), TERN_E2BIG);
    cl_etcd_close(e);
    etcd_stop(&p);
}
END_TEST

START_TEST(leases_hold_keys_until_they_end)
{
    struct etcd_proc p = {0};
    struct cl_etcd *e;
    struct seen s = {0};
    int64_t id = 0, id2 = 0, ttl = 0;

    if (!have_etcd())
        return;
    etcd_run(&p);
    ck_assert_int_eq(cl_etcd_open(p.url, 0, &e), 0);
    ck_assert_int_eq(cl_etcd_lease_grant(e, 30, &id), 0);
    ck_assert_int_ne(id, 0);
    ck_assert_int_eq(cl_etcd_put(e, "/l/a", "x", 1, id, NULL), 0);
    ck_assert_int_eq(cl_etcd_get(e, "/l/a", false, collect, &s, NULL), 0);
    ck_assert_uint_eq(s.n, 1);
    ck_assert_int_eq(s.lease[0], id);
    ck_assert_int_eq(cl_etcd_lease_keepalive(e, id, &ttl), 0);
    ck_assert_int_gt(ttl, 20);
    ck_assert_int_eq(cl_etcd_lease_revoke(e, id), 0);
    memset(&s, 0, sizeof(s));
    ck_assert_int_eq(cl_etcd_get(e, "/l/a", false, collect, &s, NULL), 0);
    ck_assert_uint_eq(s.n, 0);
    ck_assert_int_eq(cl_etcd_lease_keepalive(e, id, &ttl), TERN_ENOLEASE);
    ck_assert_int_eq(cl_etcd_lease_revoke(e, id), TERN_ENOLEASE);
    /* A lease nobody renews runs out, and its key with it. */
    ck_assert_int_eq(cl_etcd_lease_grant(e, 2, &id2), 0);
    ck_assert_int_eq(cl_etcd_put(e, "/l/b", "y", 1, id2, NULL), 0);
    for (double end = now_ms() + 10000;; usleep(100000)) {
        memset(&s, 0, sizeof(s));
        ck_assert_int_eq(cl_etcd_get(e, "/l/b", false, collect, &s, NULL), 0);
        if (!s.n)
            break;
        ck_assert_msg(now_ms() < end, "the key outlived its lease");
    }
    ck_assert_int_eq(cl_etcd_lease_keepalive(e, id2, &ttl), TERN_ENOLEASE);
    /* A put under a lease that is gone: etcd refuses it, and says why. */
    ck_assert_int_eq(cl_etcd_put(e, "/l/c", "z", 1, id2, NULL), TERN_EIO);
    ck_assert_ptr_nonnull(strstr(cl_etcd_error(e), "lease not found"));
    cl_etcd_close(e);
    etcd_stop(&p);
}
END_TEST

START_TEST(create_elects_one_and_cas_loses_no_write)
{
    struct etcd_proc p = {0};
    struct cl_etcd *a, *b;
    struct seen s = {0};
    int64_t la = 0, lb = 0;
    bool won_a = false, won_b = true, swapped = true;

    if (!have_etcd())
        return;
    etcd_run(&p);
    ck_assert_int_eq(cl_etcd_open(p.url, 0, &a), 0);
    ck_assert_int_eq(cl_etcd_open(p.url, 0, &b), 0);
    ck_assert_int_eq(cl_etcd_lease_grant(a, 30, &la), 0);
    ck_assert_int_eq(cl_etcd_lease_grant(b, 30, &lb), 0);
    ck_assert_int_eq(cl_etcd_create(a, "/e/primary", "node-a", 6, la, &won_a, NULL, NULL), 0);
    ck_assert_int_eq(cl_etcd_create(b, "/e/primary", "node-b", 6, lb, &won_b, collect, &s), 0);
    ck_assert(won_a);
    ck_assert(!won_b);
    ck_assert_uint_eq(s.n, 1);      /* the loser learns who holds it */
    ck_assert_str_eq(s.vals[0], "node-a");
    ck_assert_int_eq(s.lease[0], la);
    /* The holder's term ends: the office is free again. */
    ck_assert_int_eq(cl_etcd_lease_revoke(a, la), 0);
    ck_assert_int_eq(cl_etcd_create(b, "/e/primary", "node-b", 6, lb, &won_b, NULL, NULL), 0);
    ck_assert(won_b);
    /* Compare-and-swap on the mod revision (a put's revision is the
     * key's mod revision). */
    memset(&s, 0, sizeof(s));
    {
        int64_t mod1 = 0, mod2 = 0;

        ck_assert_int_eq(cl_etcd_put(a, "/e/map", "v1", 2, 0, &mod1), 0);
        ck_assert_int_eq(cl_etcd_put(b, "/e/map", "v2", 2, 0, &mod2), 0);
        /* a changes what it read at mod1: b wrote since, a is refused. */
        ck_assert_int_eq(cl_etcd_cas(a, "/e/map", mod1, "v3", 2, 0, &swapped), 0);
        ck_assert(!swapped);
        ck_assert_int_eq(cl_etcd_cas(a, "/e/map", mod2, "v3", 2, 0, &swapped), 0);
        ck_assert(swapped);
        /* mod 0: only if absent. */
        ck_assert_int_eq(cl_etcd_cas(a, "/e/map", 0, "v4", 2, 0, &swapped), 0);
        ck_assert(!swapped);
    }
    ck_assert_int_eq(cl_etcd_get(a, "/e/map", false, collect, &s, NULL), 0);
    ck_assert_str_eq(s.vals[0], "v3");
    cl_etcd_close(a);
    cl_etcd_close(b);
    etcd_stop(&p);
}
END_TEST

START_TEST(endpoints_down_and_wrong)
{
    struct etcd_proc p = {0};
    struct cl_etcd *e;
    int dead = free_port();
    char list[160];

    ck_assert_int_eq(cl_etcd_open("", 0, &e), TERN_EINVAL);
    ck_assert_int_eq(cl_etcd_open("https://x:1", 0, &e), TERN_EINVAL);
    ck_assert_int_eq(cl_etcd_open("http://a:1,ftp://b:2", 0, &e), TERN_EINVAL);
    snprintf(list, sizeof(list), "http://127.0.0.1:%d", dead);
    ck_assert_int_eq(cl_etcd_open(list, 300, &e), 0);
    ck_assert_int_eq(cl_etcd_put(e, "/k", "v", 1, 0, NULL), TERN_ECONNREFUSED);
    ck_assert_ptr_nonnull(strstr(cl_etcd_error(e), list));
    cl_etcd_close(e);
    if (!have_etcd())
        return;
    /* A dead endpoint first, then a live one: the call gets through, and
     * the next one goes to the live one first. */
    etcd_run(&p);
    snprintf(list, sizeof(list), "http://127.0.0.1:%d,%s", dead, p.url);
    ck_assert_int_eq(cl_etcd_open(list, 300, &e), 0);
    ck_assert_int_eq(cl_etcd_put(e, "/k", "v", 1, 0, NULL), 0);
    ck_assert_int_eq(cl_etcd_put(e, "/k", "w", 1, 0, NULL), 0);
    ck_assert_str_eq(cl_etcd_error(e), "");
    cl_etcd_close(e);
    etcd_stop(&p);
}
END_TEST

static void wait_state(struct cl_member *m, bool registered, uint64_t min_regs, int ms,
                       struct cl_member_state *st)
{
    for (double end = now_ms() + ms;; usleep(20000)) {
        cl_member_state(m, st);
        if (st->registered == registered && st->registrations >= min_regs)
            return;
        ck_assert_msg(now_ms() < end, "membership: registered %d, %llu registrations, '%s'",
                      st->registered, (unsigned long long)st->registrations, st->error);
    }
}

START_TEST(a_member_registers_renews_and_leaves)
{
    struct etcd_proc p = {0};
    struct cl_member *m;
    struct cl_member_state st;
    struct cl_etcd *e;
    struct seen s = {0};
    struct cl_member_config cfg = {.prefix = "/c1", .name = "n1", .value = "{\"name\":\"n1\"}",
                                   .ttl_s = 2};

    if (!have_etcd())
        return;
    etcd_run(&p);
    cfg.endpoints = p.url;
    ck_assert_int_eq(cl_etcd_open(p.url, 0, &e), 0);
    ck_assert_int_eq(cl_member_start(&cfg, &m), 0);
    wait_state(m, true, 1, 5000, &st);
    ck_assert_int_eq(cl_members(e, "/c1", collect, &s), 0);
    ck_assert_uint_eq(s.n, 1);
    ck_assert_str_eq(s.keys[0], "/c1/nodes/n1");
    ck_assert_str_eq(s.vals[0], "{\"name\":\"n1\"}");
    ck_assert_int_eq(s.lease[0], st.lease);
    /* Twice the lease's time later it is still there: renewed. */
    usleep(4000000);
    cl_member_state(m, &st);
    ck_assert(st.registered);
    ck_assert_uint_eq(st.registrations, 1);
    memset(&s, 0, sizeof(s));
    ck_assert_int_eq(cl_members(e, "/c1", collect, &s), 0);
    ck_assert_uint_eq(s.n, 1);
    /* Stopped: the key goes at once. */
    cl_member_stop(m);
    memset(&s, 0, sizeof(s));
    ck_assert_int_eq(cl_members(e, "/c1", collect, &s), 0);
    ck_assert_uint_eq(s.n, 0);
    cl_etcd_close(e);
    etcd_stop(&p);
}
END_TEST

START_TEST(a_member_outlives_an_etcd_restart)
{
    struct etcd_proc p = {0};
    struct cl_member *m;
    struct cl_member_state st;
    struct cl_etcd *e;
    struct seen s = {0};
    struct cl_member_config cfg = {.prefix = "/c2", .name = "n2", .value = "{}", .ttl_s = 2};

    if (!have_etcd())
        return;
    etcd_run(&p);
    cfg.endpoints = p.url;
    ck_assert_int_eq(cl_member_start(&cfg, &m), 0);
    wait_state(m, true, 1, 5000, &st);
    int64_t first;

    /* etcd away for longer than the lease: the node says it is not
     * registered (it cannot know whether its lease ran out) ... */
    first = st.lease;
    etcd_kill(&p);
    wait_state(m, false, 1, 6000, &st);
    ck_assert(strlen(st.error) > 0);
    /* ... and once etcd is back, renews the lease it held: etcd kept it
     * across the restart, and the key with it. */
    etcd_run(&p);
    wait_state(m, true, 1, 10000, &st);
    ck_assert_uint_eq(st.registrations, 1);
    ck_assert_int_eq(st.lease, first);
    ck_assert_int_eq(cl_etcd_open(p.url, 0, &e), 0);
    ck_assert_int_eq(cl_members(e, "/c2", collect, &s), 0);
    ck_assert_uint_eq(s.n, 1);
    ck_assert_int_eq(s.lease[0], first);
    /* The lease gone (ended by someone else here): registered again, under
     * a new one. */
    ck_assert_int_eq(cl_etcd_lease_revoke(e, first), 0);
    wait_state(m, true, 2, 10000, &st);
    ck_assert_int_ne(st.lease, first);
    s.n = 0;
    ck_assert_int_eq(cl_members(e, "/c2", collect, &s), 0);
    ck_assert_uint_eq(s.n, 1);
    ck_assert_int_eq(s.lease[0], st.lease);
    cl_member_stop(m);
    cl_etcd_close(e);
    etcd_stop(&p);
}
END_TEST

START_TEST(two_members_of_one_name)
{
    struct etcd_proc p = {0};
    struct cl_member *a, *b;
    struct cl_member_state st;
    struct cl_member_config cfg = {.prefix = "/c3", .name = "same", .value = "{\"who\":1}",
                                   .ttl_s = 2};

    if (!have_etcd())
        return;
    etcd_run(&p);
    cfg.endpoints = p.url;
    ck_assert_int_eq(cl_member_start(&cfg, &a), 0);
    wait_state(a, true, 1, 5000, &st);
    cfg.value = "{\"who\":2}";
    ck_assert_int_eq(cl_member_start(&cfg, &b), 0);
    usleep(1500000);
    cl_member_state(b, &st);
    ck_assert(!st.registered);
    ck_assert_msg(strstr(st.error, "another node holds the name"), "%s", st.error);
    cl_member_state(a, &st);
    ck_assert(st.registered);
    /* The first one leaves: the second takes the name. */
    cl_member_stop(a);
    wait_state(b, true, 1, 5000, &st);
    cl_member_stop(b);
    etcd_stop(&p);
}
END_TEST

START_TEST(bad_member_configurations)
{
    struct cl_member *m;
    struct cl_member_config ok = {.endpoints = "http://127.0.0.1:1", .prefix = "/p",
                                  .name = "n", .value = "{}", .ttl_s = 2};
    struct cl_member_config c;

    c = ok;
    c.ttl_s = 1;
    ck_assert_int_eq(cl_member_start(&c, &m), TERN_EINVAL);
    c = ok;
    c.prefix = "p";
    ck_assert_int_eq(cl_member_start(&c, &m), TERN_EINVAL);
    c = ok;
    c.name = "a/b";
    ck_assert_int_eq(cl_member_start(&c, &m), TERN_EINVAL);
    c = ok;
    c.name = "";
    ck_assert_int_eq(cl_member_start(&c, &m), TERN_EINVAL);
    /* Nothing answers: it keeps trying, says why, and stops cleanly. */
    ck_assert_int_eq(cl_member_start(&ok, &m), 0);
    {
        struct cl_member_state st;

        usleep(300000);
        cl_member_state(m, &st);
        ck_assert(!st.registered);
        ck_assert(strlen(st.error) > 0);
    }
    cl_member_stop(m);
}
END_TEST

START_TEST(shard_maps_parse_strictly)
{
    struct cl_shard_map m = {.id = "kv-0", .epoch = 3, .primary = "b", .n_replicas = 3,
                             .replicas = {"a", "b", "c"}}, back;
    char json[512];
    static const char *const bad[] = {
        "{\"id\":\"s\",\"epoch\":1,\"primary\":\"x\",\"replicas\":[\"a\"]}",   /* not a replica */
        "{\"id\":\"s\",\"epoch\":1,\"primary\":\"\",\"replicas\":[\"a\"]}",    /* an epoch, no primary */
        "{\"id\":\"s\",\"epoch\":0,\"primary\":\"a\",\"replicas\":[\"a\"]}",   /* a primary, no epoch */
        "{\"id\":\"s\",\"epoch\":0,\"primary\":\"\",\"replicas\":[\"a\",\"a\"]}",
        "{\"id\":\"s\",\"epoch\":0,\"primary\":\"\",\"replicas\":[]}",
        "{\"id\":\"s/x\",\"epoch\":0,\"primary\":\"\",\"replicas\":[\"a\"]}",
        "{\"id\":\"s\",\"epoch\":-1,\"primary\":\"\",\"replicas\":[\"a\"]}",
        "{\"id\":\"s\",\"epoch\":\"1\",\"primary\":\"a\",\"replicas\":[\"a\"]}",
        "{\"id\":\"s\",\"epoch\":0,\"primary\":\"\",\"replicas\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\"]}",
        "{\"id\":\"s\",\"epoch\":0,\"primary\":\"\",\"replicas\":[\"a\"]} x",
        "[1]",
        /* members changing: a learner that is a voter too, a learner as
         * primary, two changes at once, a leaving node that is no voter,
         * the only voter leaving, learners that are not a list, too many */
        "{\"id\":\"s\",\"epoch\":0,\"primary\":\"\",\"replicas\":[\"a\"],\"learners\":[\"a\"]}",
        "{\"id\":\"s\",\"epoch\":1,\"primary\":\"b\",\"replicas\":[\"a\"],\"learners\":[\"b\"]}",
        "{\"id\":\"s\",\"epoch\":0,\"primary\":\"\",\"replicas\":[\"a\"],\"learners\":[\"b\",\"c\"]}",
        "{\"id\":\"s\",\"epoch\":0,\"primary\":\"\",\"replicas\":[\"a\",\"b\"],\"learners\":[\"c\"],"
        "\"leaving\":\"a\"}",
        "{\"id\":\"s\",\"epoch\":0,\"primary\":\"\",\"replicas\":[\"a\",\"b\"],\"learners\":[\"c\"],"
        "\"leaving\":\"c\"}",
        "{\"id\":\"s\",\"epoch\":0,\"primary\":\"\",\"replicas\":[\"a\"],\"leaving\":\"a\"}",
        "{\"id\":\"s\",\"epoch\":0,\"primary\":\"\",\"replicas\":[\"a\"],\"learners\":\"b\"}",
        "{\"id\":\"s\",\"epoch\":0,\"primary\":\"\",\"replicas\":[\"a\",\"b\"],\"leaving\":7}",
        "{\"id\":\"s\",\"epoch\":0,\"primary\":\"\",\"replicas\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\"],"
        "\"learners\":[\"h\"]}",
    };
    struct cl_shard_map ch = {.id = "s", .epoch = 2, .primary = "a", .n_replicas = 3,
                              .replicas = {"a", "b", "c"}, .vote = {CL_VOTER, CL_LEAVING}};
    int n = cl_shard_map_json(&m, json, sizeof(json));

    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(cl_shard_map_parse((const uint8_t *)json, (size_t)n, &back), 0);
    ck_assert_str_eq(back.id, "kv-0");
    ck_assert_uint_eq(back.epoch, 3);
    ck_assert_str_eq(back.primary, "b");
    ck_assert_uint_eq(back.n_replicas, 3);
    ck_assert_str_eq(back.replicas[2], "c");
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(cl_shard_map_parse((const uint8_t *)bad[i], strlen(bad[i]), &back) ==
                          TERN_EPROTO, "taken: %s", bad[i]);
    ck_assert_int_eq(cl_shard_map_json(&m, json, 20), TERN_E2BIG);
    /* A voter leaving, then a learner: each prints and reads back. */
    for (int k = 0; k < 2; k++) {
        n = cl_shard_map_json(&ch, json, sizeof(json));
        ck_assert_int_gt(n, 0);
        ck_assert_ptr_nonnull(strstr(json, k ? "\"learners\":[\"c\"]" : "\"leaving\":\"b\""));
        ck_assert_int_eq(cl_shard_map_parse((const uint8_t *)json, (size_t)n, &back), 0);
        ck_assert_uint_eq(back.n_replicas, 3);
        ck_assert_int_eq(memcmp(back.vote, ch.vote, sizeof(ch.vote)), 0);
        ch.vote[1] = CL_VOTER;
        ch.vote[2] = CL_LEARNER;
    }
}
END_TEST

static int vote_of(const struct cl_shard_map *m, const char *name)
{
    for (unsigned i = 0; i < m->n_replicas; i++)
        if (!strcmp(m->replicas[i], name))
            return m->vote[i];
    return -1;
}

/* Count the roles of three members of shard s1. */
static unsigned roles_of(struct cl_member **ms, unsigned n, enum cl_role want, uint64_t *epoch,
                         char *primary)
{
    unsigned k = 0;

    for (unsigned i = 0; i < n; i++) {
        struct cl_shard_role r;

        if (!ms[i])
            continue;
        ck_assert_int_eq(cl_member_role(ms[i], "s1", &r), 0);
        if (r.role != want)
            continue;
        k++;
        if (epoch)
            *epoch = r.epoch;
        if (primary)
            snprintf(primary, CL_NAME_MAX, "%s", r.primary);
    }
    return k;
}

/* One primary and the rest backups naming it; its index. */
static int settled(struct cl_member **ms, const char *const *names, unsigned n, unsigned live,
                   uint64_t *epoch, int ms_max)
{
    for (double end = now_ms() + ms_max;; usleep(50000)) {
        char p[CL_NAME_MAX] = "", b[CL_NAME_MAX] = "";
        uint64_t ep = 0, eb = 0;

        if (roles_of(ms, n, CL_ROLE_PRIMARY, &ep, p) == 1 &&
            roles_of(ms, n, CL_ROLE_BACKUP, &eb, b) == live - 1 && strcmp(p, b) == 0 &&
            ep == eb) {
            for (unsigned i = 0; i < n; i++)
                if (ms[i] && strcmp(names[i], p) == 0) {
                    *epoch = ep;
                    return (int)i;
                }
        }
        ck_assert_msg(now_ms() < end, "no single primary: %u primaries, %u backups",
                      roles_of(ms, n, CL_ROLE_PRIMARY, NULL, NULL),
                      roles_of(ms, n, CL_ROLE_BACKUP, NULL, NULL));
    }
}

START_TEST(one_primary_per_shard_and_epochs_that_grow)
{
    static const char *const names[3] = {"a", "b", "c"};
    struct etcd_proc p = {0};
    struct cl_member *ms[3];
    struct cl_etcd *e;
    struct cl_shard_map map = {.id = "s1", .n_replicas = 3, .replicas = {"a", "b", "c"}}, got;
    struct cl_shard_role r;
    uint64_t e1 = 0, e2 = 0, e3 = 0;
    int first, second, third;

    if (!have_etcd())
        return;
    etcd_run(&p);
    ck_assert_int_eq(cl_etcd_open(p.url, 0, &e), 0);
    ck_assert_int_eq(cl_shard_define(e, "/s", &map), 0);
    ck_assert_int_eq(cl_shard_define(e, "/s", &map), TERN_EEXIST);
    for (int i = 0; i < 3; i++) {
        struct cl_member_config cfg = {.endpoints = p.url, .prefix = "/s", .name = names[i],
                                       .value = "{}", .ttl_s = 2, .shards = {"s1"},
                                       .n_shards = 1};

        ck_assert_int_eq(cl_member_start(&cfg, &ms[i]), 0);
    }
    first = settled(ms, names, 3, 3, &e1, 8000);
    ck_assert_uint_eq(e1, 1);
    ck_assert_int_eq(cl_shard_get(e, "/s", "s1", &got, NULL), 0);
    ck_assert_str_eq(got.primary, names[first]);
    ck_assert_int_eq(cl_member_role(ms[first], "nope", &r), TERN_ENOENT);

    /* The primary leaves: another takes the office at a higher epoch. */
    cl_member_stop(ms[first]);
    ms[first] = NULL;
    second = settled(ms, names, 3, 2, &e2, 8000);
    ck_assert_int_ne(second, first);
    ck_assert_uint_gt(e2, e1);

    /* etcd goes away: within three quarters of the lease the primary is
     * no longer sure of its term (lease_alive false), but keeps the role:
     * nobody can be elected while etcd is away. */
    etcd_kill(&p);
    for (double end = now_ms() + 2500;; usleep(50000)) {
        ck_assert_int_eq(cl_member_role(ms[second], "s1", &r), 0);
        ck_assert_int_eq(r.role, CL_ROLE_PRIMARY);
        ck_assert_uint_eq(r.epoch, e2);
        if (!r.lease_alive)
            break;
        ck_assert_msg(now_ms() < end, "the lease stayed sure with etcd away");
    }
    /* Away for longer than the lease: still the role, still in doubt. */
    usleep(2500000);
    ck_assert_int_eq(cl_member_role(ms[second], "s1", &r), 0);
    ck_assert_int_eq(r.role, CL_ROLE_PRIMARY);
    ck_assert(!r.lease_alive);
    /* etcd back: it kept the lease (and extended it), so the same node
     * holds the same term, sure of it again; nobody else took it. */
    etcd_run(&p);
    third = settled(ms, names, 3, 2, &e3, 15000);
    ck_assert_uint_eq(e3, e2);
    ck_assert_int_eq(third, second);
    for (double end = now_ms() + 5000;; usleep(50000)) {
        ck_assert_int_eq(cl_member_role(ms[second], "s1", &r), 0);
        if (r.lease_alive)
            break;
        ck_assert_msg(now_ms() < end, "the lease never held again");
    }
    for (int i = 0; i < 3; i++)
        cl_member_stop(ms[i]);
    cl_etcd_close(e);
    etcd_stop(&p);
}
END_TEST

/* Adding and removing members (shard.h): one change at a time, learners
 * and leaving voters never stand, the primary's steps only at its epoch,
 * and a leaving primary's office goes to another. */
START_TEST(members_change_one_at_a_time)
{
    static const char *const names[4] = {"a", "b", "c", "d"};
    struct etcd_proc p = {0};
    struct cl_member *ms[4] = {0};
    struct cl_etcd *e;
    struct cl_shard_map map = {.id = "s1", .n_replicas = 3, .replicas = {"a", "b", "c"}}, got;
    struct cl_shard_role r;
    uint64_t e1 = 0, e2 = 0;
    int first, second;

    if (!have_etcd())
        return;
    etcd_run(&p);
    ck_assert_int_eq(cl_etcd_open(p.url, 0, &e), 0);
    ck_assert_int_eq(cl_shard_define(e, "/s", &map), 0);
    for (int i = 0; i < 4; i++) {
        struct cl_member_config cfg = {.endpoints = p.url, .prefix = "/s", .name = names[i],
                                       .value = "{}", .ttl_s = 2, .shards = {"s1"},
                                       .n_shards = 1};

        ck_assert_int_eq(cl_member_start(&cfg, &ms[i]), 0);
    }
    first = settled(ms, names, 3, 3, &e1, 8000);
    /* d is no replica: no role */
    ck_assert_int_eq(cl_member_role(ms[3], "s1", &r), 0);
    ck_assert_int_eq(r.role, CL_ROLE_NONE);

    /* Operators' errors. */
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_ADD, "a", 0, NULL, NULL), TERN_EEXIST);
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_REMOVE, "x", 0, NULL, NULL), TERN_ENOENT);
    ck_assert_int_eq(cl_shard_change(e, "/s", "nope", CL_OP_ADD, "x", 0, NULL, NULL), TERN_ENOENT);
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_ADD, "x/y", 0, NULL, NULL), TERN_EINVAL);

    /* d joins as a learner: a backup of the primary, never a candidate
     * (it stands, and still never takes the office). */
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_ADD, "d", 0, NULL, &got), 0);
    ck_assert_int_eq(vote_of(&got, "d"), CL_LEARNER);
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_ADD, "x", 0, NULL, NULL), TERN_EBUSY);
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_REMOVE, "b", 0, NULL, NULL), TERN_EBUSY);
    for (double end = now_ms() + 4000;; usleep(50000)) {
        ck_assert_int_eq(cl_member_role(ms[3], "s1", &r), 0);
        if (r.role == CL_ROLE_BACKUP)
            break;
        ck_assert_msg(now_ms() < end, "the learner never learned its primary");
    }
    ck_assert_str_eq(r.primary, names[first]);
    ck_assert_uint_eq(r.n_replicas, 4);
    /* Only the primary at its epoch promotes it. */
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_PROMOTE, "d", e1 + 1, names[first], NULL),
                     TERN_ESTALE);
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_PROMOTE, "d", e1,
                                     names[(first + 1) % 3], NULL), TERN_ESTALE);
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_DROP, "d", e1, names[first], NULL),
                     TERN_ESTALE);
    ck_assert_int_eq(cl_member_step(ms[first], "s1", e1, CL_STEP_PROMOTE, "d"), 0);
    for (double end = now_ms() + 4000;; usleep(50000)) {
        ck_assert_int_eq(cl_shard_get(e, "/s", "s1", &got, NULL), 0);
        if (vote_of(&got, "d") == CL_VOTER)
            break;
        ck_assert_msg(now_ms() < end, "the primary's step was never made");
    }
    ck_assert_uint_eq(got.epoch, e1);

    /* The primary leaves: it keeps its office (no candidate, but the
     * holder) until it resigns; then another voter takes it, never it. */
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_REMOVE, names[first], 0, NULL, &got),
                     0);
    ck_assert_int_eq(vote_of(&got, names[first]), CL_LEAVING);
    /* nobody drops a primary: it resigns first */
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_DROP, names[first], e1, names[first],
                                     NULL), TERN_ESTALE);
    usleep(1500000);
    ck_assert_int_eq(cl_member_role(ms[first], "s1", &r), 0);
    ck_assert_int_eq(r.role, CL_ROLE_PRIMARY);
    ck_assert_uint_eq(r.epoch, e1);
    ck_assert_int_eq(cl_member_step(ms[first], "s1", e1, CL_STEP_RESIGN, NULL), 0);
    for (double end = now_ms() + 8000;; usleep(50000)) {
        second = settled(ms, names, 4, 4, &e2, 8000);
        if (e2 > e1)
            break;
        ck_assert_msg(now_ms() < end, "nobody took the office the primary gave up");
    }
    ck_assert_int_ne(second, first);
    ck_assert_uint_gt(e2, e1);
    /* The new primary drops it; a step of the old epoch is refused. */
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_DROP, names[first], e1, names[first],
                                     NULL), TERN_ESTALE);
    ck_assert_int_eq(cl_member_step(ms[second], "s1", e2, CL_STEP_DROP, names[first]), 0);
    for (double end = now_ms() + 4000;; usleep(50000)) {
        ck_assert_int_eq(cl_shard_get(e, "/s", "s1", &got, NULL), 0);
        if (vote_of(&got, names[first]) < 0)
            break;
        ck_assert_msg(now_ms() < end, "the leaving voter was never dropped");
    }
    ck_assert_uint_eq(got.n_replicas, 3);
    for (double end = now_ms() + 4000;; usleep(50000)) {
        ck_assert_int_eq(cl_member_role(ms[first], "s1", &r), 0);
        if (r.role == CL_ROLE_NONE)
            break;
        ck_assert_msg(now_ms() < end, "the removed node still has a role");
    }

    /* A removal called off; a learner removed at once. */
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_REMOVE, "d", 0, NULL, &got), 0);
    ck_assert_int_eq(vote_of(&got, "d"), CL_LEAVING);
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_REMOVE, "d", 0, NULL, NULL), 0);
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_ADD, "d", 0, NULL, &got), 0);
    ck_assert_int_eq(vote_of(&got, "d"), CL_VOTER);
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_ADD, names[first], 0, NULL, &got), 0);
    ck_assert_int_eq(cl_shard_change(e, "/s", "s1", CL_OP_REMOVE, names[first], 0, NULL, &got), 0);
    ck_assert_int_eq(vote_of(&got, names[first]), -1);

    /* The only voter never leaves. */
    map = (struct cl_shard_map){.id = "one", .n_replicas = 1, .replicas = {"a"}};
    ck_assert_int_eq(cl_shard_define(e, "/s", &map), 0);
    ck_assert_int_eq(cl_shard_change(e, "/s", "one", CL_OP_REMOVE, "a", 0, NULL, NULL), TERN_EINVAL);
    for (int i = 0; i < 4; i++)
        cl_member_stop(ms[i]);
    cl_etcd_close(e);
    etcd_stop(&p);
}
END_TEST

Suite *suite_cluster(void)
{
    Suite *s = suite_create("cluster");
    TCase *tc = tcase_create("etcd");

    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, keys_put_get_and_delete);
    tcase_add_test(tc, leases_hold_keys_until_they_end);
    tcase_add_test(tc, create_elects_one_and_cas_loses_no_write);
    tcase_add_test(tc, endpoints_down_and_wrong);
    tcase_add_test(tc, a_member_registers_renews_and_leaves);
    tcase_add_test(tc, a_member_outlives_an_etcd_restart);
    tcase_add_test(tc, two_members_of_one_name);
    tcase_add_test(tc, bad_member_configurations);
    tcase_add_test(tc, shard_maps_parse_strictly);
    tcase_add_test(tc, one_primary_per_shard_and_epochs_that_grow);
    tcase_add_test(tc, members_change_one_at_a_time);
    suite_add_tcase(s, tc);
    return s;
}

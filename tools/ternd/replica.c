/* ternd's replicated stores (replica.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "replica.h"
#include "tern_config.h"
#if TERN_HAVE_CLUSTER
#include "member.h"
#endif

/* The endpoint's replication service, shared by the groups on it. */
static struct repl_host *g_host;
static unsigned g_host_users;

struct ternd_replica {
    const struct ternd_opts *o;
    struct ternd_node *node;
    struct ternd_replica_def def;
    char shard[TERND_NAME_MAX];
    struct repl *r;
    uint64_t next_view, next_publish;
    pthread_mutex_t lock;           /* guards st */
    struct repl_status st;
    bool have_st;
};

int ternd_replica_open(const struct ternd_opts *o, struct ternd_node *n,
                       struct tern_rpc_ep *ep, const struct ternd_replica_def *def,
                       struct ternd_replica **out)
{
#if TERN_HAVE_CLUSTER
    struct ternd_replica *t = calloc(1, sizeof(*t));
    char state[4200];
    struct repl_config c = {.shard = def->shard, .me = o->name, .state_path = state,
                            .log_bytes = (size_t)o->repl_log_mb << 20, .ops = def->ops,
                            .ctx = def->ctx, .ship = o->repl_ship};
    int rc = 0;

    if (!t)
        return TERN_ENOMEM;
    snprintf(state, sizeof(state), "%s/%s", o->data_dir, def->state_file);
    snprintf(t->shard, sizeof(t->shard), "%s", def->shard);
    t->o = o;
    t->node = n;
    t->def = *def;
    t->def.shard = t->shard;
    pthread_mutex_init(&t->lock, NULL);
    if (!g_host)
        rc = repl_host_open(ep, &g_host);
    if (rc == 0)
        rc = repl_open(g_host, &c, &t->r);
    if (rc < 0) {
        pthread_mutex_destroy(&t->lock);
        free(t);
        return rc;      /* the host's service stays registered: ternd is exiting */
    }
    g_host_users++;
    def->attach(def->attach_arg, t->r);
    *out = t;
    return 0;
#else
    (void)o;
    (void)n;
    (void)ep;
    (void)def;
    *out = NULL;
    return TERN_ENOTSUP;
#endif
}

const char *ternd_replica_shard(const struct ternd_replica *t)
{
    return t ? t->shard : "";
}

bool ternd_replica_role(struct ternd_replica *t, struct cl_shard_role *out)
{
#if TERN_HAVE_CLUSTER
    struct cl_member *m = t ? ternd_node_member(t->node) : NULL;

    return m && cl_member_role(m, t->shard, out) == 0;
#else
    (void)t;
    (void)out;
    return false;
#endif
}

#if TERN_HAVE_CLUSTER
/* The membership's word on the shard, as the group takes it. */
static void refresh_view(struct ternd_replica *t)
{
    struct cl_member *m = ternd_node_member(t->node);
    struct repl_peer peers[REPL_PEERS_MAX];
    struct cl_shard_role role;
    static const enum repl_role roles[] = {[CL_ROLE_NONE] = REPL_NONE,
                                           [CL_ROLE_PRIMARY] = REPL_PRIMARY,
                                           [CL_ROLE_BACKUP] = REPL_BACKUP};
    static const enum cl_step steps[] = {[REPL_STEP_PROMOTE] = CL_STEP_PROMOTE,
                                         [REPL_STEP_DROP] = CL_STEP_DROP,
                                         [REPL_STEP_RESIGN] = CL_STEP_RESIGN};
    enum repl_step step;
    char name[64];
    unsigned n = 0;

    if (!m || cl_member_role(m, t->shard, &role) < 0) {
        repl_set_view(t->r, REPL_NONE, 0, "", NULL, 0);
        return;
    }
    for (unsigned i = 0; i < role.n_replicas && n < REPL_PEERS_MAX; i++, n++) {
        static const uint8_t votes[] = {[CL_VOTER] = REPL_VOTER, [CL_LEARNER] = REPL_LEARNER,
                                        [CL_LEAVING] = REPL_LEAVING};

        snprintf(peers[n].name, sizeof(peers[n].name), "%s", role.replicas[i]);
        peers[n].vote = role.vote[i] < 3 ? votes[role.vote[i]] : REPL_LEARNER;
        /* auto://: the session moves to the best fabric both ends have. */
        if (role.addrs[i][0])
            snprintf(peers[n].uri, sizeof(peers[n].uri), "auto://%s", role.addrs[i]);
        else
            peers[n].uri[0] = 0;
    }
    repl_set_view(t->r, roles[role.role], role.epoch, role.primary, peers, n);
    /* etcd away: the primary keeps its office on what a majority confirms. */
    repl_set_lease(t->r, role.lease_alive);
    /* A replica behind the others stands back from the election; with no
     * primary for three leases everyone stands. */
    cl_member_set_candidate(m, t->shard,
                            repl_candidate(t->r, 3ull * t->o->lease_ttl * 1000000000u));
    /* Members changing: the primary's steps go to etcd by the membership
     * thread. */
    step = repl_members_step(t->r, name);
    if (step != REPL_STEP_NONE)
        cl_member_step(m, t->shard, role.epoch, steps[step], name);
}
#endif

bool ternd_replica_tick(struct ternd_replica *t, uint64_t now)
{
    bool busy;

    if (!t || !t->r)
        return false;
#if TERN_HAVE_CLUSTER
    if (now >= t->next_view) {
        refresh_view(t);
        t->next_view = now + 20000000u;
    }
#endif
    busy = repl_tick(t->r);
    if (now >= t->next_publish) {
        struct repl_status st;

        repl_status(t->r, &st);
        pthread_mutex_lock(&t->lock);
        t->st = st;
        t->have_st = true;
        pthread_mutex_unlock(&t->lock);
        t->next_publish = now + 100000000u;
    }
    return busy;
}

bool ternd_replica_status(struct ternd_replica *t, struct repl_status *out)
{
    bool have;

    if (!t)
        return false;
    pthread_mutex_lock(&t->lock);
    have = t->have_st;
    *out = t->st;
    pthread_mutex_unlock(&t->lock);
    return have;
}

void ternd_replica_close(struct ternd_replica *t)
{
    if (!t || !t->r)
        return;
    t->def.attach(t->def.attach_arg, NULL);
    repl_close(t->r);
    t->r = NULL;
}

void ternd_replica_free(struct ternd_replica *t)
{
    if (!t)
        return;
    ternd_replica_close(t);
    if (--g_host_users == 0) {
        free(g_host);   /* its service went with the endpoint */
        g_host = NULL;
    }
    pthread_mutex_destroy(&t->lock);
    free(t);
}

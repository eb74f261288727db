/* A node's registration in etcd, kept alive by a thread (member.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "log.h"
#include "member.h"

struct cl_member {
    struct cl_member_config cfg;
    char *key;
    struct cl_shard_role roles[CL_SHARDS_MAX];  /* under lock */
    bool standing_back[CL_SHARDS_MAX];          /* under lock: not a candidate */
    struct step {
        enum cl_step step;
        uint64_t epoch;
        char name[CL_NAME_MAX];
    } want[CL_SHARDS_MAX], made[CL_SHARDS_MAX];  /* under lock (cl_member_step) */
    uint64_t valid_until;       /* mono ns: the lease surely alive till then */
    pthread_t thread;
    pthread_mutex_t lock;       /* guards state and stop */
    pthread_cond_t wake;
    bool stop;
    struct cl_member_state state;
    struct tern_log_limit said;
};

static uint64_t mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Sleep up to `ns` or until stopped; true if stopped. */
static bool nap(struct cl_member *m, uint64_t ns)
{
    struct timespec ts;
    bool stop;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec += (long)(ns % 1000000000u);
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&m->lock);
    if (!m->stop)
        pthread_cond_timedwait(&m->wake, &m->lock, &ts);
    stop = m->stop;
    pthread_mutex_unlock(&m->lock);
    return stop;
}

/* `registered` false with `keep_roles`: etcd is away, the lease may still
 * hold (the roles stay, their lease no longer sure); without: the lease is
 * gone, and the roles with it. */
static void set_state(struct cl_member *m, bool registered, int64_t lease, bool put,
                      bool keep_roles, const char *why)
{
    bool was;

    pthread_mutex_lock(&m->lock);
    was = m->state.registered;
    m->state.registered = registered;
    m->state.lease = lease;
    m->state.registrations += put;
    snprintf(m->state.error, sizeof(m->state.error), "%s", registered ? "" : why);
    if (!registered && !keep_roles) {
        memset(m->roles, 0, sizeof(m->roles));
        m->valid_until = 0;
    }
    pthread_mutex_unlock(&m->lock);
    if (registered && !was)
        tern_log(TERN_LOG_INFO, "cluster", "registered as %s (lease %llx, %u s)", m->key,
                 (unsigned long long)lease, m->cfg.ttl_s);
    else if (!registered && tern_log_allow(&m->said))
        tern_log(TERN_LOG_WARN, "cluster", "%s: not registered: %s", m->key, why);
}

/* Who holds our name, when it is not us. */
static int holder(void *arg, const struct cl_kv *kv)
{
    *(int64_t *)arg = kv->lease;
    return 0;
}

/* Grant a lease and take the key under it. 0, or why not (in `why`). */
static int enroll(struct cl_member *m, struct cl_etcd *e, int64_t *lease, char *why,
                  size_t len)
{
    int64_t other = 0;
    bool created = false;
    int rc = cl_etcd_lease_grant(e, m->cfg.ttl_s, lease);

    if (rc == 0)
        rc = cl_etcd_create(e, m->key, m->cfg.value, strlen(m->cfg.value), *lease, &created,
                            holder, &other);
    if (rc == 0 && !created) {
        /* Another node of this name is alive (its lease holds the key):
         * never take it over. */
        snprintf(why, len, "another node holds the name (lease %llx)", (unsigned long long)other);
        cl_etcd_lease_revoke(e, *lease);
        *lease = 0;
        return TERN_EEXIST;
    }
    if (rc < 0) {
        snprintf(why, len, "%s: %s", tern_strerror(rc), cl_etcd_error(e));
        if (*lease)
            cl_etcd_lease_revoke(e, *lease);
        *lease = 0;
    }
    return rc;
}

/* The lease was renewed by a request sent at `sent`: etcd's term for it
 * runs at least a lease from then; ours, to be sure, three quarters. */
static void renewed_at(struct cl_member *m, uint64_t sent)
{
    pthread_mutex_lock(&m->lock);
    m->valid_until = sent + (uint64_t)m->cfg.ttl_s * 750000000u;
    pthread_mutex_unlock(&m->lock);
}

/* Where a registered node listens (cl_node_tcp_addr), for the replicas
 * of this node's shards. */
static int learn_addr(void *arg, const struct cl_kv *kv)
{
    struct cl_member *m = arg;
    size_t plen = strlen(m->cfg.prefix) + strlen("/nodes/");
    char name[CL_NAME_MAX], addr[CL_ADDR_MAX], mongo[CL_ADDR_MAX];

    if (kv->key_len <= plen || kv->key_len - plen >= sizeof(name))
        return 0;
    memcpy(name, kv->key + plen, kv->key_len - plen);
    name[kv->key_len - plen] = 0;
    if (cl_node_tcp_addr(kv->value, kv->value_len, addr, sizeof(addr)) < 0)
        addr[0] = 0;
    if (cl_node_mongo_addr(kv->value, kv->value_len, mongo, sizeof(mongo)) < 0)
        mongo[0] = 0;
    pthread_mutex_lock(&m->lock);
    for (unsigned i = 0; i < m->cfg.n_shards; i++)
        for (unsigned k = 0; k < m->roles[i].n_replicas; k++)
            if (!strcmp(m->roles[i].replicas[k], name)) {
                snprintf(m->roles[i].addrs[k], CL_ADDR_MAX, "%s", addr);
                snprintf(m->roles[i].mongo[k], CL_ADDR_MAX, "%s", mongo);
            }
    pthread_mutex_unlock(&m->lock);
    return 0;
}

/* One election step for each shard. */
static void campaign(struct cl_member *m, struct cl_etcd *e, int64_t lease)
{
    for (unsigned i = 0; i < m->cfg.n_shards; i++) {
        struct cl_shard_map map;
        enum cl_role role;
        bool candidate;
        int rc;

        pthread_mutex_lock(&m->lock);
        candidate = !m->standing_back[i];
        pthread_mutex_unlock(&m->lock);
        rc = cl_shard_campaign(e, m->cfg.prefix, m->cfg.shards[i], m->cfg.name, lease,
                               candidate, &map, &role);

        if (rc < 0) {
            if (tern_log_allow(&m->said))
                tern_log(TERN_LOG_WARN, "cluster", "shard %s: %s: %s", m->cfg.shards[i],
                         tern_strerror(rc), cl_etcd_error(e));
            continue;
        }
        pthread_mutex_lock(&m->lock);
        if (role == CL_ROLE_PRIMARY && m->roles[i].role != CL_ROLE_PRIMARY)
            tern_log(TERN_LOG_INFO, "cluster", "shard %s: primary at epoch %llu",
                     m->cfg.shards[i], (unsigned long long)map.epoch);
        m->roles[i].role = role;
        m->roles[i].epoch = map.epoch;
        memcpy(m->roles[i].vote, map.vote, sizeof(map.vote));
        snprintf(m->roles[i].primary, sizeof(m->roles[i].primary), "%s", map.primary);
        if (m->roles[i].n_replicas != map.n_replicas ||
            memcmp(m->roles[i].replicas, map.replicas, sizeof(map.replicas))) {
            m->roles[i].n_replicas = map.n_replicas;
            memcpy(m->roles[i].replicas, map.replicas, sizeof(map.replicas));
            memset(m->roles[i].addrs, 0, sizeof(m->roles[i].addrs));
            memset(m->roles[i].mongo, 0, sizeof(m->roles[i].mongo));
        }
        pthread_mutex_unlock(&m->lock);
    }
    /* The replicas' addresses: a restarted node may listen elsewhere. */
    if (m->cfg.n_shards && cl_members(e, m->cfg.prefix, learn_addr, m) < 0 &&
        tern_log_allow(&m->said))
        tern_log(TERN_LOG_WARN, "cluster", "reading the nodes: %s", cl_etcd_error(e));
}

/* The steps this node's groups asked for as primaries (cl_member_step). */
static void take_steps(struct cl_member *m, struct cl_etcd *e, int64_t lease)
{
    static const enum cl_shard_op ops[] = {[CL_STEP_PROMOTE] = CL_OP_PROMOTE,
                                           [CL_STEP_DROP] = CL_OP_DROP};

    for (unsigned i = 0; i < m->cfg.n_shards; i++) {
        struct step s;
        int rc;

        pthread_mutex_lock(&m->lock);
        s = m->want[i];
        pthread_mutex_unlock(&m->lock);
        if (s.step == CL_STEP_NONE)
            continue;
        if (s.step == CL_STEP_RESIGN)
            rc = cl_shard_resign(e, m->cfg.prefix, m->cfg.shards[i], lease);
        else
            rc = cl_shard_change(e, m->cfg.prefix, m->cfg.shards[i], ops[s.step], s.name,
                                 s.epoch, m->cfg.name, NULL);
        if (rc == 0)
            tern_log(TERN_LOG_INFO, "cluster", "shard %s: %s%s%s at epoch %llu",
                     m->cfg.shards[i], s.step == CL_STEP_RESIGN ? "resigned the office"
                     : s.step == CL_STEP_PROMOTE ? "made a voter of " : "removed ",
                     s.step == CL_STEP_RESIGN ? "" : s.name,
                     s.step == CL_STEP_DROP ? " from the map" : "",
                     (unsigned long long)s.epoch);
        else if (rc != TERN_ESTALE && tern_log_allow(&m->said))
            tern_log(TERN_LOG_WARN, "cluster", "shard %s: a step on its members: %s: %s",
                     m->cfg.shards[i], tern_strerror(rc), cl_etcd_error(e));
        /* Made, or no longer due (the map moved on): done. Otherwise (etcd
         * away) the next step tries again. */
        pthread_mutex_lock(&m->lock);
        if (rc == 0 || rc == TERN_ESTALE) {
            if (!memcmp(&m->want[i], &s, sizeof(s)))
                m->want[i].step = CL_STEP_NONE;
            m->made[i] = s;
        }
        pthread_mutex_unlock(&m->lock);
    }
}

static void *run(void *arg)
{
    struct cl_member *m = arg;
    uint64_t period = (uint64_t)m->cfg.ttl_s * 1000000000u / 3, renewed = 0;
    int64_t lease = 0;
    struct cl_etcd *e = NULL;
    char why[300];

    /* Each request is bounded by a third of the lease, so that a slow etcd
     * cannot hold a renewal past the lease's end unnoticed. */
    if (cl_etcd_open(m->cfg.endpoints, (unsigned)(period / 1000000u), &e) < 0) {
        set_state(m, false, 0, false, false, "cannot open the etcd client");
        return NULL;
    }
    while (!nap(m, lease ? period : 0)) {
        uint64_t sent = mono_ns();
        int64_t ttl = 0;
        int rc;

        if (!lease) {
            rc = enroll(m, e, &lease, why, sizeof(why));
            if (rc == 0) {
                renewed = sent;
                renewed_at(m, sent);
                set_state(m, true, lease, true, false, "");
                take_steps(m, e, lease);
                campaign(m, e, lease);
            } else {
                set_state(m, false, 0, false, false, why);
                if (nap(m, period))
                    break;
            }
            continue;
        }
        rc = cl_etcd_lease_keepalive(e, lease, &ttl);
        if (rc == 0) {
            renewed = sent;
            renewed_at(m, sent);
            set_state(m, true, lease, false, false, "");
            take_steps(m, e, lease);
            campaign(m, e, lease);
            continue;
        }
        if (rc == TERN_ENOLEASE) {
            set_state(m, false, 0, false, false, "the lease ran out: registering again");
            lease = 0;
            continue;
        }
        /* etcd away: keep renewing the same lease. etcd keeps it across a
         * restart, so our key and offices are ours again when it answers,
         * unless it says the lease ran out meanwhile. */
        snprintf(why, sizeof(why), "renewing: %s: %s", tern_strerror(rc), cl_etcd_error(e));
        if (mono_ns() - renewed >= (uint64_t)m->cfg.ttl_s * 1000000000u)
            set_state(m, false, lease, false, true, why);
        else if (tern_log_allow(&m->said))
            tern_log(TERN_LOG_WARN, "cluster", "%s: %s", m->key, why);
    }
    if (lease)
        cl_etcd_lease_revoke(e, lease);
    cl_etcd_close(e);
    return NULL;
}

static void member_free(struct cl_member *m)
{
    for (unsigned i = 0; i < m->cfg.n_shards; i++)
        free((void *)m->cfg.shards[i]);
    free((void *)m->cfg.endpoints);
    free((void *)m->cfg.prefix);
    free((void *)m->cfg.name);
    free((void *)m->cfg.value);
    free(m->key);
    free(m);
}

int cl_member_set_candidate(struct cl_member *m, const char *id, bool candidate)
{
    for (unsigned i = 0; i < m->cfg.n_shards; i++)
        if (strcmp(m->cfg.shards[i], id) == 0) {
            pthread_mutex_lock(&m->lock);
            m->standing_back[i] = !candidate;
            pthread_mutex_unlock(&m->lock);
            return 0;
        }
    return TERN_ENOENT;
}

int cl_member_step(struct cl_member *m, const char *id, uint64_t epoch, enum cl_step step,
                   const char *name)
{
    struct step s;

    memset(&s, 0, sizeof(s));       /* compared whole, padding included */
    s.step = step;
    s.epoch = epoch;
    for (unsigned i = 0; i < m->cfg.n_shards; i++) {
        if (strcmp(m->cfg.shards[i], id) != 0)
            continue;
        snprintf(s.name, sizeof(s.name), "%s", name ? name : "");
        pthread_mutex_lock(&m->lock);
        if (step != CL_STEP_NONE && memcmp(&m->want[i], &s, sizeof(s)) != 0 &&
            memcmp(&m->made[i], &s, sizeof(s)) != 0) {
            m->want[i] = s;
            pthread_cond_signal(&m->wake);
        }
        pthread_mutex_unlock(&m->lock);
        return 0;
    }
    return TERN_ENOENT;
}

int cl_member_role(struct cl_member *m, const char *id, struct cl_shard_role *out)
{
    unsigned i = 0;

    while (i < m->cfg.n_shards && strcmp(m->cfg.shards[i], id) != 0)
        i++;
    if (i == m->cfg.n_shards)
        return TERN_ENOENT;
    pthread_mutex_lock(&m->lock);
    *out = m->roles[i];
    out->lease_alive = mono_ns() < m->valid_until;
    pthread_mutex_unlock(&m->lock);
    return 0;
}

int cl_member_start(const struct cl_member_config *cfg, struct cl_member **out)
{
    struct cl_member *m;
    pthread_condattr_t ca;
    bool shards_ok = true;
    size_t klen;
    int rc;

    if (!cfg || !cfg->endpoints || !cfg->prefix || cfg->prefix[0] != '/' || !cfg->name ||
        !*cfg->name || strchr(cfg->name, '/') || !cfg->value || cfg->ttl_s < 2 || !out ||
        cfg->n_shards > CL_SHARDS_MAX || strlen(cfg->name) >= CL_NAME_MAX)
        return TERN_EINVAL;
    for (unsigned i = 0; i < cfg->n_shards; i++)
        if (!cfg->shards[i] || !*cfg->shards[i] || strchr(cfg->shards[i], '/'))
            return TERN_EINVAL;
    klen = strlen(cfg->prefix) + strlen("/nodes/") + strlen(cfg->name) + 1;
    if (klen > CL_KEY_MAX || strlen(cfg->value) > CL_VALUE_MAX)
        return TERN_E2BIG;
    m = calloc(1, sizeof(*m));
    if (!m)
        return TERN_ENOMEM;
    m->cfg = *cfg;
    m->cfg.endpoints = strdup(cfg->endpoints);
    m->cfg.prefix = strdup(cfg->prefix);
    m->cfg.name = strdup(cfg->name);
    m->cfg.value = strdup(cfg->value);
    m->key = malloc(klen);
    memset(m->cfg.shards, 0, sizeof(m->cfg.shards));
    for (unsigned i = 0; i < cfg->n_shards; i++)
        shards_ok &= (m->cfg.shards[i] = strdup(cfg->shards[i])) != NULL;
    if (!m->cfg.endpoints || !m->cfg.prefix || !m->cfg.name || !m->cfg.value || !m->key ||
        !shards_ok) {
        rc = TERN_ENOMEM;
        goto fail;
    }
    snprintf(m->key, klen, "%s/nodes/%s", cfg->prefix, cfg->name);
    m->said = (struct tern_log_limit){0};
    snprintf(m->state.error, sizeof(m->state.error), "not yet registered");
    pthread_mutex_init(&m->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&m->thread, NULL, run, m) != 0) {
        pthread_cond_destroy(&m->wake);
        pthread_mutex_destroy(&m->lock);
        rc = TERN_ENOMEM;
        goto fail;
    }
    *out = m;
    return 0;
fail:
    member_free(m);
    return rc;
}

void cl_member_state(struct cl_member *m, struct cl_member_state *out)
{
    pthread_mutex_lock(&m->lock);
    *out = m->state;
    pthread_mutex_unlock(&m->lock);
}

void cl_member_stop(struct cl_member *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->lock);
    m->stop = true;
    pthread_cond_signal(&m->wake);
    pthread_mutex_unlock(&m->lock);
    pthread_join(m->thread, NULL);
    pthread_cond_destroy(&m->wake);
    pthread_mutex_destroy(&m->lock);
    member_free(m);
}

int cl_members(struct cl_etcd *e, const char *prefix, cl_kv_fn fn, void *arg)
{
    char key[CL_KEY_MAX + 1];

    if (snprintf(key, sizeof(key), "%s/nodes/", prefix) >= (int)sizeof(key))
        return TERN_E2BIG;
    return cl_etcd_get(e, key, true, fn, arg, NULL);
}

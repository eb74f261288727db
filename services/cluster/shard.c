/* Shard maps and the election of primaries (shard.h). */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include <json-c/json.h>

#include "error.h"
#include "shard.h"

#define CAS_TRIES 8

static bool name_ok(const char *s, size_t n)
{
    if (n == 0 || n >= CL_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("._-", s[i]))
            return false;
    return true;
}

/* Append the strings to buf at *at (NULL ends them); false if they do
 * not fit. */
static bool add(char *buf, size_t len, size_t *at, const char *s1, const char *s2,
                const char *s3)
{
    const char *part[] = {s1, s2, s3};

    for (unsigned i = 0; i < 3 && part[i]; i++) {
        size_t n = strlen(part[i]);

        if (n >= len - *at)
            return false;
        memcpy(buf + *at, part[i], n + 1);
        *at += n;
    }
    return true;
}

int cl_shard_map_json(const struct cl_shard_map *m, char *buf, size_t len)
{
    size_t at = 0;
    int n = snprintf(buf, len, "{\"id\":\"%s\",\"epoch\":%llu,\"primary\":\"%s\",\"replicas\":[",
                     m->id, (unsigned long long)m->epoch, m->primary);
    const char *sep = "", *leaving = NULL;
    bool learners = false;

    if (n < 0 || (size_t)n >= len)
        return TERN_E2BIG;
    at = (size_t)n;
    for (unsigned i = 0; i < m->n_replicas; i++) {
        if (m->vote[i] == CL_LEARNER)
            continue;
        if (m->vote[i] == CL_LEAVING)
            leaving = m->replicas[i];
        if (!add(buf, len, &at, sep, "\"", m->replicas[i]) ||
            !add(buf, len, &at, "\"", NULL, NULL))
            return TERN_E2BIG;
        sep = ",";
    }
    if (!add(buf, len, &at, "]", NULL, NULL))
        return TERN_E2BIG;
    sep = ",\"learners\":[";
    for (unsigned i = 0; i < m->n_replicas; i++)
        if (m->vote[i] == CL_LEARNER) {
            if (!add(buf, len, &at, sep, "\"", m->replicas[i]) ||
                !add(buf, len, &at, "\"", NULL, NULL))
                return TERN_E2BIG;
            sep = ",";
            learners = true;
        }
    if ((learners && !add(buf, len, &at, "]", NULL, NULL)) ||
        (leaving && !add(buf, len, &at, ",\"leaving\":\"", leaving, "\"")) ||
        !add(buf, len, &at, "}", NULL, NULL))
        return TERN_E2BIG;
    return (int)at;
}

static bool copy_name(json_object *v, char *out, bool empty_ok)
{
    const char *s;
    size_t n;

    if (!v || !json_object_is_type(v, json_type_string))
        return false;
    s = json_object_get_string(v);
    n = (size_t)json_object_get_string_len(v);
    if (!(n == 0 && empty_ok) && !name_ok(s, n))
        return false;
    memcpy(out, s, n);
    out[n] = 0;
    return true;
}

/* Names from a JSON array into out->replicas, as `vote`; false for a
 * name that is not sound or not distinct, or too many. */
static bool take_names(json_object *arr, struct cl_shard_map *out, uint8_t vote)
{
    size_t n = json_object_array_length(arr);

    if (n > CL_REPLICAS_MAX - out->n_replicas)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned at = out->n_replicas;

        if (!copy_name(json_object_array_get_idx(arr, i), out->replicas[at], false))
            return false;
        for (unsigned k = 0; k < at; k++)
            if (strcmp(out->replicas[k], out->replicas[at]) == 0)
                return false;
        out->vote[at] = vote;
        out->n_replicas++;
    }
    return true;
}

int cl_shard_map_parse(const uint8_t *json, size_t len, struct cl_shard_map *out)
{
    struct json_tokener *t = json_tokener_new_ex(4);
    json_object *o = NULL, *v, *reps;
    char leaving[CL_NAME_MAX] = "";
    bool ok = false, primary_in = false, leaving_in = false;
    unsigned voters;

    memset(out, 0, sizeof(*out));
    if (!t || len > 65536)
        goto done;
    o = json_tokener_parse_ex(t, (const char *)json, (int)len);
    if (!o || json_tokener_get_error(t) != json_tokener_success ||
        json_tokener_get_parse_end(t) != len || !json_object_is_type(o, json_type_object))
        goto done;
    if (!json_object_object_get_ex(o, "id", &v) || !copy_name(v, out->id, false))
        goto done;
    if (!json_object_object_get_ex(o, "primary", &v) || !copy_name(v, out->primary, true))
        goto done;
    if (!json_object_object_get_ex(o, "epoch", &v) || !json_object_is_type(v, json_type_int) ||
        json_object_get_int64(v) < 0)
        goto done;
    out->epoch = (uint64_t)json_object_get_int64(v);
    if (!json_object_object_get_ex(o, "replicas", &reps) ||
        !json_object_is_type(reps, json_type_array) || json_object_array_length(reps) == 0 ||
        !take_names(reps, out, CL_VOTER))
        goto done;
    voters = out->n_replicas;
    if (json_object_object_get_ex(o, "learners", &reps) &&
        (!json_object_is_type(reps, json_type_array) || !take_names(reps, out, CL_LEARNER)))
        goto done;
    if (json_object_object_get_ex(o, "leaving", &v) && !copy_name(v, leaving, false))
        goto done;
    for (unsigned i = 0; i < voters; i++) {
        primary_in |= strcmp(out->replicas[i], out->primary) == 0;
        if (leaving[0] && strcmp(out->replicas[i], leaving) == 0) {
            out->vote[i] = CL_LEAVING;
            leaving_in = true;
        }
    }
    /* A primary is one of the voters, and there is one once there was an
     * election; one change at a time, and never the last voter leaving. */
    ok = (out->primary[0] ? primary_in : true) && (out->epoch == 0) == (out->primary[0] == 0) &&
         (!leaving[0] || (leaving_in && voters > 1)) &&
         (out->n_replicas - voters) + (leaving[0] != 0) <= 1;
done:
    json_object_put(o);
    if (t)
        json_tokener_free(t);
    if (!ok)
        memset(out, 0, sizeof(*out));
    return ok ? 0 : TERN_EPROTO;
}

static int key_of(char *buf, const char *prefix, const char *id, const char *what)
{
    int n = snprintf(buf, CL_KEY_MAX + 1, "%s/shards/%s/%s", prefix, id, what);

    return n < 0 || n > CL_KEY_MAX ? TERN_E2BIG : 0;
}

int cl_shard_define(struct cl_etcd *e, const char *prefix, const struct cl_shard_map *m)
{
    char key[CL_KEY_MAX + 1], json[1024];
    bool created = false;
    int n, rc;

    if (!name_ok(m->id, strlen(m->id)) || !m->n_replicas || m->n_replicas > CL_REPLICAS_MAX ||
        m->epoch || m->primary[0])
        return TERN_EINVAL;
    for (unsigned i = 0; i < m->n_replicas; i++) {
        if (!name_ok(m->replicas[i], strlen(m->replicas[i])))
            return TERN_EINVAL;
        for (unsigned k = 0; k < i; k++)
            if (strcmp(m->replicas[k], m->replicas[i]) == 0)
                return TERN_EINVAL;
    }
    if ((rc = key_of(key, prefix, m->id, "map")) < 0 ||
        (n = cl_shard_map_json(m, json, sizeof(json))) < 0)
        return rc < 0 ? rc : n;
    rc = cl_etcd_create(e, key, json, (size_t)n, 0, &created, NULL, NULL);
    return rc < 0 ? rc : created ? 0 : TERN_EEXIST;
}

struct got_map {
    struct cl_shard_map *m;
    int64_t mod_rev;
    int rc;
    bool found;
};

static int take_map(void *arg, const struct cl_kv *kv)
{
    struct got_map *g = arg;

    g->found = true;
    g->mod_rev = kv->mod_rev;
    g->rc = cl_shard_map_parse(kv->value, kv->value_len, g->m);
    return 0;
}

int cl_shard_get(struct cl_etcd *e, const char *prefix, const char *id, struct cl_shard_map *out,
                 int64_t *mod_rev)
{
    char key[CL_KEY_MAX + 1];
    struct got_map g = {.m = out};
    int rc = key_of(key, prefix, id, "map");

    if (rc == 0)
        rc = cl_etcd_get(e, key, false, take_map, &g, NULL);
    if (rc == 0)
        rc = !g.found ? TERN_ENOENT : g.rc;
    if (rc == 0 && strcmp(out->id, id) != 0)
        rc = TERN_EPROTO;       /* a map under another shard's key */
    if (rc == 0 && mod_rev)
        *mod_rev = g.mod_rev;
    return rc;
}

struct holder {
    char name[CL_NAME_MAX];
    int64_t lease;
};

static int take_holder(void *arg, const struct cl_kv *kv)
{
    struct holder *h = arg;

    h->lease = kv->lease;
    if (name_ok((const char *)kv->value, kv->value_len)) {
        memcpy(h->name, kv->value, kv->value_len);
        h->name[kv->value_len] = 0;
    }
    return 0;
}

/* The office is ours: make the map say so, with an epoch above every one
 * before. `fresh`: just taken, a new term even if the map named this node
 * already (an earlier term of it, under an earlier lease); else a step
 * repeated in the same term, which raises nothing once the map names us. */
static int take_term(struct cl_etcd *e, const char *prefix, const char *id, const char *me,
                     bool fresh, struct cl_shard_map *m)
{
    char key[CL_KEY_MAX + 1], json[1024];
    int rc = key_of(key, prefix, id, "map");

    for (int i = 0; rc == 0 && i < CAS_TRIES; i++) {
        int64_t mod = 0;
        bool swapped = false;
        int n;

        if ((rc = cl_shard_get(e, prefix, id, m, &mod)) < 0)
            return rc;
        if (!fresh && strcmp(m->primary, me) == 0 && m->epoch)
            return 0;
        m->epoch++;
        snprintf(m->primary, sizeof(m->primary), "%s", me);
        if ((n = cl_shard_map_json(m, json, sizeof(json))) < 0)
            return n;
        rc = cl_etcd_cas(e, key, mod, json, (size_t)n, 0, &swapped);
        if (rc == 0 && swapped)
            return 0;
        fresh = false;      /* someone moved the map: read it again */
    }
    return rc < 0 ? rc : TERN_EAGAIN;
}

static int find(const struct cl_shard_map *m, const char *name)
{
    for (unsigned i = 0; i < m->n_replicas; i++)
        if (strcmp(m->replicas[i], name) == 0)
            return (int)i;
    return -1;
}

static void drop_at(struct cl_shard_map *m, unsigned at)
{
    for (unsigned i = at; i + 1 < m->n_replicas; i++) {
        memcpy(m->replicas[i], m->replicas[i + 1], sizeof(m->replicas[i]));
        m->vote[i] = m->vote[i + 1];
    }
    m->n_replicas--;
    memset(m->replicas[m->n_replicas], 0, sizeof(m->replicas[0]));
    m->vote[m->n_replicas] = CL_VOTER;
}

int cl_shard_map_change(struct cl_shard_map *m, enum cl_shard_op op, const char *name,
                    uint64_t epoch, const char *primary)
{
    int at = name && name_ok(name, strlen(name)) ? find(m, name) : -2;
    unsigned changing = 0, voters = 0;

    if (at == -2)
        return TERN_EINVAL;
    for (unsigned i = 0; i < m->n_replicas; i++) {
        changing += m->vote[i] != CL_VOTER;
        voters += m->vote[i] != CL_LEARNER;
    }
    switch (op) {
    case CL_OP_ADD:
        if (at >= 0 && m->vote[at] == CL_LEAVING) {
            m->vote[at] = CL_VOTER;       /* a removal called off */
            return 0;
        }
        if (at >= 0)
            return TERN_EEXIST;
        if (changing)
            return TERN_EBUSY;
        if (m->n_replicas == CL_REPLICAS_MAX)
            return TERN_E2BIG;
        snprintf(m->replicas[m->n_replicas], sizeof(m->replicas[0]), "%s", name);
        m->vote[m->n_replicas++] = CL_LEARNER;
        return 0;
    case CL_OP_REMOVE:
        if (at < 0)
            return TERN_ENOENT;
        if (m->vote[at] == CL_LEARNER) {
            drop_at(m, (unsigned)at);     /* it never counted: nothing to wait for */
            return 0;
        }
        if (m->vote[at] == CL_LEAVING)
            return 1;
        if (changing)
            return TERN_EBUSY;
        if (voters == 1)
            return TERN_EINVAL;
        m->vote[at] = CL_LEAVING;
        return 0;
    case CL_OP_PROMOTE:
    case CL_OP_DROP:
        if (m->epoch != epoch || !primary || strcmp(m->primary, primary) != 0 || at < 0 ||
            m->vote[at] != (op == CL_OP_PROMOTE ? CL_LEARNER : CL_LEAVING) ||
            (op == CL_OP_DROP && strcmp(name, m->primary) == 0))
            return TERN_ESTALE;     /* a leaving primary hands over first */
        if (op == CL_OP_PROMOTE)
            m->vote[at] = CL_VOTER;
        else
            drop_at(m, (unsigned)at);
        return 0;
    }
    return TERN_EINVAL;
}

int cl_shard_change(struct cl_etcd *e, const char *prefix, const char *id, enum cl_shard_op op,
                    const char *name, uint64_t epoch, const char *primary,
                    struct cl_shard_map *out)
{
    char key[CL_KEY_MAX + 1], json[1024];
    struct cl_shard_map m;
    int rc;

    if (!name || !name_ok(name, strlen(name)))
        return TERN_EINVAL;
    rc = key_of(key, prefix, id, "map");
    for (int i = 0; rc == 0 && i < CAS_TRIES; i++) {
        int64_t mod = 0;
        bool swapped = false;
        int n;

        if ((rc = cl_shard_get(e, prefix, id, &m, &mod)) < 0)
            return rc;
        if ((rc = cl_shard_map_change(&m, op, name, epoch, primary)) < 0)
            return rc;
        if (rc == 0) {
            if ((n = cl_shard_map_json(&m, json, sizeof(json))) < 0)
                return n;
            rc = cl_etcd_cas(e, key, mod, json, (size_t)n, 0, &swapped);
            if (rc < 0)
                return rc;
            if (!swapped)
                continue;       /* the map moved: read it again */
        }
        if (out)
            *out = m;
        return 0;
    }
    return rc < 0 ? rc : TERN_EAGAIN;
}

int cl_shard_resign(struct cl_etcd *e, const char *prefix, const char *id, int64_t lease)
{
    char office[CL_KEY_MAX + 1];
    struct holder h = {{0}, 0};
    int rc = key_of(office, prefix, id, "primary");

    if (rc == 0)
        rc = cl_etcd_get(e, office, false, take_holder, &h, NULL);
    if (rc < 0 || !lease || h.lease != lease)
        return rc;
    /* Between the read and the delete the office changes hands only if our
     * lease ran out meanwhile; deleting a successor's office then costs one
     * more election, never a write: epochs fence, not offices. */
    return cl_etcd_delete(e, office, false, NULL);
}

int cl_shard_campaign(struct cl_etcd *e, const char *prefix, const char *id, const char *me,
                      int64_t lease, bool candidate, struct cl_shard_map *out,
                      enum cl_role *role)
{
    char office[CL_KEY_MAX + 1];
    struct holder h = {{0}, 0};
    bool created = false;
    int rc, at;

    *role = CL_ROLE_NONE;
    if (!lease || !name_ok(me, strlen(me)))
        return TERN_EINVAL;
    if ((rc = cl_shard_get(e, prefix, id, out, NULL)) < 0)
        return rc;
    if ((at = find(out, me)) < 0)
        return 0;
    if ((rc = key_of(office, prefix, id, "primary")) < 0)
        return rc;
    /* Learners and leaving voters never stand (shard.h). */
    if (out->vote[at] != CL_VOTER)
        candidate = false;
    /* Not standing: only learn who holds the office (it may be us still,
     * from before). */
    if (!candidate)
        rc = cl_etcd_get(e, office, false, take_holder, &h, NULL);
    else
        rc = cl_etcd_create(e, office, me, strlen(me), lease, &created, take_holder, &h);
    if (rc < 0)
        return rc;
    if (h.lease == lease && out->vote[at] == CL_LEARNER) {
        /* An office from before this node was removed and added again: a
         * learner holds none. */
        return cl_shard_resign(e, prefix, id, lease);
    }
    if (created || h.lease == lease) {
        if ((rc = take_term(e, prefix, id, me, created, out)) < 0)
            return rc;
        *role = CL_ROLE_PRIMARY;
        return 0;
    }
    /* Another holds it. Until it has written its term into the map, the
     * map names the one before: ask again. */
    if (h.name[0] && strcmp(out->primary, h.name) == 0)
        *role = CL_ROLE_BACKUP;
    return 0;
}

int cl_node_tcp_addr(const uint8_t *json, size_t len, char *out, size_t cap)
{
    struct json_tokener *t;
    json_object *o = NULL, *listen;
    int rc = TERN_EPROTO;

    if (len > 65536)
        return TERN_EPROTO;
    t = json_tokener_new_ex(4);
    if (!t)
        return TERN_ENOMEM;
    o = json_tokener_parse_ex(t, (const char *)json, (int)len);
    if (!o || json_tokener_get_error(t) != json_tokener_success ||
        json_tokener_get_parse_end(t) != len || !json_object_is_type(o, json_type_object) ||
        !json_object_object_get_ex(o, "listen", &listen) ||
        !json_object_is_type(listen, json_type_array))
        goto out;
    rc = TERN_ENOENT;
    for (size_t i = 0; i < json_object_array_length(listen); i++) {
        json_object *u = json_object_array_get_idx(listen, i);
        const char *s;
        size_t n;

        if (!json_object_is_type(u, json_type_string)) {
            rc = TERN_EPROTO;
            goto out;
        }
        s = json_object_get_string(u);
        n = (size_t)json_object_get_string_len(u);
        if (n <= 6 || strncmp(s, "tcp://", 6) || memchr(s, 0, n))
            continue;
        if (n - 6 >= cap) {
            rc = TERN_E2BIG;
            goto out;
        }
        memcpy(out, s + 6, n - 6);
        out[n - 6] = 0;
        rc = 0;
        break;
    }
out:
    json_object_put(o);
    json_tokener_free(t);
    return rc;
}

int cl_node_mongo_addr(const uint8_t *json, size_t len, char *out, size_t cap)
{
    struct json_tokener *t;
    json_object *o = NULL, *m;
    int rc = TERN_EPROTO;
    size_t n;

    if (len > 65536)
        return TERN_EPROTO;
    t = json_tokener_new_ex(4);
    if (!t)
        return TERN_ENOMEM;
    o = json_tokener_parse_ex(t, (const char *)json, (int)len);
    if (!o || json_tokener_get_error(t) != json_tokener_success ||
        json_tokener_get_parse_end(t) != len || !json_object_is_type(o, json_type_object))
        goto out;
    rc = TERN_ENOENT;
    if (!json_object_object_get_ex(o, "mongo", &m))
        goto out;
    rc = TERN_EPROTO;
    if (!json_object_is_type(m, json_type_string))
        goto out;
    n = (size_t)json_object_get_string_len(m);
    if (!n || memchr(json_object_get_string(m), 0, n))
        goto out;
    rc = TERN_E2BIG;
    if (n >= cap)
        goto out;
    memcpy(out, json_object_get_string(m), n);
    out[n] = 0;
    rc = 0;
out:
    json_object_put(o);
    json_tokener_free(t);
    return rc;
}

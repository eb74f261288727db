/* The smallest tern program: a "greeter" service and a client calling it.
 *
 * One endpoint per thread: the server thread runs its endpoint, the main
 * thread owns the client endpoint. Build against an installed tern:
 *
 *   cc hello.c $(pkg-config --cflags --libs tern) -o hello && ./hello
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <tern/tern.h>

enum { GREETER = 10, GREET = 1 };

/* The request is read in place; the reply is written straight into the
 * transport's send buffer. */
static int greet(struct tern_req *req, const void *name, size_t len, void *ctx)
{
    char *out = tern_reply_alloc(req, len + 7);

    if (!out)
        return TERN_EMSGSIZE;
    memcpy(out, "hello, ", 7);
    memcpy(out + 7, name, len);
    return 0;
}

static const struct tern_method greeter_methods[] = {
    {.id = GREET, .name = "greet", .handler = greet},
};

static const struct tern_service greeter = {
    .name = "greeter", .id = GREETER, .methods = greeter_methods, .n_methods = 1,
};

static void *serve(void *arg)
{
    tern_rpc_run(arg, -1);
    return NULL;
}

int main(void)
{
    struct tern_rpc_ep *server, *client;
    struct tern_session *s;
    char uri[128], reply[64];
    size_t len;
    pthread_t t;
    int rc;

    if (tern_rpc_open(NULL, &server) < 0 || tern_rpc_register(server, &greeter) < 0 ||
        tern_rpc_listen(server, "tcp://127.0.0.1:0", uri, sizeof(uri)) < 0)
        return 1;
    pthread_create(&t, NULL, serve, server);

    tern_rpc_open(NULL, &client);
    rc = tern_rpc_connect(client, uri, 2000000000ull, &s);
    if (rc == 0)
        rc = tern_call_sync(s, GREETER, GREET, "world", 5, reply, sizeof(reply) - 1, &len,
                            1000000000ull);
    if (rc == 0) {
        reply[len] = 0;
        printf("%s\n", reply);
    } else {
        fprintf(stderr, "hello: %s\n", tern_strerror(rc));
    }
    /* Errors come back as codes, never as crashes: */
    rc = tern_call_sync(s, GREETER, 99, "", 0, NULL, 0, NULL, 1000000000ull);
    printf("unknown method -> %s (%s)\n", tern_err_name(rc), tern_strerror(rc));

    tern_rpc_close(client);
    tern_rpc_stop(server);
    pthread_join(t, NULL);
    tern_rpc_close(server);
    return 0;
}

// A C++ program built against the installed library: every public header
// must compile as C++ (extern "C"), and the calls must link and run.
#include <tern/tern.h>
#include <tern/kv.h>
// The document client's headers are installed where libbson was found.
#if __has_include(<tern/doc.h>)
#include <tern/doc.h>
#define HAVE_DOC 1
#endif
#if __has_include(<tern/doc_service.h>)
#include <tern/doc_service.h>
#endif

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

static int echo(struct tern_req *req, const void *data, size_t len, void *)
{
    void *out = tern_reply_alloc(req, len);

    if (!out)
        return TERN_EMSGSIZE;
    std::memcpy(out, data, len);
    return 0;
}

static const struct tern_method methods[] = {{1, "echo", echo, 0}};

int main()
{
    struct tern_service svc = {};
    struct tern_rpc_ep *server = nullptr, *client = nullptr;
    struct tern_session *s = nullptr;
    char bound[128], reply[64];
    size_t len = 0;

    svc.name = "echo";
    svc.id = 7;
    svc.methods = methods;
    svc.n_methods = 1;
    if (tern_rpc_open(nullptr, &server) < 0 || tern_rpc_register(server, &svc) < 0 ||
        tern_rpc_listen(server, "tcp://127.0.0.1:0", bound, sizeof(bound)) < 0)
        return 1;
    std::thread t([server] { tern_rpc_run(server, 5000000000ll); });
    int rc = tern_rpc_open(nullptr, &client);
    if (rc == 0)
        rc = tern_rpc_connect(client, bound, 2000000000ull, &s);
    if (rc == 0)
        rc = tern_call_sync(s, 7, 1, "c++", 3, reply, sizeof(reply), &len, 2000000000ull);
    tern_rpc_stop(server);
    t.join();
    if (rc < 0 || std::string(reply, len) != "c++") {
        std::fprintf(stderr, "call: %s\n", tern_strerror(rc));
        return 1;
    }
    // The KV client links too: nobody serves here, so it is refused.
    struct tern_kv *kv = nullptr;
    const char *uris[] = {"tcp://127.0.0.1:1"};
    rc = tern_kv_open(client, uris, 1, 500000000ull, &kv);
    if (rc != TERN_ECONNREFUSED) {
        std::fprintf(stderr, "kv open: %s\n", tern_strerror(rc));
        return 1;
    }
#ifdef HAVE_DOC
    // So does the document client, with libbson's flags from tern.pc.
    struct tern_doc *doc = nullptr;
    rc = tern_doc_open(client, uris, 1, 500000000ull, &doc);
    if (rc != TERN_ECONNREFUSED) {
        std::fprintf(stderr, "doc open: %s\n", tern_strerror(rc));
        return 1;
    }
#endif
    tern_rpc_close(client);
    tern_rpc_close(server);
    std::printf("c++ consumer: ok\n");
    return 0;
}

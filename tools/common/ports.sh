# Sourced by the scripts that start servers on 127.0.0.1 (tests/ternd_*.sh,
# tools/rpcbench/*.sh).
#
# free_port: a TCP port nothing listens on now, chosen below the kernel's
# ephemeral range. A port asked of the kernel (bind to port 0) is an
# ephemeral one, and any outgoing connection (a ternd dialling etcd or a
# peer) may take it between the pick and the server's bind: ternd then
# fails with "address already in use", or worse, a status asked of it
# reaches whoever took it. Ports handed out are noted in $dir/.ports (when
# the script has a $dir) so that one run never gets the same port twice.
free_port() {
    python3 - "${dir:-}" <<'PY'
import os, random, socket, sys
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
seen_path = os.path.join(sys.argv[1], ".ports") if sys.argv[1] else None
seen = set()
if seen_path and os.path.exists(seen_path):
    seen = {int(x) for x in open(seen_path).read().split()}
for _ in range(500):
    p = random.randrange(10000, lo) if lo > 11000 else 0
    if p in seen:
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
        p = s.getsockname()[1]
    except OSError:
        continue
    finally:
        s.close()
    if seen_path:
        with open(seen_path, "a") as f:
            f.write(f"{p}\n")
    print(p)
    break
else:
    sys.exit("free_port: no free port below the ephemeral range")
PY
}

"""The official Kubernetes Python client's streaming helpers against Shoal: `stream` for exec
(exit code, stdout and stderr apart, stdin and its close) and `portforward` (the kubelet's
channel protocol: an HTTP exchange through a forwarded port, and the error of a port nothing
listens on). Usage: python_stream.py KUBECONFIG (pods `shell` and `web` exist and run).
"""
import sys
import time

from kubernetes import client, config
from kubernetes.stream import portforward, stream
from kubernetes.stream.ws_client import STDIN_CHANNEL

c = client.Configuration()
config.load_kube_config(config_file=sys.argv[1], client_configuration=c)
core = client.CoreV1Api(client.ApiClient(c))

# exec: streams apart and the exit code from the status channel.
resp = stream(
    core.connect_get_namespaced_pod_exec, "shell", "default",
    command=["sh", "-c", "echo py-out; echo py-err >&2; exit 4"], container="main",
    stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False,
)
resp.run_forever(timeout=30)
out, err = resp.read_stdout(), resp.read_stderr()
assert (out, err) == ("py-out\n", "py-err\n"), (out, err)
assert resp.returncode == 4, resp.returncode

# stdin, and its close (v5) ending `cat`.
resp = stream(
    core.connect_get_namespaced_pod_exec, "shell", "default", command=["cat"], container="main",
    stderr=True, stdin=True, stdout=True, tty=False, _preload_content=False,
)
resp.write_stdin("from python\n")
resp.close_channel(STDIN_CHANNEL)
resp.run_forever(timeout=30)
out = resp.read_stdout()
assert out == "from python\n", (out, resp.read_stderr(), resp.subprotocol)
assert resp.returncode == 0, resp.returncode


def http_get(sock, path):
    """One HTTP/1.0 exchange, read to its Content-Length."""
    sock.setblocking(True)
    sock.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    data = b""
    deadline = time.time() + 20
    while time.time() < deadline:
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
            if length and len(body) >= length[0]:
                return head.decode(), body
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    raise AssertionError(f"incomplete answer: {data!r}")


pf = portforward(core.connect_get_namespaced_pod_portforward, "web", "default", ports="8080")
head, body = http_get(pf.socket(8080), "/index.html")
assert head.startswith("HTTP/1.1 200 OK"), head
assert body, "a page"
pf.close()

pf = portforward(core.connect_get_namespaced_pod_portforward, "web", "default", ports="9999")
deadline = time.time() + 20
while pf.error(9999) is None and time.time() < deadline:
    time.sleep(0.1)
error = pf.error(9999) or ""
assert "error forwarding port 9999 to pod web" in error and "refused" in error, error
pf.close()

print("python streams: all checks passed")

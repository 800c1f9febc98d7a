"""The kubelet's container-log endpoint, played on 127.0.0.1 for nodes that have no kubelet (kwok nodes).

kube-apiserver serves `GET pods/{name}/log` by proxying to the node's kubelet at
`https://<InternalIP>:<status.daemonEndpoints.kubeletEndpoint.Port>/containerLogs/{namespace}/{pod}/{container}`
(kubernetes pkg/registry/core/pod/strategy.go LogLocation). kwok points every node at this server (--node-ip,
--node-port), so the program reads logs through the real API server exactly as on IKS.
"""
from __future__ import annotations

import http.server
import ssl
import threading
from collections import defaultdict


class LogStore:
    """Container logs by (namespace, pod, container); written by the doubles that play what runs in the pods. A new
    pod under the same name (another uid) starts with empty logs, as its containers are new."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logs: dict[tuple[str, str, str], list[str]] = defaultdict(list)
        self._uids: dict[tuple[str, str], str] = {}

    def append(self, namespace: str, pod: str, container: str, line: str, uid: str = "") -> None:
        with self._lock:
            if uid and self._uids.get((namespace, pod)) not in (None, uid):
                for key in [k for k in self._logs if k[:2] == (namespace, pod)]:
                    del self._logs[key]
            if uid:
                self._uids[(namespace, pod)] = uid
            self._logs[(namespace, pod, container)].append(line)

    def read(self, namespace: str, pod: str, container: str) -> str:
        with self._lock:
            lines = self._logs.get((namespace, pod, container))
            return "".join(f"{ln}\n" for ln in lines) if lines else ""

    def lines(self, namespace: str, pod: str, container: str) -> list[str]:
        with self._lock:
            return list(self._logs.get((namespace, pod, container), []))


class KubeletLogServer:
    def __init__(self, store: LogStore, cert: str, key: str) -> None:
        self.store = store
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                parts = self.path.split("?", 1)[0].strip("/").split("/")
                if len(parts) == 4 and parts[0] == "containerLogs":
                    body = outer.store.read(parts[1], parts[2], parts[3]).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_error(404, "only /containerLogs is played")

            def log_message(self, *_args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="kubelet-logs", daemon=True)

    def start(self) -> "KubeletLogServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

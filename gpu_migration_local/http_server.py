"""The HTTP plumbing the emulators share: a ThreadingHTTPServer on 127.0.0.1 (a free port) served from a daemon
thread, handing every request to one callable `handle(method, path, headers, body_bytes) -> (status, payload)`.

A str payload is sent as text/plain, None as an empty body (no Content-Type), anything else as JSON.
"""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable

Handle = Callable[[str, str, Any, bytes], tuple[int, Any]]


def encode(payload: Any) -> tuple[bytes, str | None]:
    """(body, Content-Type) for a payload."""
    if payload is None:
        return b"", None
    if isinstance(payload, str):
        return payload.encode(), "text/plain"
    return json.dumps(payload).encode(), "application/json"


class LocalServer:
    def __init__(self, handle: Handle, methods: Iterable[str] = ("GET", "POST", "PUT", "PATCH", "DELETE"),
                 poll_interval: float = 0.01, port: int = 0) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(handle, methods))
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(poll_interval,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> "LocalServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(handle: Handle, methods: Iterable[str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            status, payload = handle(self.command, self.path, self.headers, self.rfile.read(length))
            data, content_type = encode(payload)
            self.send_response(status)
            if content_type:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:  # keep test output quiet
            pass

    for method in methods:
        setattr(Handler, f"do_{method}", Handler._serve)
    return Handler

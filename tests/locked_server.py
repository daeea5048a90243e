"""A server that wants a key for its listing, as vLLM started with `--api-key` does
(vllm/entrypoints/openai/api_server.py `AuthenticationMiddleware`: a request under /v1
without `Authorization: Bearer KEY` gets 401 `{"error": "Unauthorized"}`). llama-server
leaves /v1/models public even with `--api-key`, so it cannot stand in here."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator

KEY = "sk-local-test-key-5678"
MODEL = "locked-model"


class Locked(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.headers.get("Authorization") == f"Bearer {KEY}":
            code, body = 200, b'{"object": "list", "data": [{"id": "%s"}]}' % MODEL.encode()
        else:
            code, body = 401, b'{"error": "Unauthorized"}'
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def locked_server() -> Iterator[int]:
    """The server running on 127.0.0.1; its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Locked)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()

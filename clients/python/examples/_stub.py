"""A stand-in for the web: a page served on a loopback port (no network needed)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Page(BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self) -> None:
        _Page.hits += 1
        body = b"Tollgate docs: every tool call waits for a human."
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve_page() -> str:
    """Serves the page on a free loopback port; its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/docs"


def hits() -> int:
    return _Page.hits

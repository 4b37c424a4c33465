"""The HTTP endpoints every long-running role serves: `/metrics`, `/healthz`, `/readyz`.

`prometheus_client` provides the metric types and the text exposition format; a small
`ThreadingHTTPServer` serves them (the library's own server has no health route). Liveness and
readiness are apart, as Kubernetes probes them: `/healthz` answers 200 while the role's loop runs
(a liveness probe restarts what fails it, which helps a stuck loop and nothing else); `/readyz`
answers 200 only while the role does its work (what that means is the role's: see its probes).
A role may add pages of its own (the bookkeeper's status page).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

Probe = Callable[[], tuple[bool, dict]]
"""A health check: whether it passes, and the details to show (JSON)."""

Page = Callable[[], tuple[bytes, str]]
"""An extra route: its body and content type, computed per request."""


class HttpEndpoints:
    """`/metrics` (Prometheus text), `/healthz` (liveness) and `/readyz` (readiness), both JSON
    answered 200 or 503, and any `pages`, on one port."""

    def __init__(
        self,
        registry: CollectorRegistry,
        port: int,
        liveness: Probe,
        readiness: Probe,
        host: str = "127.0.0.1",
        before_scrape: Callable[[], None] | None = None,
        pages: dict[str, Page] | None = None,
        name: str = "icekeeper-http",
    ) -> None:
        # Loopback unless asked (`<role>.http_host`): metrics and pages name tables and topics,
        # and nothing authenticates a client.
        self.registry = registry
        self.before_scrape = before_scrape
        self.probes = {"/healthz": liveness, "/readyz": readiness}
        self.pages = pages or {}
        self.server = ThreadingHTTPServer((host, port), self._handler())
        self.port = self.server.server_address[1]
        # A short poll: `stop` waits for it, and a role stops within a second of SIGTERM.
        self.thread = threading.Thread(
            target=lambda: self.server.serve_forever(poll_interval=0.1), name=name, daemon=True
        )

    def start(self) -> HttpEndpoints:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _respond(self, path: str) -> tuple[bytes, int, str]:
        if path == "/metrics":
            if self.before_scrape is not None:
                self.before_scrape()
            return generate_latest(self.registry), 200, CONTENT_TYPE_LATEST
        if (probe := self.probes.get(path)) is not None:
            ok, details = probe()
            body = json.dumps({"ok": ok, **details}).encode()
            return body, 200 if ok else 503, "application/json"
        if (page := self.pages.get(path)) is not None:
            try:
                body, content_type = page()
            except Exception as error:  # noqa: BLE001 - a page's failure must not stop the role
                log.warning("HTTP page failed", extra={"path": path, "error": repr(error)})
                return f"{path} failed: {error}\n".encode(), 500, "text/plain; charset=utf-8"
            return body, 200, content_type
        return b"not found\n", 404, "text/plain"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body, status, content_type = outer._respond(self.path.split("?", 1)[0])
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # quiet: no access log on stderr
                return

        return Handler

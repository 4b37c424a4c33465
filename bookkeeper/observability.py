"""Prometheus metrics and health endpoints for the bookkeeper.

`prometheus_client` provides the metric types and the text exposition format; a small
`ThreadingHTTPServer` serves `/metrics`, `/healthz` and `/readyz` (the library's own server has no
health route). Liveness and readiness are apart, as Kubernetes probes them: `/healthz` answers 200
while the service loop runs, a standby waiting for the lease included (a liveness probe restarts
what fails it, which helps a stuck loop and nothing else); `/readyz` answers 200 only while the
bookkeeper holds its group's lease and finished a cycle recently.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class BookkeeperMetrics:
    """The metrics one bookkeeper exposes (its own registry, so tests can run several)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.pending_monikers = Gauge(
            "icekeeper_pending_monikers",
            "Monikers received but not yet committed",
            ["table"],
            registry=self.registry,
        )
        self.pending_bytes = Gauge(
            "icekeeper_pending_bytes",
            "Bytes of files named by pending monikers",
            ["table"],
            registry=self.registry,
        )
        self.commit_latency = Histogram(
            "icekeeper_commit_latency_seconds",
            "Time to commit one table's snapshot, footers included",
            ["table"],
            registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.last_commit = Gauge(
            "icekeeper_last_commit_timestamp_seconds",
            "When the table's last snapshot was committed",
            ["table"],
            registry=self.registry,
        )
        self.last_commit_age = Gauge(
            "icekeeper_last_commit_age_seconds",
            "Seconds since the table's last committed snapshot",
            ["table"],
            registry=self.registry,
        )
        self.freshness_lag = Gauge(
            "icekeeper_freshness_lag_seconds",
            "Now minus the table's watermark (event time fully committed)",
            ["table"],
            registry=self.registry,
        )
        self.records = Counter(
            "icekeeper_records_committed_total", "Rows committed", ["table"], registry=self.registry
        )
        self.commits = Counter(
            "icekeeper_commits_total", "Snapshots committed", ["table"], registry=self.registry
        )
        self.errors = Counter(
            "icekeeper_errors_total", "Errors by kind", ["kind"], registry=self.registry
        )
        self.purged_files = Counter(
            "icekeeper_purged_files_total",
            "Upsert tables: mostly-deleted data files the bookkeeper replaced by their live rows",
            ["table"],
            registry=self.registry,
        )
        self.purged_rows = Counter(
            "icekeeper_purged_rows_total",
            "Upsert tables: deleted rows readers no longer read after the bookkeeper's purges",
            ["table"],
            registry=self.registry,
        )
        self.purge_seconds = Counter(
            "icekeeper_purge_seconds_total",
            "Upsert tables: time the bookkeeper spent purging mostly-deleted data files",
            ["table"],
            registry=self.registry,
        )
        self.epoch = Gauge(
            "icekeeper_bookkeeper_epoch",
            "Epoch of the lease this bookkeeper holds (0: it holds none, a standby)",
            registry=self.registry,
        )
        self.last_cycle = Gauge(
            "icekeeper_last_cycle_timestamp_seconds",
            "When the last cycle finished (0: none yet, a standby)",
            registry=self.registry,
        )
        self._watermarks: dict[str, float] = {}
        self._committed_at: dict[str, float] = {}

    def observe_commit(
        self, table: str, seconds: float, records: int, watermark_ms: int | None
    ) -> None:
        now = time.time()
        self.commit_latency.labels(table).observe(seconds)
        self.commits.labels(table).inc()
        self.records.labels(table).inc(records)
        self.last_commit.labels(table).set(now)
        self._committed_at[table] = now
        if watermark_ms is not None:
            self._watermarks[table] = watermark_ms / 1000

    def refresh_ages(self) -> None:
        now = time.time()
        for table, committed in self._committed_at.items():
            self.last_commit_age.labels(table).set(now - committed)
        for table, watermark in self._watermarks.items():
            self.freshness_lag.labels(table).set(max(0.0, now - watermark))


Probe = Callable[[], tuple[bool, dict]]
"""A health check: whether it passes, and the details to show (JSON)."""


class HealthServer:
    """`/metrics` (Prometheus text), `/healthz` (liveness) and `/readyz` (readiness), both JSON
    answered 200 or 503, on one port."""

    def __init__(
        self,
        metrics: BookkeeperMetrics,
        port: int,
        liveness: Probe,
        readiness: Probe,
        host: str = "127.0.0.1",
    ) -> None:
        # Loopback unless asked (`bookkeeper.http_host`): metrics name tables and topics, and
        # nothing authenticates a scraper.
        self.metrics = metrics
        self.probes = {"/healthz": liveness, "/readyz": readiness}
        handler = self._handler()
        self.server = ThreadingHTTPServer((host, port), handler)
        self.port = self.server.server_address[1]
        # A short poll: `stop` waits for it, and a bookkeeper stops within a second of SIGTERM.
        self.thread = threading.Thread(
            target=lambda: self.server.serve_forever(poll_interval=0.1),
            name="icekeeper-http",
            daemon=True,
        )

    def start(self) -> HealthServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/metrics"):
                    outer.metrics.refresh_ages()
                    body, status, content_type = (
                        generate_latest(outer.metrics.registry),
                        200,
                        CONTENT_TYPE_LATEST,
                    )
                elif (probe := outer.probes.get(self.path.split("?", 1)[0])) is not None:
                    ok, details = probe()
                    body, status, content_type = (
                        json.dumps({"ok": ok, **details}).encode(),
                        200 if ok else 503,
                        "application/json",
                    )
                else:
                    body, status, content_type = b"not found\n", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # quiet: no access log on stderr
                return

        return Handler

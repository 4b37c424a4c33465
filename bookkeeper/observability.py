"""Prometheus metrics and health endpoints for the bookkeeper.

The server is the one every role uses (`common/http_endpoints.py`). `/healthz` answers 200 while
the service loop runs, a standby waiting for the lease included; `/readyz` answers 200 only while
the bookkeeper holds its group's lease and finished a cycle recently. The metrics also keep the
last hour of commits per table, which the status page draws.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from icekeeper.common.http_endpoints import HttpEndpoints, Page, Probe

HISTORY_S = 3600.0
"""How far back the status page's charts go: the commits of the last hour are kept."""
HISTORY_MAX_POINTS = 4000
"""At most this many commits kept per table (an hour at a commit a second, and some)."""


@dataclass(frozen=True)
class CommitPoint:
    """One committed snapshot, as the status page charts it."""

    at: float
    """Wall-clock time of the commit (seconds)."""
    latency_s: float
    freshness_s: float | None
    """The commit's time minus the table's watermark (None: the table has no watermark yet)."""


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
        self.history: dict[str, deque[CommitPoint]] = {}
        """The last hour of commits per table (in memory only: a restarted bookkeeper starts an
        empty chart)."""

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
        watermark = self._watermarks.get(table)
        points = self.history.setdefault(table, deque(maxlen=HISTORY_MAX_POINTS))
        points.append(CommitPoint(now, seconds, None if watermark is None else now - watermark))
        while points and points[0].at < now - HISTORY_S:
            points.popleft()

    def recent_commits(self, table: str, now: float | None = None) -> list[CommitPoint]:
        """The table's commits of the last hour, oldest first."""
        since = (time.time() if now is None else now) - HISTORY_S
        points = list(self.history.get(table, ()))  # one step under the GIL: the loop appends
        return [point for point in points if point.at >= since]

    def refresh_ages(self) -> None:
        now = time.time()
        for table, committed in self._committed_at.items():
            self.last_commit_age.labels(table).set(now - committed)
        for table, watermark in self._watermarks.items():
            self.freshness_lag.labels(table).set(max(0.0, now - watermark))


class HealthServer(HttpEndpoints):
    """The bookkeeper's `/metrics`, `/healthz`, `/readyz` and its status page (`/`, `/status`)."""

    def __init__(
        self,
        metrics: BookkeeperMetrics,
        port: int,
        liveness: Probe,
        readiness: Probe,
        host: str = "127.0.0.1",
        pages: dict[str, Page] | None = None,
    ) -> None:
        self.metrics = metrics
        super().__init__(
            metrics.registry,
            port,
            liveness,
            readiness,
            host=host,
            before_scrape=metrics.refresh_ages,
            pages=pages,
        )

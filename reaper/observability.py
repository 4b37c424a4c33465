"""Prometheus metrics of the reaper's passes, served with health on `reaper.http_port`.

Every number comes from the pass's own report (`PassReport`, the JSON line written to
`reaper.report_path`), so what Prometheus shows and what the report file says are the same
counts. Counters are per table and only grow; a dry run counts as a pass and nothing else (it
changes nothing).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from icekeeper.reaper.service import PassReport

STEPS = ("retention", "compaction", "manifests", "expiry", "orphans")
"""The steps of a table's pass, in order (`Reaper._table_pass`); `load` and `pass` are failures
outside a step (the table could not be loaded, the pending monikers could not be read)."""


class ReaperMetrics:
    """The metrics one reaper exposes (its own registry, so tests can run several)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.pass_duration = Histogram(
            "icekeeper_reaper_pass_duration_seconds",
            "Time one maintenance pass over every table took",
            registry=self.registry,
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600),
        )
        self.passes = Counter(
            "icekeeper_reaper_passes_total",
            "Passes by outcome: ok, errors (a step failed), skipped (another reaper held the "
            "lease), failed (the pass itself failed), dry_run",
            ["outcome"],
            registry=self.registry,
        )
        self.last_pass = Gauge(
            "icekeeper_reaper_last_pass_timestamp_seconds",
            "When the last pass ended (0: none yet)",
            registry=self.registry,
        )
        self.files_compacted = Counter(
            "icekeeper_reaper_files_compacted_total",
            "Data files compaction replaced",
            ["table"],
            registry=self.registry,
        )
        self.files_added = Counter(
            "icekeeper_reaper_files_added_total",
            "Data files compaction wrote",
            ["table"],
            registry=self.registry,
        )
        self.snapshots_expired = Counter(
            "icekeeper_reaper_snapshots_expired_total",
            "Snapshots expired",
            ["table"],
            registry=self.registry,
        )
        self.orphans_removed = Counter(
            "icekeeper_reaper_orphans_removed_total",
            "Files no snapshot reached, older than the grace period, deleted",
            ["table"],
            registry=self.registry,
        )
        self.files_deleted = Counter(
            "icekeeper_reaper_files_deleted_total",
            "Files deleted by snapshot expiry and orphan removal together",
            ["table"],
            registry=self.registry,
        )
        self.bytes_deleted = Counter(
            "icekeeper_reaper_deleted_bytes_total",
            "Bytes of the files deleted by snapshot expiry and orphan removal",
            ["table"],
            registry=self.registry,
        )
        self.retention_rows_deleted = Counter(
            "icekeeper_reaper_retention_rows_deleted_total",
            "Rows the retention step deleted",
            ["table"],
            registry=self.registry,
        )
        self.step_failures = Counter(
            "icekeeper_reaper_step_failures_total",
            "Failed steps (the next pass retries them)",
            ["table", "step"],
            registry=self.registry,
        )

    def show_tables(self, tables: list[str]) -> None:
        """Every configured table's series at 0 before its first pass: a rate or an alert on a
        series that does not exist yet sees nothing."""
        for table in tables:
            for counter in (
                self.files_compacted,
                self.files_added,
                self.snapshots_expired,
                self.orphans_removed,
                self.files_deleted,
                self.bytes_deleted,
                self.retention_rows_deleted,
            ):
                counter.labels(table)
            for step in STEPS:
                self.step_failures.labels(table, step)

    def observe_pass(self, report: PassReport) -> None:
        """Count one finished pass (what `report.to_json()` also writes to the report file)."""
        self.last_pass.set(time.time())
        self.pass_duration.observe(report.seconds)
        outcome = report.outcome()
        self.passes.labels(outcome).inc()
        if outcome in ("dry_run", "skipped"):
            return
        for table in report.tables:
            self.files_compacted.labels(table.table).inc(table.files_compacted)
            self.files_added.labels(table.table).inc(table.files_added)
            self.snapshots_expired.labels(table.table).inc(table.snapshots_expired)
            self.orphans_removed.labels(table.table).inc(table.orphans_removed)
            self.files_deleted.labels(table.table).inc(table.files_deleted)
            self.bytes_deleted.labels(table.table).inc(table.bytes_deleted)
            self.retention_rows_deleted.labels(table.table).inc(table.retention_rows_deleted)
            for error in table.errors:
                self.step_failures.labels(table.table, error.split(":", 1)[0]).inc()

    def observe_failed_pass(self) -> None:
        """A pass that failed outside every table (the lease folder, the report file)."""
        self.last_pass.set(time.time())
        self.passes.labels("failed").inc()

"""The reaper: one maintenance pass over every configured table, once or on a schedule.

Order within a pass, per table: retention (deletes rows), compaction (rewrites small files),
manifest rewrite, snapshot expiry (deletes what only expired snapshots reached), orphan removal
(deletes what nothing reaches, older than the grace period, never a file of a pending or
quarantined moniker).
Every step is an Iceberg commit or a deletion of files Iceberg found unreachable, so a pass that
dies half way is simply run again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from pyiceberg.exceptions import NoSuchTableError

from icekeeper.common.catalog import open_catalog
from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.common.config.required import require_tables
from icekeeper.common.fencing import Fenced, Lease, LeaseRecord, Stopped, live_lease
from icekeeper.common.http_endpoints import HttpEndpoints
from icekeeper.common.in_flight import live_claimed_folders
from icekeeper.common.locations import normalize_location, table_state_folder
from icekeeper.common.rewrites import pending_rewrite_folders
from icekeeper.common.storage import append_lines
from icekeeper.common.transports import open_transport
from icekeeper.reaper.maintenance import SparkMaintenance, TableReport, gc_disabled
from icekeeper.reaper.observability import ReaperMetrics

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

Progress = Callable[[str], None]

ANOTHER_REAPER = "another reaper is running"
"""How a pass skipped for another reaper's lease says so in its report."""


@dataclass
class PassReport:
    """One pass over all tables; `to_json()` is the JSON line operators and schedulers read."""

    started_at: str
    dry_run: bool
    tables: list[TableReport] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def totals(self) -> dict[str, int]:
        keys = [
            "snapshots_expired",
            "files_deleted",
            "bytes_deleted",
            "orphans_removed",
            "files_compacted",
            "files_added",
            "retention_rows_deleted",
            "manifests_rewritten",
            "orphans_spared",
        ]
        return {key: sum(getattr(table, key) for table in self.tables) for key in keys}

    def outcome(self) -> str:
        """ok, errors (a step failed; the next pass retries it), skipped (another reaper held
        the group's lease), or dry_run."""
        if self.dry_run:
            return "dry_run"
        if any(reason.startswith(ANOTHER_REAPER) for reason in self.skipped):
            return "skipped"
        return "errors" if any(table.errors for table in self.tables) else "ok"

    def to_json(self) -> dict:
        return {
            "started_at": self.started_at,
            "dry_run": self.dry_run,
            "seconds": round(self.seconds, 3),
            **self.totals(),
            "tables": [table.to_json() for table in self.tables],
            "skipped": self.skipped,
        }


def pending_files(config: IcekeeperConfig) -> set[str]:
    """Every file named by a moniker not yet committed (data and delete files), normalized: pending
    ones, and quarantined ones, whose records are nowhere else until they are replayed."""
    transport = open_transport(config)
    files = set()
    for moniker in [
        *transport.pending(),
        *(item.moniker for item in transport.quarantined() if item.moniker is not None),
    ]:
        for entry in [*moniker.files, *moniker.delete_files]:
            files.add(normalize_location(entry.path))
    return files


class Reaper:
    """Runs maintenance passes; Spark starts on the first pass and is reused."""

    def __init__(
        self,
        config: IcekeeperConfig,
        spark: SparkSession | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        # A table_template's tables are not listed, so the reaper does not maintain them.
        require_tables(config, "the reaper maintains them", table_template=False)
        self.config = config
        self.catalog = open_catalog(config)
        self._spark = spark
        self._owns_spark = spark is None
        self._maintenance: SparkMaintenance | None = None
        self.clock = clock or (lambda: datetime.now(UTC))
        self.stop = threading.Event()
        self.metrics = ReaperMetrics()
        self.metrics.show_tables([spec.identifier for spec in config.tables])
        self.http: HttpEndpoints | None = None
        self.state = "starting"
        """What the scheduled loop does: starting, waiting (for its next pass), passing, stopped.
        `/healthz` and `/readyz` report it."""
        self._last_outcome: str | None = None
        """How the last pass ended: ok, errors, skipped (another reaper), failed; None: none
        yet."""
        self._next_pass_at: float | None = None

    def serve_http(self, port: int | None = None) -> int:
        """Start `/metrics`, `/healthz` (liveness) and `/readyz` (readiness); returns the port (0
        in config: off, unless a port is given)."""
        port = self.config.reaper.http_port if port is None else port
        self.http = HttpEndpoints(
            self.metrics.registry,
            port,
            liveness=self.liveness,
            readiness=self.readiness,
            host=self.config.reaper.http_host,
            name="icekeeper-reaper-http",
        ).start()
        return self.http.port

    def _health(self) -> dict:
        return {
            "state": self.state,
            "last_pass": self._last_outcome,
            "next_pass_in_s": None
            if self._next_pass_at is None
            else round(max(0.0, self._next_pass_at - time.time()), 1),
        }

    def liveness(self) -> tuple[bool, dict]:
        """Alive while the scheduled loop runs: waiting for a pass or in one (a pass of a big
        table takes as long as Spark needs; a liveness probe must not kill it for that)."""
        return self.state in ("starting", "waiting", "passing"), self._health()

    def readiness(self) -> tuple[bool, dict]:
        """Ready while the loop runs and its last pass did not fail outright (the lease folder or
        the report file unusable) nor find another reaper holding the group's lease; failed steps
        are the next pass's to retry and show in `icekeeper_reaper_step_failures_total`."""
        alive, details = self.liveness()
        return alive and self._last_outcome not in ("failed", "skipped"), details

    @property
    def maintenance(self) -> SparkMaintenance:
        if self._maintenance is None:
            if self._spark is None:
                from icekeeper.common.spark import spark_session

                self._spark = spark_session(self.config, "icekeeper-reaper")
            self._maintenance = SparkMaintenance(
                self._spark,
                self.config.catalog.name,
                self.config.reaper,
                self.config.group.orphan_grace,
                bookkeeper_lease=self.bookkeeper_lease,
            )
        return self._maintenance

    def bookkeeper_lease(self) -> LeaseRecord | None:
        """The group's bookkeeper lease while a bookkeeper holds it (it renews it every cycle);
        None when no bookkeeper is running, so nothing should wait for one."""
        return live_lease(self.config.group.lease_uri, self.config.group.name)

    def run_pass(self, dry_run: bool = False, progress: Progress | None = None) -> PassReport:
        """One pass over every configured table that exists; holds the group's reaper lease."""
        now = self.clock()
        report = PassReport(started_at=now.isoformat(timespec="seconds"), dry_run=dry_run)
        started = time.monotonic()
        group = self.config.group
        lease = Lease(
            group.lease_uri,
            f"{group.name}-reaper",
            ttl_s=self.config.reaper.lease_ttl,
            role="reaper",
            stop=self.stop,  # SIGTERM never waits on a lease store that does not answer
        )
        try:
            if lease.acquire(timeout_s=0) is None:
                report.skipped.append("stopped before the pass took its lease")
                return report
        except TimeoutError as error:
            report.skipped.append(f"{ANOTHER_REAPER}: {error}")
            return report
        try:
            for spec in self.config.tables:
                if self.stop.is_set():
                    break
                try:
                    table = self.catalog.load_table(spec.identifier)
                except NoSuchTableError:
                    report.skipped.append(f"{spec.identifier}: no such table yet")
                    continue
                except Exception as error:  # noqa: BLE001 - e.g. the catalog unreachable: the other tables go on, the next pass retries
                    report.tables.append(
                        TableReport(spec.identifier, dry_run=dry_run, errors=[f"load: {error}"])
                    )
                    log.error(
                        "reaper could not load a table; the next pass retries it",
                        extra={"table": spec.identifier, "error": repr(error)},
                    )
                    continue
                if progress:
                    progress(f"reaper: {spec.identifier}")
                try:
                    report.tables.append(
                        self._table_pass(table, spec.identifier, dry_run, now, lease)
                    )
                except (Fenced, Stopped):
                    raise
                except Exception as error:  # noqa: BLE001 - outside a step (pending monikers unreadable, say): as above
                    report.tables.append(
                        TableReport(spec.identifier, dry_run=dry_run, errors=[f"pass: {error}"])
                    )
                    log.error(
                        "reaper pass of a table failed; the next pass retries it",
                        extra={"table": spec.identifier, "error": repr(error)},
                    )
        except (Fenced, Stopped) as error:
            report.skipped.append(f"stopped: {error}")
        finally:
            lease.release()
        report.seconds = time.monotonic() - started
        self._write_report(report)
        return report

    def _table_pass(
        self, table: Table, identifier: str, dry_run: bool, now: datetime, lease: Lease
    ) -> TableReport:
        started = time.monotonic()
        report = TableReport(identifier, dry_run=dry_run)
        maintenance = self.maintenance

        def step(name: str, action: Callable[[], None]) -> None:
            """Run one step; a failure is reported and the pass goes on (each step is safe to
            rerun, and a later step never depends on an earlier one having succeeded)."""
            lease.renew()
            began = time.monotonic()
            try:
                action()
            except Exception as error:  # noqa: BLE001 - e.g. a commit conflict that ran out of retries
                report.errors.append(f"{name}: {error}")
                log.warning(
                    "reaper step failed; the next pass retries it",
                    extra={"table": identifier, "step": name, "error": str(error)[:2000]},
                )
            report.step_seconds[name] = round(time.monotonic() - began, 3)

        step("retention", lambda: maintenance.retention(table, identifier, report, now))
        step(
            "compaction",
            lambda: maintenance.compact(
                table, identifier, report, now, upsert=self.config.table(identifier).upsert
            ),
        )
        step("manifests", lambda: maintenance.rewrite_manifests(table, identifier, report))
        # Writers' claims, then pending monikers, then (inside each step) what snapshots reach: in
        # this order every file of a batch not yet committed is covered by one of the three.
        claims_error: Exception | None = None
        try:
            claimed = live_claimed_folders(
                table.location(), self.config.group.orphan_grace, remove_stale=not dry_run
            )
            claimed |= pending_rewrite_folders(
                table.location()
            )  # compactions the bookkeeper has yet to commit
        except Exception as error:  # noqa: BLE001 - reported by the orphans step below
            claimed, claims_error = set(), error
        claimed.add(
            table_state_folder(table.location())
        )  # the upsert key index: not in any snapshot, never an orphan
        spared = pending_files(self.config)

        def remove_orphans() -> None:
            if claims_error is not None:
                raise claims_error
            maintenance.remove_orphans(identifier, report, spared, claimed, now)

        if gc_disabled(table):
            report.skipped += [
                f"{name}: the table has gc.enabled=false (Nessie's tables do: their files may be "
                "another branch's too; its own GC removes them)"
                for name in ("expiry", "orphans")
            ]
        else:
            step("expiry", lambda: maintenance.expire(table, identifier, report, spared, now))
            step("orphans", remove_orphans)
        report.seconds = time.monotonic() - started
        log.info("reaper pass", extra={"table": identifier, **report.to_json()})
        return report

    def _write_report(self, report: PassReport) -> None:
        path = self.config.reaper.report_path
        if not path or report.dry_run:
            return
        # A file of JSON lines on a local folder, a folder of line files on an object store.
        append_lines(path, [report.to_json()])

    def run(
        self,
        every_s: float | None,
        dry_run: bool = False,
        on_pass: Callable[[PassReport], None] | None = None,
    ) -> None:
        """Passes every `every_s` seconds (the first at `reaper.triggering_time` when set), until
        stopped; with `every_s` None, one pass now (cron and CronJobs choose the time)."""
        if every_s is not None and self.http is None and self.config.reaper.http_port:
            self.serve_http()  # a one-off pass (cron) reports to its file only
        try:
            first = self._first_run_at() if every_s is not None else None
            if first is not None:
                self._wait((first - self.clock()).total_seconds())
            while not self.stop.is_set():
                began = time.monotonic()
                self.state = "passing"
                try:
                    result = self.run_pass(dry_run=dry_run)
                except Exception as error:
                    self.metrics.observe_failed_pass()
                    self._last_outcome = "failed"
                    # Outside every table's pass (the lease folder, the report file): with --every
                    # the reaper lives on and tries again at the next pass.
                    if every_s is None:
                        raise
                    log.error(
                        "reaper pass failed; the next pass retries",
                        extra={"error": repr(error), "next_in_s": every_s},
                    )
                    self._wait(every_s)
                    continue
                self.metrics.observe_pass(result)
                self._last_outcome = result.outcome()
                if on_pass:
                    on_pass(result)
                if every_s is None:
                    return
                self._wait(every_s - (time.monotonic() - began))
        finally:
            self.state = "stopped"
            if self.http is not None:
                self.http.stop()
                self.http = None

    def _wait(self, seconds: float) -> None:
        self.state = "waiting"
        self._next_pass_at = time.time() + max(0.0, seconds)
        self.stop.wait(max(0.0, seconds))
        self._next_pass_at = None

    def _first_run_at(self) -> datetime | None:
        """The next occurrence of `reaper.triggering_time`
        (seed 000: earliest start, `HH:MM:SS`)."""
        at = self.config.reaper.triggering_time
        if not at:
            return None
        now = self.clock()
        parts = [int(p) for p in at.split(":")] + [0]
        candidate = now.replace(hour=parts[0], minute=parts[1], second=parts[2], microsecond=0)
        return candidate if candidate >= now else candidate + timedelta(days=1)

    def close(self) -> None:
        """Stop Spark if this reaper started it (a caller's session is the caller's to stop)."""
        if self._spark is not None and self._owns_spark:
            self._spark.stop()

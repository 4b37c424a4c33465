"""The bookkeeper service: receive monikers, commit them per table, then acknowledge.

One cycle: receive every pending delivery, set aside unreadable ones (dead-lettered after
`max_attempts`), group the rest by table, commit each table's ready monikers as one snapshot,
and only then acknowledge them (and dead-letter quarantined ones). A crash anywhere before
the acknowledgement leaves the monikers pending; the next cycle finds them committed (by the
commit id and writer seqs in the table) and acknowledges them as duplicates. Maintenance comes
last, after every acknowledgement: the reaper's compactions (every `rewrite_poll_interval`), then
the purge of mostly-deleted data files of the upsert tables just committed (`purges.py`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError

from icekeeper.bookkeeper.commit_path import StaleEpoch, TableCommit
from icekeeper.bookkeeper.committer import Committer
from icekeeper.bookkeeper.hive_locks import with_released_locks
from icekeeper.bookkeeper.observability import BookkeeperMetrics, HealthServer
from icekeeper.bookkeeper.purges import PurgeOutcome, Purger
from icekeeper.bookkeeper.table_metadata import with_lean_commits
from icekeeper.common.catalog import load_table_or_none, open_catalog
from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.common.config.required import require_tables
from icekeeper.common.fencing import Fenced, Lease, LeaseRecord, Stopped
from icekeeper.common.file_events import location_key
from icekeeper.common.storage import append_lines
from icekeeper.common.transports import Delivery, open_transport
from icekeeper.status_page import StatusPage

log = logging.getLogger(__name__)


@dataclass
class CycleReport:
    """What one cycle did."""

    tables: list[TableCommit] = field(default_factory=list)
    dead_lettered: list[tuple[str, str]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    """Monikers refused (source, reason): recorded in their table, read again by their writer."""
    purges: dict[str, PurgeOutcome] = field(default_factory=dict)
    """Upsert tables purged after their commit (`purges.py`): what each purge did."""
    pending: int = 0
    seconds: float = 0.0

    @property
    def committed_monikers(self) -> int:
        return sum(len(t.committed) for t in self.tables)


class Bookkeeper:
    """Commits monikers for the tables of one config; run one per group of tables."""

    def __init__(
        self, config: IcekeeperConfig, epoch: int = 0, catalog: Catalog | None = None
    ) -> None:
        """`catalog`: the one to commit through; by default the config's, with lean commits
        (`table_metadata.py`)."""
        # Tables name their source (and a table_template is a source's), so commit reports,
        # sent through the first source's cluster, always have one.
        require_tables(config, "the bookkeeper commits to them")
        self.config = config
        self.catalog = catalog or with_released_locks(with_lean_commits(open_catalog(config)))
        self.transport = open_transport(config)
        self.committer = Committer(config, self.catalog, epoch)
        self.key_indexes = self.committer.key_indexes
        """The upsert tables' key indexes: warmed before the first cycle, read by purges."""
        self.rewrites = self.committer.rewrites
        self._rewrites_polled_at = float("-inf")
        workers = config.bookkeeper.footer_workers or os.cpu_count() or 2
        self.purger = Purger(
            self.catalog, self.rewrites, self.key_indexes, config.bookkeeper, workers
        )
        self._purges_due: set[str] = set()
        """Upsert tables a purge left work for (budget, failure): purged again next cycle even
        without a commit."""
        self.lease: Lease | None = None
        """The group's lease, once this bookkeeper holds it (never while it stands by)."""
        self.state = "starting"
        """What the service loop does: starting, standby (another holds the lease), warming
        (loading key indexes), active (cycling), stopped. `/healthz` and `/readyz` report it."""
        self._holder: LeaseRecord | None = None
        """While standing by: the lease of the bookkeeper that holds it."""
        self._alive_at = time.monotonic()
        """When the service loop last showed life (a lease poll, a cycle's start or end, a wait):
        liveness."""
        self._table_locations: dict[str, str] = {}
        self.stop = threading.Event()
        self._report_path = config.bookkeeper.commit_report_path
        self.metrics = BookkeeperMetrics()
        self.http: HealthServer | None = None
        self._last_cycle_at: float | None = None
        """Wall-clock time the last successful cycle finished (None before the first)."""
        self._report_producer = None
        self._empty_cycles: dict[str, int] = {}
        self._failed_cycles = 0
        self._reports_for_file: list[dict] = []
        self._reports_for_topic: list[dict] = []
        """Commit report lines not yet written (a full disk, an unreachable topic): retried with
        the next ones."""
        self._reports_failed_this_cycle = False
        self._to_release: dict[str, list[Delivery]] = {}
        """This cycle's waiting monikers per table, in the order to release them."""
        self._unacknowledged: list[Exception] = []
        """Acknowledgements that failed this cycle (`_settle`): raised once the cycle is done."""
        self._released_in: dict[str, int] = {}
        """Per table, the release round (`_release_cycles`) that last released one of its
        monikers: who goes first next time."""
        self._release_cycles = 0

    def serve_http(self, port: int | None = None) -> int:
        """Start `/metrics`, `/healthz` (liveness) and `/readyz` (readiness); returns the port (0
        in config: off, unless a port is given)."""
        port = self.config.bookkeeper.http_port if port is None else port
        self.http = HealthServer(
            self.metrics,
            port,
            liveness=self.liveness,
            readiness=self.readiness,
            host=self.config.bookkeeper.http_host,
            pages=StatusPage(self.config, self.metrics, self.status).pages(),
        ).start()
        return self.http.port

    def _stale_after_s(self) -> float:
        """How long the loop may finish no cycle and stay ready (readiness): 10 commit intervals +
        30 s, which covers the longest wait between cycles (30 s after failures)."""
        return 10 * self.config.bookkeeper.commit_interval + 30

    def _stuck_after_s(self) -> float:
        """How long the loop may show no life before it counts as stuck (liveness): at least
        `LIVENESS_GRACE_S`. A cycle shows life at each table's step, but one step can be long (a
        key index rebuilt, a backlog's footers read): a liveness probe that restarts a bookkeeper
        in the middle of such a step makes its successor start the same step over, for ever."""
        return max(LIVENESS_GRACE_S, self._stale_after_s())

    def status(self) -> dict:
        """What `/healthz` and `/readyz` both say: the loop's state and the lease as they are."""
        holds_lease = self.lease is not None and self.state != "stopped"
        details: dict = {
            "state": self.state,
            "lease": holds_lease,
            "epoch": self.committer.epoch if holds_lease else None,
            "last_cycle_age_s": (
                None if self._last_cycle_at is None else round(time.time() - self._last_cycle_at, 3)
            ),
        }
        if self.state == "standby" and self._holder is not None:
            details["holder"] = self._holder.owner
            details["holder_epoch"] = self._holder.epoch
        return details

    def liveness(self) -> tuple[bool, dict]:
        """Alive while the service loop runs and shows life: a standby polling for the lease is
        alive, and so is an active bookkeeper whose cycles fail (a catalog outage: a restart would
        not help). Not alive once the loop stopped, or when it showed no life for
        `_stuck_after_s`."""
        details = self.status()
        if self.state == "stopped":
            return False, {**details, "reason": "the service loop stopped"}
        silent_s = time.monotonic() - self._alive_at
        if silent_s > self._stuck_after_s():
            reason = f"the service loop showed no life for {silent_s:.0f}s"
            return False, {**details, "reason": reason}
        return True, details

    def readiness(self) -> tuple[bool, dict]:
        """Ready while holding the lease and cycling: a cycle finished within `_stale_after_s`."""
        details = self.status()
        if not details["lease"]:
            if self.state == "standby" and self._holder is not None:
                holder = self._holder
                reason = f"standing by: {holder.owner} holds the lease (epoch {holder.epoch})"
            else:
                reason = f"no lease held ({self.state})"
            return False, {**details, "reason": reason}
        if self._last_cycle_at is None:
            return False, {**details, "reason": "no cycle finished yet"}
        age = time.time() - self._last_cycle_at
        if age > self._stale_after_s():
            return False, {**details, "reason": f"no cycle for {age:.0f}s"}
        return True, details

    def _alive(self) -> None:
        self._alive_at = time.monotonic()

    def _standing_by(self, holder: LeaseRecord) -> None:
        """Each lease poll while another bookkeeper holds the lease."""
        self.state, self._holder = "standby", holder
        self._alive()

    def _lease_store_down(self, error: Exception) -> None:
        """Each lease poll its store did not answer: alive, as a cycle that fails is (a liveness
        probe's restart would meet the same outage), and not ready."""
        self._alive()

    def take_lease(self, timeout_s: float | None = None) -> int | None:
        """Become the group's active bookkeeper (waits while another holds the lease); returns the
        epoch, or None when stopped while waiting."""
        group = self.config.group
        lease = Lease(group.lease_uri, group.name, self.config.bookkeeper.lease_ttl, stop=self.stop)
        epoch = lease.acquire(
            timeout_s, on_wait=self._standing_by, on_outage=self._lease_store_down
        )
        self._holder = None
        if epoch is None:
            return None
        self.lease, self.state = lease, "active"
        self.committer.hold(epoch, lease.check)
        self.metrics.epoch.set(epoch)
        return epoch

    def _follow_lease(self) -> None:
        """Commit with the lease's epoch: a lease not renewed in time is taken again with the next
        one (`Lease.check`), which the commits must carry from then on."""
        assert self.lease is not None and self.lease.epoch is not None
        if self.lease.epoch != self.committer.epoch:
            self.committer.hold(self.lease.epoch, self.lease.check)
            self.metrics.epoch.set(self.lease.epoch)

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: finish the current cycle (its commit and acknowledgements), then stop; a
        standby waiting for the lease, or a bookkeeper waiting for its next cycle, stops at once,
        and so does one whose lease's store does not answer (`common/fencing.py`: `Stopped`)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self.stop.set())

    def run(
        self, once: bool = False, on_cycle: Callable[[CycleReport], None] | None = None
    ) -> None:
        """Hold the lease and run cycles until stopped; a fenced bookkeeper stops, never commits."""
        if self.http is None and self.config.bookkeeper.http_port:
            self.serve_http()
        fenced = False
        try:
            if self.lease is None and self.take_lease() is None:
                return  # stopped while standing by
            self.state = "warming"
            self._alive()
            self.warm_key_indexes()
            self.state = "active"
            while not self.stop.is_set():
                started = time.monotonic()
                self._alive()
                try:
                    report = self.run_cycle()
                except Stopped as error:
                    # Told to stop while the lease's store did not answer (a renewal, a check
                    # before a commit): nothing of this table was committed, nothing
                    # acknowledged that is not durable; the lease is left to expire.
                    log.warning(
                        "bookkeeper stopping without waiting for the lease's store",
                        extra={"reason": str(error)},
                    )
                    break
                except (Fenced, StaleEpoch) as error:
                    fenced = True
                    log.error(
                        "bookkeeper fenced: a newer bookkeeper took over; stopping",
                        extra={"reason": str(error)},
                    )
                    raise
                except Exception as error:
                    # Outside one table's commit (the transport, the catalog, the lease folder):
                    # nothing was acknowledged that is not durable, so the next cycle redoes
                    # the rest. A one-off run reports it in its exit status.
                    if once:
                        raise
                    self.metrics.errors.labels("cycle-failed").inc()
                    log.error(
                        "bookkeeper cycle failed; retrying",
                        extra={"error": repr(error), "retry_in_s": self._cycle_backoff_s()},
                    )
                    self._alive()
                    self.stop.wait(self._cycle_backoff_s())
                    self._failed_cycles += 1
                    continue
                self._failed_cycles = 0
                if on_cycle:
                    on_cycle(report)
                if once:
                    return
                self._wait_for_next_cycle(
                    started, idle=not report.tables and not report.dead_lettered
                )
        finally:
            self.state = "stopped"
            if self.lease is not None and not fenced:
                # A clean exit (--once, SIGTERM) or a crash: the next bookkeeper need not wait
                # for the TTL. A fenced one has no lease left to release.
                self.lease.release()
            self.lease = None
            self.metrics.epoch.set(0)
            if self.http is not None:
                self.http.stop()
                self.http = None
            # A fenced bookkeeper leaves the key indexes to its successor.
            self.committer.close(save_key_indexes=not fenced)

    def _cycle_backoff_s(self) -> float:
        """After failed cycles: the commit interval, doubling per failure, at most 30 s and at
        most a third of the lease's TTL (never below the interval): each cycle renews the lease
        first, so an outage elsewhere (the transport, the catalog) neither lets a standby take
        over, only to meet the same outage, nor makes this holder take a new epoch per failure."""
        settings = self.config.bookkeeper
        ceiling = min(30.0, max(settings.commit_interval, settings.lease_ttl / 3))
        return min(ceiling, settings.commit_interval * 2 ** min(self._failed_cycles, 10))

    def warm_key_indexes(self) -> None:
        """Load (catch up, or rebuild) the key index of every upsert table that exists, so that the
        first cycle's commit does not wait for it; a table that cannot be loaded now is left to the
        cycle, which reports it."""
        for spec in self.config.tables:
            if not spec.upsert or self.stop.is_set():
                continue
            self._alive()
            started = time.monotonic()
            try:
                table = load_table_or_none(self.catalog, spec.identifier)
                if table is None:
                    continue
                index = self.key_indexes.warm(table)
            except Exception as error:  # noqa: BLE001 - the first cycle loads it again and reports a failure there
                log.warning(
                    "key index not loaded at start",
                    extra={"table": spec.identifier, "error": str(error)},
                )
                continue
            log.info(
                "key index ready",
                extra={
                    "table": spec.identifier,
                    "keys": index.live_keys,
                    "seconds": round(time.monotonic() - started, 2),
                },
            )

    def run_cycle(self) -> CycleReport:
        started = time.monotonic()
        report = CycleReport()
        self._reports_failed_this_cycle = False
        if self.lease is not None:
            self.lease.renew()
            self._follow_lease()
        self._to_release = {}
        self._unacknowledged = []
        deliveries = self.transport.receive(max_count=100_000)
        readable: dict[str, list[Delivery]] = {}
        file_events: dict[str, list[Delivery]] = {}
        for delivery in deliveries:
            if delivery.ignorable:
                self.transport.acknowledge(delivery)
                continue
            if delivery.file_event is not None:
                try:
                    table = self._table_of_file(delivery.file_event.container_path)
                except Exception as error:  # noqa: BLE001 - the catalog cannot say where the file belongs now: leave the event pending
                    self.metrics.errors.labels("catalog-unavailable").inc()
                    log.error(
                        "file event left pending: the catalog cannot be read",
                        extra={"source": delivery.source, "error": repr(error)},
                    )
                    continue
                if table is None:
                    self.transport.dead_letter(
                        delivery, f"no configured table's location holds {delivery.file_event.url}"
                    )
                    report.dead_lettered.append((delivery.source, "no table for file"))
                else:
                    file_events.setdefault(table, []).append(delivery)
                continue
            if delivery.moniker is None:
                self.metrics.errors.labels("unreadable-moniker").inc()
                if delivery.attempts >= self.config.bookkeeper.max_attempts:
                    self.transport.dead_letter(delivery, delivery.error or "unreadable")
                    report.dead_lettered.append((delivery.source, delivery.error or "unreadable"))
                    log.warning(
                        "unreadable moniker dead-lettered",
                        extra={"source": delivery.source, "reason": delivery.error},
                    )
                continue
            readable.setdefault(delivery.moniker.table, []).append(delivery)
        for table, group in sorted(readable.items()):
            self._alive()
            if self.lease is not None:
                self.lease.check()
                self._follow_lease()
            try:
                result = self.committer.commit_table(table, group)
            except (StaleEpoch, Fenced, Stopped):
                raise
            except Exception as error:  # noqa: BLE001 - one table's failure must not stop the others
                self.metrics.errors.labels("commit-failed").inc()
                log.error(
                    "table commit failed; its monikers stay pending",
                    extra={"table": table, "error": repr(error)},
                )
                continue
            self._settle(report, table, result)
        for table, group in sorted(file_events.items()):
            self._alive()
            try:
                result = self.committer.commit_files(table, group)
            except StaleEpoch:
                raise
            except Exception as error:  # noqa: BLE001 - as for monikers: the events stay pending
                self.metrics.errors.labels("commit-failed").inc()
                log.error(
                    "table commit of file events failed; they stay pending",
                    extra={"table": table, "error": repr(error)},
                )
                continue
            self._settle(report, table, result)
        self._commit_rewrites(report)
        self._release_waiting()
        self._purge(report)
        self._heartbeats(
            report, committed={t.table for t in report.tables if t.snapshot_id is not None}
        )
        if (
            self._reports_for_file or self._reports_for_topic
        ) and not self._reports_failed_this_cycle:
            self._flush_reports()
        if self._unacknowledged:  # every table settled: now the cycle fails, as it did before
            raise self._unacknowledged[0]
        report.seconds = time.monotonic() - started
        self._last_cycle_at = time.time()
        self._alive()
        self.metrics.last_cycle.set(self._last_cycle_at)
        self.metrics.refresh_ages()
        return report

    def _wait_for_next_cycle(self, cycle_started: float, idle: bool) -> None:
        """Until the commit interval has passed since the cycle started; after an idle cycle, a
        moniker that arrives meanwhile starts the next cycle at once (freshness: it would
        otherwise wait half an interval on average, and nothing was committed to space out)."""
        settings = self.config.bookkeeper
        next_cycle = cycle_started + settings.commit_interval
        if not idle or settings.idle_poll_interval <= 0:
            self.stop.wait(max(0.0, next_cycle - time.monotonic()))
            return
        while not self.stop.is_set() and time.monotonic() < next_cycle:
            self.stop.wait(
                min(settings.idle_poll_interval, max(0.0, next_cycle - time.monotonic()))
            )
            try:
                if self.transport.has_pending():
                    return
            except Exception as error:  # noqa: BLE001 - the next cycle reports transport errors
                log.debug("idle poll failed", extra={"error": str(error)})
                return

    def _settle(self, report: CycleReport, table: str, result: TableCommit) -> None:
        """After a table's commit is durable (or there was nothing to commit): report, dead-letter,
        then acknowledge what the commit holds.

        The report comes first (it never raises), the acknowledgements last, and one the
        transport cannot make now (the store refusing a delete, a queue not answering) is logged
        and held until the end of the cycle (`_unacknowledged`), which then fails as a whole
        (`cycle failed; retrying`, readiness after repeated ones): the other tables still commit,
        every dead letter and report is written, and the next cycle finds those monikers
        committed and acknowledges them as duplicates. Raised from here at once, it skipped the
        dead letters and the commit's report, and an older writer's refused moniker (committed
        state past its seq) was then acknowledged as a duplicate without its dead letter."""
        if result.snapshot_id is not None:
            self.metrics.observe_commit(table, result.seconds, result.records, result.watermark_ms)
            self._write_report(result)
        for delivery, reason in result.quarantined:
            self.metrics.errors.labels("quarantined").inc()
            self.transport.dead_letter(delivery, reason)
            report.dead_lettered.append((delivery.source, reason))
            log.warning(
                "delivery quarantined",
                extra={"table": table, "source": delivery.source, "reason": reason},
            )
        reread: list[Delivery] = []
        for delivery, reason in result.refused:
            self.metrics.errors.labels("overlapping-offsets").inc()
            report.refused.append((delivery.source, reason))
            if not delivery.moniker.rereads_refused:
                # An earlier version's writer does not read the refusal back: set aside as before.
                self.transport.dead_letter(delivery, reason)
                report.dead_lettered.append((delivery.source, reason))
                log.error(
                    "moniker refused: its offsets overlap the committed ones",
                    extra={"table": table, "source": delivery.source, "reason": reason},
                )
                continue
            # The refusal is in the table's committed state (durable before this): its writer
            # reads the refused offsets again, so the moniker itself is not needed any more.
            reread.append(delivery)
            log.warning(
                "moniker refused: its offsets overlap the committed ones; its writer reads them "
                "again",
                extra={"table": table, "source": delivery.source, "reason": reason},
            )
        for delivery, reason in result.unavailable:
            self.metrics.errors.labels("file-unavailable").inc()
            log.warning(
                "moniker left pending: storage cannot serve a file now; retried next cycle",
                extra={"table": table, "source": delivery.source, "reason": reason},
            )
        if waiting := self._next_in_line(result):
            self._to_release.setdefault(table, []).extend(waiting)
        report.pending += len(result.waiting)
        report.tables.append(result)
        self.metrics.pending_monikers.labels(table).set(len(result.waiting))
        self.metrics.pending_bytes.labels(table).set(sum(d.moniker.bytes for d in result.waiting))
        try:
            self.transport.acknowledge_all(result.committed + result.duplicates + reread)
            for delivery in result.copies:
                # Another delivery of the same moniker may still wait: drop this one only.
                self.transport.acknowledge_copy(delivery)
        except Exception as error:  # noqa: BLE001 - durable already: raised once the cycle is done
            self.metrics.errors.labels("acknowledge-failed").inc()
            log.error(
                "acknowledgement failed; the next cycle finds these monikers committed and "
                "acknowledges them as duplicates",
                extra={"table": table, "error": repr(error)},
            )
            self._unacknowledged.append(error)

    def _release_waiting(self) -> None:
        """Make the cycle's waiting monikers visible again (`_next_in_line`), at most
        `RELEASED_PER_CYCLE` for the whole cycle (one queue call each), shared between the tables:
        each table's next one first, then each one's second, ...; the tables released longest ago
        go first. A table left out is hidden for the visibility timeout, then received again, and
        is then first in line: without that, the tables released last cycle (the only ones the
        next receive sees) would take every release, cycle after cycle."""
        lines, self._to_release = self._to_release, {}
        if not lines:
            return
        self._release_cycles += 1
        tables = sorted(lines, key=lambda table: (self._released_in.get(table, 0), table))
        in_turn = [
            lines[table][position]
            for position in range(max(map(len, lines.values())))
            for table in tables
            if position < len(lines[table])
        ][:RELEASED_PER_CYCLE]
        for delivery in in_turn:
            self._released_in[delivery.moniker.table] = self._release_cycles
        try:
            self.transport.release(in_turn)
        except Exception as error:  # noqa: BLE001 - releasing only hurries them: they come back with the visibility timeout
            self.metrics.errors.labels("release-failed").inc()
            log.warning(
                "waiting monikers not made visible again; they come back with the queue's "
                "visibility timeout",
                extra={"tables": sorted(lines), "error": repr(error)},
            )

    def _next_in_line(self, result: TableCommit) -> list[Delivery]:
        """A table's waiting monikers to receive again next cycle, in each writer's seq order (a
        queue would hide each for its visibility timeout, so a backlog over the commit budget
        committed one budget per timeout and fell behind for good); `_release_waiting` takes at
        most `RELEASED_PER_CYCLE` of all tables'. Writers held by a file storage could not serve
        are left out (the timeout is their backoff)."""
        held = {d.moniker.writer_id for d, _ in result.unavailable if d.moniker is not None}
        chains: dict[str, list[Delivery]] = {}
        for delivery in result.waiting:
            if delivery.moniker and delivery.moniker.writer_id not in held:
                chains.setdefault(delivery.moniker.writer_id, []).append(delivery)
        for chain in chains.values():
            chain.sort(key=lambda d: d.moniker.seq)
        # Each writer's next moniker first, then each one's second, ...: no writer's backlog takes
        # every release of a cycle.
        in_turn = [
            chain[position]
            for position in range(max(map(len, chains.values()), default=0))
            for _, chain in sorted(chains.items())
            if position < len(chain)
        ]
        return in_turn[:RELEASED_PER_CYCLE]

    def _table_of_file(self, file_key: str) -> str | None:
        """The configured (existing) table whose location holds the file. Locations are loaded
        once per table (they never move), not once per event."""
        for spec in self.config.tables:
            location = self._table_locations.get(spec.identifier)
            if location is None:
                try:
                    location = self._table_locations[spec.identifier] = location_key(
                        self.catalog.load_table(spec.identifier).location()
                    )
                except NoSuchTableError:
                    continue
            if file_key.startswith(location + "/"):
                return spec.identifier
        return None

    def _commit_rewrites(self, report: CycleReport) -> None:
        """Every `rewrite_poll_interval`, the compactions the reaper left for the upsert tables."""
        if (
            time.monotonic() - self._rewrites_polled_at
            < self.config.bookkeeper.rewrite_poll_interval
        ):
            return
        self._rewrites_polled_at = time.monotonic()
        for spec in self.config.tables:
            if not spec.upsert:
                continue
            self._alive()
            try:
                polled = self.rewrites.commit_pending(spec.identifier)
            except StaleEpoch:
                raise
            except Exception as error:  # noqa: BLE001 - a rewrite is maintenance: it waits for the next poll
                self.metrics.errors.labels("rewrite-failed").inc()
                log.error(
                    "rewrite commit failed; it stays pending",
                    extra={"table": spec.identifier, "error": repr(error)},
                )
                continue
            # Each request on its own (`RewriteCommitter.commit_pending` logged each one).
            self.metrics.errors.labels("rewrite-failed").inc(len(polled.failed))
            self.metrics.errors.labels("rewrite-set-aside").inc(len(polled.set_aside))
            for result in polled.committed:
                if result.snapshot_id is not None:
                    self._settle(report, spec.identifier, result)

    def _purge(self, report: CycleReport) -> None:
        """Purge the mostly-deleted data files of the upsert tables this cycle committed to (and
        of those an earlier purge left work for). The cycle's commits are durable and acknowledged
        already: a purge that fails is logged and counted, and tried again next cycle."""
        if self.config.bookkeeper.purge_deleted_share <= 0:
            return
        committed = {
            result.table
            for result in report.tables
            if result.snapshot_id is not None and self.config.table(result.table).upsert
        }
        for identifier in sorted(committed | self._purges_due):
            self._alive()
            if self.lease is not None:
                self.lease.check()
                self._follow_lease()
            self._purges_due.discard(identifier)
            try:
                outcome = self.purger.purge(identifier)
            except StaleEpoch:
                raise
            except Exception as error:  # noqa: BLE001 - maintenance: the data is committed, the purge waits
                self._purges_due.add(identifier)
                self.metrics.errors.labels("purge-failed").inc()
                log.warning(
                    "purge failed; tried again next cycle",
                    extra={"table": identifier, "error": repr(error)},
                )
                continue
            self.metrics.purge_seconds.labels(identifier).inc(outcome.seconds)
            if outcome.set_aside is not None:
                self.metrics.errors.labels("rewrite-set-aside").inc()
            elif outcome.refused is not None:
                self.metrics.errors.labels("purge-refused").inc()
            elif outcome.snapshot_id is not None:
                self.metrics.purged_files.labels(identifier).inc(outcome.files_replaced)
                self.metrics.purged_rows.labels(identifier).inc(outcome.rows_dropped)
            report.purges[identifier] = outcome
            if outcome.deferred:
                self._purges_due.add(identifier)

    def _heartbeats(self, report: CycleReport, committed: set[str]) -> None:
        """Every N empty cycles, a watermark-only snapshot per table (off when N is 0)."""
        every = self.config.bookkeeper.heartbeat_every_empty_cycles
        if not every:
            return
        for spec in self.config.tables:
            identifier = spec.identifier
            count = 0 if identifier in committed else self._empty_cycles.get(identifier, 0) + 1
            if count >= every:
                count = 0
                try:
                    result = self.committer.heartbeat(identifier)
                except NoSuchTableError:
                    continue
                except StaleEpoch:
                    raise
                except Exception as error:  # noqa: BLE001 - a heartbeat carries no data: try again next cycle
                    self.metrics.errors.labels("heartbeat-failed").inc()
                    log.error(
                        "heartbeat failed; retried next cycle",
                        extra={"table": identifier, "error": repr(error)},
                    )
                    self._empty_cycles[identifier] = every - 1
                    continue
                report.tables.append(result)
                self._write_report(result)
            self._empty_cycles[identifier] = count

    def _write_report(self, result: TableCommit) -> None:
        """One JSON line per snapshot, for schedulers that wait on a watermark (seed 004)."""
        line = {
            "table": result.table,
            "snapshot_id": result.snapshot_id,
            "files": result.files,
            "records": result.records,
            "bytes": result.bytes,
            "watermark_ms": result.watermark_ms,
            "latency_ms": round(result.seconds * 1000, 1),
            "monikers": len(result.committed),
            "quarantined": len(result.quarantined),
            "schema_changes": result.schema_changes,
            "committed_at_ms": int(time.time() * 1000),
        }
        self._reports_for_file.append(line)
        if self.config.bookkeeper.commit_report_topic:
            self._reports_for_topic.append(line)
        if not self._reports_failed_this_cycle:  # else the next cycle tries again, once
            self._flush_reports()

    def _flush_reports(self) -> None:
        """Write the report lines not yet written, in order, to the file and the topic.

        The snapshots they describe are durable already: a report that cannot be written (a full
        disk, the report topic unreachable) is logged, counted and tried again with the next
        report or cycle; it never fails the cycle. Lines past `UNWRITTEN_REPORTS_KEPT` are dropped
        (oldest first) and counted."""
        for pending in (self._reports_for_file, self._reports_for_topic):
            if len(pending) > UNWRITTEN_REPORTS_KEPT:
                dropped = len(pending) - UNWRITTEN_REPORTS_KEPT
                del pending[:dropped]
                self.metrics.errors.labels("commit-report-dropped").inc(dropped)
        try:
            if self._reports_for_file:
                append_lines(self._report_path, self._reports_for_file)
                self._reports_for_file.clear()
            if self._reports_for_topic:
                self._send_reports(self._reports_for_topic)
        except Exception as error:  # noqa: BLE001 - the commits are durable; only their reports wait
            self._reports_failed_this_cycle = True
            self.metrics.errors.labels("commit-report-failed").inc()
            log.error(
                "commit report not written; retried with the next one",
                extra={
                    "path": str(self._report_path),
                    "waiting": max(len(self._reports_for_file), len(self._reports_for_topic)),
                    "error": repr(error),
                },
            )

    def _send_reports(self, lines: list[dict]) -> None:
        topic = self.config.bookkeeper.commit_report_topic
        if self._report_producer is None:
            from confluent_kafka import Producer

            from icekeeper.common.kafka_clients import librdkafka_config

            self._report_producer = Producer(
                librdkafka_config(self.config.sources[0], {"linger.ms": 0}),
                logger=logging.getLogger("librdkafka"),
            )
        # a line the producer took is librdkafka's to deliver (it retries for `message.timeout.ms`)
        while lines:
            self._report_producer.produce(
                topic, key=lines[0]["table"].encode(), value=json.dumps(lines[0]).encode()
            )
            del lines[0]
        if undelivered := self._report_producer.flush(10):
            log.warning(
                "commit reports not yet delivered to their topic",
                extra={"topic": topic, "undelivered": undelivered},
            )


RELEASED_PER_CYCLE = 500
"""Waiting monikers a cycle makes visible again at most, all tables together (one call each on a
queue); the rest come back with the transport's visibility timeout."""

LIVENESS_GRACE_S = 600.0
"""The shortest time a bookkeeper may show no life before `/healthz` calls it stuck."""

UNWRITTEN_REPORTS_KEPT = 100_000
"""Commit report lines kept while they cannot be written
(some 30 MB); older ones are dropped and counted."""

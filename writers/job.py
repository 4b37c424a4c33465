"""The writer job: Kafka batch -> decode -> flatten -> route -> Parquet -> moniker, in a loop.

A writer never commits to Iceberg. Each batch reads explicit offset ranges (planned from what
tables committed plus this writer's pending monikers), writes each table's rows as Parquet files
under that table's location, and publishes one moniker per table that got rows, after the files
are durable. Then it sends dead letters, commits the consumer group's offsets (so lag shows in
Kafka tools, as in seed 000), and notes its progress.

This module is the loop and the order of the steps; each step lives in a module of its own:
progress (`progress.py`, `checkpoints.py`), planning (`kafka_admin.py` bounds, `offsets.py`),
the batch's tables and dead letters (`source_batch.py`, through the configured engine), the
monikers of tables that got no row (`table_batch.py`), publishing (the transport). What the
loop did is counted for Prometheus (`observability.py`) and served, with its health, on
`writer.http_port` while the writer runs continuously.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from icekeeper.common.catalog import open_catalog
from icekeeper.common.config.model import IcekeeperConfig, KafkaSource
from icekeeper.common.config.required import check_writer_config
from icekeeper.common.executor_env import ExecutorsLackPython
from icekeeper.common.exit_codes import UsageError
from icekeeper.common.http_endpoints import HttpEndpoints
from icekeeper.common.in_flight import InFlightClaims
from icekeeper.common.kafka_clients import KafkaAccessDenied
from icekeeper.common.source_formats import source_format
from icekeeper.common.spark import spark_session
from icekeeper.common.storage import sync_written
from icekeeper.common.transports import open_transport
from icekeeper.writers.checkpoints import SourceCheckpoints
from icekeeper.writers.kafka_admin import SourceAdmin
from icekeeper.writers.observability import WriterMetrics, kafka_read_error
from icekeeper.writers.offsets import (
    BatchPlan,
    PartitionBounds,
    TopicReset,
    plan_batch,
    topic_reset_message,
)
from icekeeper.writers.offsets import (
    TopicPartition as TP,
)
from icekeeper.writers.progress import TableProgress, next_seq, refresh_progress, table_positions
from icekeeper.writers.registry import RegistryUnavailable, TopicSchemas
from icekeeper.writers.routing import Routes, routes_for
from icekeeper.writers.source_batch import BatchIncomplete, BatchOutcome, SourceBatchWriter
from icekeeper.writers.table_batch import offset_only_monikers

log = logging.getLogger(__name__)
_MAX_PAUSE_S = 60.0
"""Longest wait between two tries of a paused writer (the schema registry does not answer)."""
_MAX_RETRY_WAIT_S = 30.0
"""Longest wait before a failed batch is tried again."""
LIVENESS_GRACE_S = 600.0
"""The shortest time a writer's loop may show no life before `/healthz` calls it stuck: one batch
of a large backlog can take minutes, and a probe that restarted the writer in it would make it
read the same batch again, for ever (as the bookkeeper's `LIVENESS_GRACE_S`)."""
SLOWEST_RECORDS_PER_S = 2_000.0
"""The slowest a healthy writer is taken to write, in records a second (`bench/results.md`
measures 50,000-138,000 per core; rows far wider than the bench's, or a starved cluster, are
slower): while a batch runs, `/healthz` waits as long as its planned records take at this rate,
so a first batch over a large backlog (`max_offsets_per_trigger: null`) is not restarted half
way, and read again, for ever."""


@dataclass
class BatchReport:
    """Figures of one batch."""

    seq: int
    records_read: int = 0
    rows_written: int = 0
    dead_lettered: int = 0
    tombstones_skipped: int = 0
    files: int = 0
    monikers: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    throttled: bool = False
    lost_to_retention: int = 0
    """Records Kafka's retention deleted before this writer read them (they are in no table)."""
    paused: str | None = None
    """Why the writer paused instead of writing (the
    schema registry cannot answer); None when it ran."""

    def add(self, source: KafkaSource, outcome: BatchOutcome) -> None:
        """Count what one source's batch wrote."""
        self.rows_written += outcome.rows
        self.files += sum(len(m.files) for m in outcome.monikers)
        self.monikers += len(outcome.monikers)
        self.dead_lettered += outcome.dead_lettered(source)
        self.tombstones_skipped += outcome.skipped_tombstones(source)
        for kind, count in outcome.errors.items():
            self.errors[kind] = self.errors.get(kind, 0) + count


class WriterJob:
    """One writer (stable `writer_id`) over every source and table of a config."""

    def __init__(
        self,
        config: IcekeeperConfig,
        spark: SparkSession | None = None,
        writer_id: str | None = None,
    ) -> None:
        check_writer_config(config)
        self.config = config
        self.writer_id = writer_id or config.writer.writer_id
        self.catalog = open_catalog(config)
        self.transport = open_transport(config)
        self.checkpoints = SourceCheckpoints(config.writer.checkpoint_uri, self.writer_id)
        self.spark = spark or spark_session(
            config,
            f"{config.writer.app_name}-{self.writer_id}",
            # Only the arrow engine imports icekeeper in executors (`spark-sql` runs no Python
            # there but a JSON source's schema inference, which needs a bare Python).
            python_tasks=config.writer.engine == "arrow",
        )
        self.schemas = {source.name: TopicSchemas(source) for source in config.sources}
        self.tables: dict[str, TableProgress] = {}
        self.templated: dict[str, str] = self.checkpoints.templated_tables()
        """Tables a `table_template` named that this writer published to: identifier -> source."""
        self.seq: int | None = None
        self.pending_bytes = 0
        self.stop = threading.Event()
        self.admins = {source.name: SourceAdmin(source) for source in config.sources}
        # A quarter of the reaper's grace: three missed rewrites still leave the claim live.
        heartbeat_s = max(0.5, min(30.0, config.group.orphan_grace / 4))
        self.claims = InFlightClaims(self.writer_id, heartbeat_s)
        self.batches = SourceBatchWriter(
            config, self.spark, self.catalog, self.writer_id, self.claims, self.tables, self.schemas
        )
        self.metrics = WriterMetrics()
        self._table_topics = {
            spec.identifier: set(spec.topics) for spec in config.tables if spec.topics
        }
        """The topics each table is routed from, where its config names them (lag series)."""
        self.metrics.show_sources([source.name for source in config.sources])
        self.http: HttpEndpoints | None = None
        self.state = "starting"
        """What the loop does: starting, writing (a batch), waiting (for the next), paused (the
        schema registry does not answer), stopped. `/healthz` and `/readyz` report it."""
        self._alive_at = time.monotonic()
        """When the loop last showed life (a batch's start or end, each source's batch)."""
        self._last_outcome: str | None = None
        """How the loop's last batch ended (`observability.BATCH_OUTCOMES`); None: none yet."""
        self._last_outcome_at: float | None = None
        self._planned_records = 0
        """Records the running source batch planned to read (the `/healthz` grace grows with it)."""
        self._seen_topics: dict[str, set[str]] = {}
        """Per source, the topics Kafka described to this writer at some look since it started."""
        self._lost_topics: dict[str, dict[str, str]] = {}
        """Per source, topics seen earlier that Kafka no longer lists or describes: topic -> why."""
        self._absent_warned: set[tuple[str, str]] = set()
        """(source, topic) named in the config, never seen, and already warned about."""
        self._throttled_look_failed_at: dict[str, float] = {}
        """Per source, when a throttled writer last logged that it could not look at Kafka."""
        self._unsaved_checkpoints: dict[str, BatchPlan] = {}
        """Per source, the published batch whose checkpoint could not be written yet: the next
        batch writes it before planning (`_write_unsaved_checkpoint`)."""

    # -- metrics and health ------------------------------------------------------------------------

    def serve_http(self, port: int | None = None) -> int:
        """Start `/metrics`, `/healthz` (liveness) and `/readyz` (readiness); returns the port (0
        in config: off, unless a port is given)."""
        port = self.config.writer.http_port if port is None else port
        host = self.config.writer.http_host
        try:
            self.http = HttpEndpoints(
                self.metrics.registry,
                port,
                liveness=self.liveness,
                readiness=self.readiness,
                host=host,
                name="icekeeper-writer-http",
            ).start()
        except OSError as error:
            # Before anything is read or written: a second writer on the host, or one restarted
            # while the last is still stopping (its supervisor's retry gets the port once free).
            raise UsageError(
                f"writer.http_port {port} on {host} is taken ({error}): writers sharing a host "
                "need a port each (ICEKEEPER__WRITER__HTTP_PORT; 0 serves none)"
            ) from error
        return self.http.port

    def _stuck_after_s(self) -> float:
        """How long the loop may show no life and stay alive: at least `LIVENESS_GRACE_S`, ten
        trigger intervals plus the longest wait after a failure if longer, and, while a
        batch runs, the time its planned records take at `SLOWEST_RECORDS_PER_S` if longer."""
        return max(
            LIVENESS_GRACE_S,
            10 * self.config.writer.trigger_interval + _MAX_RETRY_WAIT_S,
            self._planned_records / SLOWEST_RECORDS_PER_S,
        )

    def _health(self) -> dict:
        return {
            "state": self.state,
            "writer": self.writer_id,
            "last_batch": self._last_outcome,
            "last_batch_age_s": None
            if self._last_outcome_at is None
            else round(time.monotonic() - self._last_outcome_at, 3),
            "seq": self.seq,
            "planned_records": self._planned_records,
        }

    def liveness(self) -> tuple[bool, dict]:
        """Alive while the loop runs and shows life: a writer paused by a registry outage, or
        whose batches fail and are retried, is alive (a restart would not help). Not alive once
        the loop stopped, or when it showed no life for `_stuck_after_s`."""
        details = self._health()
        if self.state == "stopped":
            return False, {**details, "reason": "the writer's loop stopped"}
        silent_s = time.monotonic() - self._alive_at
        if silent_s > self._stuck_after_s():
            return False, {**details, "reason": f"the loop showed no life for {silent_s:.0f}s"}
        return True, details

    def readiness(self) -> tuple[bool, dict]:
        """Ready while alive and its last batch ended well: written, idle, or throttled by the
        bookkeeper's backlog (not paused by the registry, not failed)."""
        alive, details = self.liveness()
        if not alive:
            return False, details
        if self._last_outcome is None:
            return False, {**details, "reason": "no batch finished yet"}
        if self._last_outcome in ("paused", "failed"):
            return False, {**details, "reason": f"the last batch {self._last_outcome}"}
        if lost := {source: topics for source, topics in self._lost_topics.items() if topics}:
            named = "; ".join(
                f"{source}: {topic} ({why})"
                for source, topics in sorted(lost.items())
                for topic, why in sorted(topics.items())
            )
            return False, {**details, "reason": f"topics no longer readable: {named}"}
        return True, details

    def _alive(self) -> None:
        self._alive_at = time.monotonic()

    def _batch_ended(self, outcome: str) -> None:
        self._last_outcome = outcome
        self._last_outcome_at = time.monotonic()
        self._alive()
        if outcome != "written":  # counted with its figures (`observe_batch`)
            self.metrics.batches.labels(outcome).inc()

    # -- the loop ----------------------------------------------------------------------------------

    def run(
        self,
        max_batches: int | None = None,
        until_idle: bool = False,
        on_batch: Callable[[BatchReport], None] | None = None,
    ) -> list[BatchReport]:
        """Run batches every trigger interval until stopped
        (SIGTERM/SIGINT), `max_batches`, or idle.

        Running continuously (neither `max_batches` nor `until_idle`), the writer serves its
        metrics and health on `writer.http_port`; a one-off run serves none."""
        continuous = max_batches is None and not until_idle
        if continuous and self.http is None and self.config.writer.http_port:
            self.serve_http()
        try:
            return self._loop(max_batches, until_idle, on_batch)
        finally:
            self.state = "stopped"
            if self.http is not None:
                self.http.stop()
                self.http = None

    def _loop(
        self,
        max_batches: int | None,
        until_idle: bool,
        on_batch: Callable[[BatchReport], None] | None,
    ) -> list[BatchReport]:
        self._resend_journal()
        reports = []
        failures = 0
        pauses = 0
        while not self.stop.is_set():
            started = time.monotonic()
            self.state = "writing"
            self._alive()
            try:
                report = self.run_batch()
                failures = pauses = 0
            except RegistryUnavailable as outage:
                self._batch_ended("paused")
                self.state = "paused"
                # Not poison and not a crash: wait for the registry
                # as long as it takes, alerting each time.
                pauses += 1
                wait_s = min(_MAX_PAUSE_S, 2.0**pauses)
                log.error(
                    "schema registry unavailable; writer paused: nothing is published or "
                    "dead-lettered until it answers",
                    extra={
                        "writer": self.writer_id,
                        "reason": str(outage),
                        "pauses": pauses,
                        "retry_in_s": wait_s,
                    },
                )
                if on_batch:
                    on_batch(BatchReport(seq=self.seq or 0, paused=str(outage)))
                self.stop.wait(wait_s)
                continue
            except (TopicReset, KafkaAccessDenied, ExecutorsLackPython):
                self._batch_ended("failed")
                raise  # retrying cannot help: the operator decides (docs/operations.md)
            except Exception as error:
                self._batch_ended("failed")
                failures += 1
                if failures >= 5:
                    raise
                log.error(
                    "batch failed; nothing was published, retrying",
                    extra={"writer": self.writer_id, "error": repr(error), "failures": failures},
                )
                self.state = "waiting"
                self.stop.wait(min(_MAX_RETRY_WAIT_S, 2.0**failures))
                continue
            if report.records_read:
                self.metrics.observe_batch(report.records_read, report.seconds)
            self._batch_ended(
                "throttled" if report.throttled else "written" if report.records_read else "idle"
            )
            if report.records_read:
                reports.append(report)
                if on_batch:
                    on_batch(report)
            if max_batches is not None and len(reports) >= max_batches:
                break
            if until_idle and not report.records_read and not report.throttled:
                break
            self.state = "waiting"
            self.stop.wait(
                max(0.0, self.config.writer.trigger_interval - (time.monotonic() - started))
            )
        return reports

    def _resend_journal(self) -> None:
        """Send again what a transport that publishes in two steps (the Azure queue: journal copy,
        then message) may hold from a writer killed between them (`MonikerTransport.resume`)."""
        resent = self.transport.resume(self.writer_id)
        if resent:
            log.info(
                "pending monikers sent again from the journal",
                extra={"writer": self.writer_id, "monikers": resent},
            )

    def install_signal_handlers(self) -> None:
        """Finish the current batch on SIGTERM/SIGINT,
        then stop (files and monikers stay consistent)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self.stop.set())

    def run_batch(self) -> BatchReport:
        """Plan, read, write and publish one batch over every source."""
        started = time.monotonic()
        pending = self.transport.pending(writer_id=None)
        self.pending_bytes = refresh_progress(
            self.tables,
            pending,
            self.catalog,
            [spec.identifier for spec in self.config.tables] + sorted(self.templated),
            self.writer_id,
        )
        self.metrics.pending_bytes.set(self.pending_bytes)
        seq = next_seq(self.tables, self.seq)
        report = BatchReport(seq=seq)
        if self.pending_bytes > self.config.writer.max_pending_bytes:
            # Backpressure: the bookkeeper is behind; reading more would only pile up files.
            log.warning(
                "pending monikers over writer.max_pending_bytes; waiting",
                extra={"pending_bytes": self.pending_bytes},
            )
            report.throttled = True
            for source in self.config.sources:
                self._show_lag_while_throttled(source)
            return report
        try:
            for source in self.config.sources:
                self._run_source_batch(source, seq, report)
        finally:
            self._planned_records = 0
            # Published, discarded or failed: either way these folders are no longer being filled.
            self.claims.release(self.claims.held())
        report.seconds = time.monotonic() - started
        if report.records_read:
            self.seq = seq
            log.info("batch written", extra={"writer": self.writer_id, **report.__dict__})
        return report

    # -- one source --------------------------------------------------------------------------------

    def _run_source_batch(self, source: KafkaSource, seq: int, report: BatchReport) -> None:
        """Plan, read, decode, route, flatten and write one source's batch; publish its monikers."""
        admin = self.admins[source.name]
        self._alive()
        self._write_unsaved_checkpoint(source)
        bounds = self._bounds(source)
        if not bounds:
            self.metrics.show_lag(source.name, {}, {})  # its topics' last figures go
            return
        routes = routes_for(source, self.config.tables)
        table_ids = self._source_tables(source, routes)
        self._rewind_for_refusals(source, table_ids)
        plan = self._plan(source, table_ids, bounds)
        self._planned_records = plan.records  # this source's batch: `_alive` was just shown
        end_offsets = {key: bound.latest for key, bound in bounds.items()}
        self.metrics.show_lag(
            source.name, end_offsets, _real_tables(plan.table_starts), self._table_topics
        )
        if plan.restarted:
            # Before anything is published: a writer killed later starts the partitions over again.
            self.checkpoints.forget(source, set().union(*plan.restarted.values()))
        if not plan.read_ranges:
            return
        report.records_read += plan.records
        schemas = (
            self.schemas[source.name].for_topics(topic for topic, _ in plan.read_ranges)
            if source_format(source.format).registry
            else []
        )
        try:
            outcome = self.batches.write(source, plan, seq, schemas, routes)
        except Exception as error:
            if isinstance(error, BatchIncomplete) or kafka_read_error(error):
                self.metrics.kafka_read_errors.labels(source.name, "records").inc()
            raise
        outcome.monikers += offset_only_monikers(
            self.catalog, self.writer_id, plan, seq, outcome.monikers, self.tables
        )
        configured = {spec.identifier for spec in self.config.tables}
        new_templated = {
            moniker.table: source.name
            for moniker in outcome.monikers
            if moniker.table not in configured and moniker.table not in self.templated
        }
        # Durable before the monikers naming them (`sync_written`: on a local or mounted folder an
        # unsynced file can come back empty after a power cut, its moniker quarantined).
        sync_written(
            entry.path
            for moniker in outcome.monikers
            for entry in (*moniker.files, *moniker.delete_files)
        )
        if new_templated:
            # Durable before the first moniker: a restarted writer must find these tables' seqs.
            self.checkpoints.remember_templated_tables(new_templated)
            self.templated.update(new_templated)
        for moniker in outcome.monikers:
            self.transport.publish(moniker)
            self.tables.setdefault(moniker.table, TableProgress()).published(moniker)
        # Counted as soon as published: a batch failing after this point (its checkpoint write)
        # is not read again: its retry plans from the published monikers, and from this
        # checkpoint, written first (`_write_unsaved_checkpoint`), for tables it gave no rows.
        self._count(source, plan, outcome, end_offsets)
        report.add(source, outcome)
        report.lost_to_retention += sum(plan.lost_to_retention.values())
        admin.commit_group_offsets(plan)
        self._unsaved_checkpoints[source.name] = plan
        self.checkpoints.advance(source, plan)
        del self._unsaved_checkpoints[source.name]

    def _write_unsaved_checkpoint(self, source: KafkaSource) -> None:
        """Finish the step a failed batch did not: the checkpoint of its published batch. Planned
        without it, the retry read that batch again for every table it gave no rows (their
        position is the checkpoint's): its dead letters sent twice, its records counted twice. A
        writer killed meanwhile reads it again (dead letters are sent at least once)."""
        plan = self._unsaved_checkpoints.get(source.name)
        if plan is not None:
            self.checkpoints.advance(source, plan)
            del self._unsaved_checkpoints[source.name]

    def _bounds(self, source: KafkaSource) -> dict[TP, PartitionBounds]:
        """Kafka's bounds of the partitions this writer reads of `source`, counting a failed look
        as a failed read, and a topic seen before that Kafka no longer lists or describes."""
        admin = self.admins[source.name]
        try:
            bounds = admin.bounds(
                self.config.writer.instance_index, self.config.writer.instance_count
            )
        except Exception:
            self.metrics.kafka_read_errors.labels(source.name, "offsets").inc()
            raise
        self._note_topics(source, admin.readable_topics, admin.unreadable_topics)
        return bounds

    def _note_topics(
        self, source: KafkaSource, readable: set[str], unreadable: dict[str, str]
    ) -> None:
        """Tell a topic that vanished (deleted, or its ACL lost: Kafka lists neither) from one not
        created yet (Debezium creates a table's topic with its first change). A topic seen since
        the writer started and gone now counts as a failed read from Kafka each batch and makes
        the writer unready until it is back; a named topic never seen is a warning, once."""
        seen = self._seen_topics.setdefault(source.name, set())
        lost = {topic: why for topic, why in unreadable.items() if topic in seen}
        for topic in sorted(seen - readable - lost.keys()):
            if source.topic_pattern:
                # Topics come and go under a pattern: one no longer listed leaves the source.
                log.info(
                    "a topic the pattern matched is no longer listed by Kafka; no longer read",
                    extra={"source": source.name, "topic": topic},
                )
                seen.discard(topic)
                continue
            lost[topic] = "no longer listed by Kafka (deleted, or no longer visible to this writer)"
        for topic in sorted(unreadable.keys() - seen):
            if (source.name, topic) not in self._absent_warned:
                self._absent_warned.add((source.name, topic))
                log.warning(
                    "a configured topic cannot be read yet; nothing is read from it until Kafka "
                    "lists it",
                    extra={"source": source.name, "topic": topic, "why": unreadable[topic]},
                )
        seen |= readable
        if lost:
            self.metrics.kafka_read_errors.labels(source.name, "offsets").inc()
            if lost != self._lost_topics.get(source.name):
                log.error(
                    "topics this writer read are no longer readable: their partitions are not "
                    "read and their lag is not shown until they are back",
                    extra={"writer": self.writer_id, "source": source.name, "topics": lost},
                )
        elif self._lost_topics.get(source.name):
            log.info(
                "topics readable again",
                extra={"source": source.name, "topics": sorted(self._lost_topics[source.name])},
            )
        self._lost_topics[source.name] = lost

    def _show_lag_while_throttled(self, source: KafkaSource) -> None:
        """Lag as the next batch would plan it, without reading: a bookkeeper behind (or down)
        throttles the writer, and its lag must then grow with Kafka's backlog, not stay frozen."""
        self._alive()
        table_ids = self._source_tables(source, routes_for(source, self.config.tables))
        try:
            bounds = self._bounds(source)
            plan = self._next_plan(source, table_ids, bounds)  # reads the checkpoint
        except KafkaAccessDenied:
            raise  # refused credentials stop the writer in every state (docs/operations.md)
        except Exception as error:  # noqa: BLE001 - a throttled batch reads nothing: lag waits
            # Counted (`_bounds`); logged once a minute at most: the trigger may be a second.
            if time.monotonic() - self._throttled_look_failed_at.get(source.name, -60.0) >= 60:
                self._throttled_look_failed_at[source.name] = time.monotonic()
                log.warning(
                    "cannot look at Kafka's end offsets while throttled; lag shows the last look",
                    extra={"source": source.name, "error": repr(error)},
                )
            return
        self.metrics.show_lag(
            source.name,
            {key: bound.latest for key, bound in bounds.items()},
            _real_tables(plan.table_starts),
            self._table_topics,
        )

    def _count(
        self,
        source: KafkaSource,
        plan: BatchPlan,
        outcome: BatchOutcome,
        end_offsets: dict[TP, int],
    ) -> None:
        """Count what a source's published batch did, and the lag it leaves its tables."""
        metrics = self.metrics
        metrics.records_read.labels(source.name).inc(plan.records)
        for moniker in outcome.monikers:
            metrics.records_written.labels(moniker.table).inc(moniker.records)
            metrics.written_bytes.labels(moniker.table).inc(moniker.bytes)
            metrics.monikers.labels(moniker.table).inc()
        for reason, count in outcome.errors.items():
            metrics.dead_letters.labels(source.name, reason).inc(count)
        if skipped := outcome.skipped_tombstones(source):
            metrics.tombstones_skipped.labels(source.name).inc(skipped)
        if lost := sum(plan.lost_to_retention.values()):
            metrics.lost_to_retention.labels(source.name).inc(lost)
        if outcome.fallback is not None:
            metrics.engine_fallbacks.labels(source.name, outcome.fallback).inc()
        after = {
            table: {
                key: max(start, plan.read_ranges[key][1]) if key in plan.read_ranges else start
                for key, start in starts.items()
            }
            for table, starts in _real_tables(plan.table_starts).items()
        }
        metrics.show_lag(source.name, end_offsets, after, self._table_topics)

    def _source_tables(self, source: KafkaSource, routes: Routes) -> list[str]:
        """The tables `source` feeds that this writer knows: its configured ones, and those its
        `table_template` named (`templated`; with a single templated source, also unconfigured
        tables known only from pending monikers of an earlier version)."""
        tables = [spec.identifier for spec in routes.tables]
        if not source.table_template:
            return tables
        tables += sorted(t for t, named_by in self.templated.items() if named_by == source.name)
        if [s.name for s in self.config.sources if s.table_template] == [source.name]:
            configured = {spec.identifier for spec in self.config.tables}
            tables += sorted(set(self.tables) - configured - set(tables))
        return tables

    def _rewind_for_refusals(self, source: KafkaSource, table_ids: list[str]) -> None:
        """Before planning: move the source's checkpoint back to where tables read again what they
        refused of this writer (`TableProgress.rereading`). Durable, so a batch capped below the
        old checkpoint, or a writer restarted before its next moniker, still reads the rest."""
        rewind: dict[TP, int] = {}
        for identifier in table_ids:
            progress = self.tables.get(identifier)
            if progress is None:
                continue
            for key in progress.rereading & progress.positions.keys():
                start = progress.positions[key]
                rewind[key] = min(rewind.get(key, start), start)
        if rewind:
            self.checkpoints.rewind(source, rewind)

    def _next_plan(
        self, source: KafkaSource, table_ids: list[str], bounds: dict[TP, PartitionBounds]
    ) -> BatchPlan:
        """The source's next offset ranges, from its tables' progress and this writer's
        checkpoint: what a batch reads, and what a throttled writer shows as lag."""
        checkpoint = self.checkpoints.read(source)
        positions = table_positions(
            self.tables, table_ids, checkpoint, templated=bool(source.table_template)
        )
        cap = source.max_offsets_per_trigger
        per_partition = (
            int(source.max_rate_per_partition * self.config.writer.trigger_interval)
            if source.max_rate_per_partition
            else None
        )
        return plan_batch(
            bounds, positions, source.starting_offsets, cap, per_partition, source.on_topic_reset
        )

    def _plan(
        self, source: KafkaSource, table_ids: list[str], bounds: dict[TP, PartitionBounds]
    ) -> BatchPlan:
        """The source's next offset ranges (`_next_plan`), telling the operator of restarted
        partitions and records lost to retention, and stopping on a topic reset."""
        plan = self._next_plan(source, table_ids, bounds)
        if plan.restarted:
            log.warning(
                "partitions below the next offset to read (topic deleted and recreated): tables "
                "start them over from the first offset (sources[].on_topic_reset: restart)",
                extra={
                    "writer": self.writer_id,
                    "source": source.name,
                    "restarted": {
                        table: sorted(f"{t}:{p}" for t, p in partitions)
                        for table, partitions in plan.restarted.items()
                    },
                },
            )
        if plan.behind_next:
            message = topic_reset_message(plan.behind_next)
            log.error(
                message,
                extra={
                    "writer": self.writer_id,
                    "source": source.name,
                    "behind": {
                        f"{t}:{p}": {"next": n, "end": e}
                        for (t, p), (n, e) in plan.behind_next.items()
                    },
                },
            )
            raise TopicReset(message)
        if plan.lost_to_retention:
            log.error(
                "records lost to Kafka retention before they were read",
                extra={
                    "writer": self.writer_id,
                    "source": source.name,
                    "records": sum(plan.lost_to_retention.values()),
                    "lost": {f"{t}:{p}": n for (t, p), n in plan.lost_to_retention.items()},
                },
            )
        return plan


def _real_tables(positions: dict[str, dict[TP, int]]) -> dict[str, dict[TP, int]]:
    """Per table, without the entry a templated source plans tables not seen yet by (`*`)."""
    return {table: starts for table, starts in positions.items() if table != "*"}

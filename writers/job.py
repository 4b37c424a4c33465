"""The writer job: Kafka batch -> decode -> flatten -> route -> Parquet -> moniker, in a loop.

A writer never commits to Iceberg. Each batch reads explicit offset ranges (planned from what
tables committed plus this writer's pending monikers), writes each table's rows as Parquet files
under that table's location, and publishes one moniker per table that got rows, after the files
are durable. Then it sends dead letters, commits the consumer group's offsets (so lag shows in
Kafka tools, as in seed 000), and notes its progress.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from common.catalog import open_catalog
from common.config.model import IcekeeperConfig, KafkaSource
from common.in_flight import InFlightClaims
from common.moniker import Moniker
from common.spark import spark_session
from common.transports import open_transport
from writers.checkpoints import SourceCheckpoints
from writers.dead_letters import send_dead_letters
from writers import sql
from writers.columns import (
    ERROR, KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TOPIC, ROUTE, SOURCE_DB, SOURCE_SERVER, SOURCE_TABLE, VERSION,
)
from writers.decode import UNKNOWN_SCHEMA_ID, DecodedBatch, decode_avro_confluent, decode_json
from writers.files import discard_output
from writers.flatten import helper_sql, row_value_is_null_sql, unconvertible_sql
from writers.kafka_io import SourceAdmin, read_raw
from writers.offsets import BatchPlan, plan_batch
from writers.progress import TableProgress, next_seq, refresh_progress, table_positions
from writers.registry import RegisteredSchema, TopicSchemas
from writers.routing import routes_for
from writers.table_writer import RoutedBatch, TableWriter
from writers.table_versions import predicted_route_versions, prediction_checks, prediction_held, schema_ids_of, versions_by_table

log = logging.getLogger(__name__)


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


class WriterJob:
    """One writer (stable `writer_id`) over every source and table of a config."""

    def __init__(self, config: IcekeeperConfig, spark: SparkSession | None = None, writer_id: str | None = None) -> None:
        self.config = config
        self.writer_id = writer_id or config.writer.writer_id
        self.catalog = open_catalog(config)
        self.transport = open_transport(config)
        self.checkpoints = SourceCheckpoints(config.writer.checkpoint_uri, self.writer_id)
        self.spark = spark or spark_session(config, f"{config.writer.app_name}-{self.writer_id}")
        self.schemas = {source.name: TopicSchemas(source.schema_registry_url) for source in config.sources}
        self.tables: dict[str, TableProgress] = {}
        self.seq: int | None = None
        self.pending_bytes = 0
        self.stop = threading.Event()
        self.admins = {source.name: SourceAdmin(source) for source in config.sources}
        self._route_schema_ids: dict[str, set[tuple[str, int]] | None] = {}
        """Per source, the (table, schema id) pairs of its last batch: the guess for the next one."""
        # A quarter of the reaper's grace: three missed rewrites still leave the claim live.
        heartbeat_s = max(0.5, min(30.0, config.reaper.orphan_grace / 4))
        self.claims = InFlightClaims(self.writer_id, heartbeat_s)
        self.table_writer = TableWriter(config, self.catalog, self.writer_id, self.claims, self.tables)

    # -- the loop -----------------------------------------------------------------------------------

    def run(self, max_batches: int | None = None, until_idle: bool = False, on_batch: Callable[[BatchReport], None] | None = None) -> list[BatchReport]:
        """Run batches every trigger interval until stopped (SIGTERM/SIGINT), `max_batches`, or idle."""
        reports = []
        failures = 0
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                report = self.run_batch()
                failures = 0
            except Exception as error:  # noqa: BLE001 - a failed batch published nothing; retry it
                failures += 1
                if failures >= 5:
                    raise
                log.error("batch failed; nothing was published, retrying", extra={"writer": self.writer_id, "error": repr(error), "failures": failures})
                self.stop.wait(min(30.0, 2.0 ** failures))
                continue
            if report.records_read:
                reports.append(report)
                if on_batch:
                    on_batch(report)
            if max_batches is not None and len(reports) >= max_batches:
                break
            if until_idle and not report.records_read and not report.throttled:
                break
            self.stop.wait(max(0.0, self.config.writer.trigger_interval - (time.monotonic() - started)))
        return reports

    def install_signal_handlers(self) -> None:
        """Finish the current batch on SIGTERM/SIGINT, then stop (files and monikers stay consistent)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self.stop.set())

    def run_batch(self) -> BatchReport:
        """Plan, read, write and publish one batch over every source."""
        started = time.monotonic()
        pending = self.transport.pending(writer_id=None)
        self.pending_bytes = refresh_progress(self.tables, pending, self.catalog, [spec.identifier for spec in self.config.tables], self.writer_id)
        seq = next_seq(self.tables, self.seq)
        report = BatchReport(seq=seq)
        if self.pending_bytes > self.config.bookkeeper.max_pending_bytes:
            # Backpressure: the bookkeeper is behind; reading more would only pile up files.
            log.warning("pending monikers over bookkeeper.max_pending_bytes; waiting", extra={"pending_bytes": self.pending_bytes})
            report.throttled = True
            return report
        try:
            for source in self.config.sources:
                self._run_source_batch(source, seq, report)
        finally:
            # Published, discarded or failed: either way these folders are no longer being filled.
            self.claims.release(self.claims.held())
        report.seconds = time.monotonic() - started
        if report.records_read:
            self.seq = seq
            log.info("batch written", extra={"writer": self.writer_id, **report.__dict__})
        return report

    # -- one source ------------------------------------------------------------------------------------

    def _run_source_batch(self, source: KafkaSource, seq: int, report: BatchReport) -> None:
        bounds = self.admins[source.name].bounds(self.config.writer.instance_index, self.config.writer.instance_count)
        if not bounds:
            return
        routes = routes_for(source, self.config.tables)
        table_ids = [t.identifier for t in routes.tables] + [t for t in self.tables if source.table_template and t not in {s.identifier for s in self.config.tables}]
        checkpoint = self.checkpoints.read(source)
        positions = table_positions(self.tables, table_ids, checkpoint, templated=bool(source.table_template))
        cap = source.max_offsets_per_trigger
        per_partition = int(source.max_rate_per_partition * self.config.writer.trigger_interval) if source.max_rate_per_partition else None
        plan = plan_batch(bounds, positions, source.starting_offsets, cap, per_partition)
        if plan.lost_to_retention:
            log.warning("records lost to Kafka retention before they were read", extra={"lost": {f"{t}:{p}": n for (t, p), n in plan.lost_to_retention.items()}})
        if not plan.read_ranges:
            return
        report.records_read += plan.records
        schemas = self.schemas[source.name].for_topics(topic for topic, _ in plan.read_ranges) if source.format == "avro-confluent" else []
        outcome = self._write_and_dead_letter(source, plan, seq, schemas, routes)
        for moniker in outcome.monikers:
            self.transport.publish(moniker)
            self.tables.setdefault(moniker.table, TableProgress()).published(moniker)
        report.rows_written += outcome.rows
        report.files += sum(len(m.files) for m in outcome.monikers)
        report.monikers += len(outcome.monikers)
        report.dead_lettered += outcome.dead_lettered(source)
        report.tombstones_skipped += outcome.skipped_tombstones(source)
        for kind, count in outcome.errors.items():
            report.errors[kind] = report.errors.get(kind, 0) + count
        self.admins[source.name].commit_group_offsets(plan)
        self.checkpoints.advance(source, plan)

    def _write_and_dead_letter(self, source: KafkaSource, plan: BatchPlan, seq: int, schemas: list[RegisteredSchema], routes) -> "_Outcome":  # noqa: ANN001
        """Write the batch's files, then send its dead letters (nothing is published yet).

        Dead letters go before the monikers: a moniker covers its whole offset range, poison
        included, so once it is published a restart never reads these records again (chaos found
        it). When a dead letter names a schema id the registry knows under another subject, the
        files are discarded and the batch is written again with that schema too.
        """
        outcome = self._write_tables(source, plan, seq, schemas, routes)
        dead: DataFrame | None = None
        try:
            while outcome.dead_lettered(source):
                # Cached (poison is a handful of rows): counted by reason, searched for schema ids
                # and sent without reading the batch again.
                dead = self._dead_letter_rows(source, plan, schemas, routes).persist()
                registered = self._newly_registered(source, dead, schemas)
                if not registered:
                    break
                dead.unpersist()
                dead = None
                discard_output(outcome.output_dirs)
                schemas = schemas + registered
                outcome = self._write_tables(source, plan, seq, schemas, routes)
            if dead is not None:
                outcome.errors = {row["reason"]: int(row["count"]) for row in dead.groupBy("reason").count().collect()}
                send_dead_letters(dead, source.bootstrap_servers, source.dead_letter_topic)
        finally:
            if dead is not None:
                dead.unpersist()
        return outcome

    # -- reading and writing ---------------------------------------------------------------------------

    def _decode(self, source: KafkaSource, raw: DataFrame, schemas: list[RegisteredSchema]) -> DecodedBatch:
        if source.format == "avro-confluent":
            return decode_avro_confluent(raw, schemas, self._envelope_fields())
        return decode_json(self.spark, raw, debezium=source.format == "debezium-json")

    def _envelope_fields(self) -> dict[str, set[str]]:
        """Debezium envelope fields the batch uses: the configured metadata columns plus routing."""
        metadata = self.config.metadata_columns
        return {"source": set(metadata.source.columns) | {"name", "db", "table", "ts_ms"}, "transaction": set(metadata.transaction.columns)}

    def _write_tables(self, source: KafkaSource, plan: BatchPlan, seq: int, schemas: list[RegisteredSchema], routes) -> "_Outcome":  # noqa: ANN001
        raw = read_raw(self.spark, source, plan)
        decoded = self._decode(source, raw, schemas)
        routed = self._routed_rows(decoded, routes, source)
        predicted = predicted_route_versions(self._route_schema_ids.get(source.name), decoded.versions)
        outcome = self._write_routed(source, plan, seq, decoded, routed, predicted) if predicted else None
        if outcome is None:
            # No guess, or the guess missed (a new table or schema version): learn the pairs, then write.
            route_versions = self._route_versions(routed)
            outcome = self._write_routed(source, plan, seq, decoded, routed, None, route_versions)
            self._route_schema_ids[source.name] = schema_ids_of(route_versions, decoded.versions)  # type: ignore[assignment]
        metrics = outcome.batch_metrics if outcome.batch_metrics else self._batch_metrics_alone(routed)
        outcome.failed = int(metrics.get("failed") or 0)
        outcome.tombstones = int(metrics.get("tombstone") or 0)
        if not source.offset_gaps and metrics.get("records") is not None and int(metrics["records"]) != plan.records:
            discard_output(outcome.output_dirs)
            raise BatchIncomplete(f"read {metrics['records']} records where offsets span {plan.records}; the batch is retried")
        return outcome

    def _write_routed(self, source: KafkaSource, plan: BatchPlan, seq: int, decoded: DecodedBatch, routed: DataFrame,
                      predicted: list[tuple[str, int]] | None, route_versions: list[tuple[str, int]] | None = None) -> "_Outcome | None":
        """Write every table of the batch with its own versions: `route_versions` as learned, or
        `predicted`, checked while the first table is written; None (nothing kept) when it missed."""
        outcome = _Outcome()
        checks = prediction_checks(predicted, ROUTE, VERSION) if predicted else {}
        table_versions = versions_by_table(predicted or route_versions or [], decoded.versions)
        batch = RoutedBatch(source, plan, seq, decoded, routed)
        for index, (identifier, versions) in enumerate(table_versions.items()):
            # The first table's write also counts the whole batch (and checks the guess).
            observations = [*self._batch_metric_columns(), *[F.expr(expression).alias(name) for name, expression in checks.items()]] if index == 0 else None
            written = self.table_writer.write(batch, identifier, versions, observations)
            outcome.output_dirs.append(written.output_dir)
            if index == 0:
                outcome.batch_metrics = written.observed
            if index == 0 and predicted and not prediction_held(predicted, outcome.batch_metrics):
                discard_output(outcome.output_dirs)
                return None
            if written.moniker is not None:
                outcome.monikers.append(written.moniker)
                outcome.rows += written.moniker.records
        return outcome

    @staticmethod
    def _route_versions(routed: DataFrame) -> list[tuple[str, int]]:
        """The batch's distinct (table, schema version) pairs: which tables it feeds, and with what.

        Records that fail to decode count with the version their frame names: harmless (the
        version's columns come out null) and it keeps this pass from decoding anything when
        routing is by topic, since the route and the version then depend on the topic and the
        frame's first five bytes alone.
        """
        pairs = routed.where(f"{ROUTE} IS NOT NULL AND {VERSION} IS NOT NULL").groupBy(ROUTE, VERSION).count().collect()
        return [(row[ROUTE], int(row[VERSION])) for row in pairs]

    @staticmethod
    def _batch_metric_columns() -> list:
        """Records, failed records and tombstones, observed while the batch is written.

        Counts per error kind and unknown schema ids come from the dead-letter pass, which runs
        only when something failed: per-kind counting on every record cost ~10% of the batch, and
        a `collect_set` of schema ids (an aggregate Spark evaluates without code generation)
        another ~7% (both measured).
        """
        return [
            F.expr("count(1)").alias("records"),
            F.expr(f"count_if({ERROR} IS NOT NULL)").alias("failed"),
            F.expr(f"count_if({ERROR} = 'tombstone')").alias("tombstone"),
        ]

    def _batch_metrics_alone(self, routed: DataFrame) -> dict:
        return routed.agg(*self._batch_metric_columns()).collect()[0].asDict()

    def _routed_rows(self, decoded: DecodedBatch, routes, source: KafkaSource) -> DataFrame:  # noqa: ANN001
        """Batch-level frame: decoded + routing + error kinds (before any table's flattening)."""
        helpers = helper_sql(decoded.versions)
        frame = decoded.frame.selectExpr("*", *[f"{helpers[name]} AS {name}" for name in (KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET, SOURCE_DB, SOURCE_TABLE, SOURCE_SERVER)])
        frame = frame.selectExpr("*", f"{routes.sql()} AS {ROUTE}")
        error = (f"CASE WHEN {ERROR} IS NOT NULL THEN {ERROR} WHEN {ROUTE} IS NULL THEN 'unroutable'"
                 f" WHEN {self._missing_key_sql(decoded)} THEN 'missing-key'"
                 f" WHEN {unconvertible_sql(decoded.versions)} THEN 'unconvertible-value' END")
        return frame.selectExpr(*[sql.ident(c) for c in frame.columns if c != ERROR], f"{error} AS {ERROR}")

    def _missing_key_sql(self, decoded: DecodedBatch) -> str:
        """True for rows routed to a table with a primary key whose key columns are null.

        Each version's value is tested on its own (no coalesce across versions), so versions that
        give a key column different types never meet in one expression.
        """
        conditions = []
        for spec in self.config.tables:
            if spec.primary_key:
                any_null = sql.any_of(row_value_is_null_sql(key, decoded.versions, case_insensitive=True) for key in spec.primary_key)
                conditions.append(f"({ROUTE} = {sql.string(spec.identifier)} AND {any_null})")
        return sql.any_of(conditions)

    def _newly_registered(self, source: KafkaSource, dead: DataFrame, schemas: list[RegisteredSchema]) -> list[RegisteredSchema]:
        """Schemas the registry knows by id that dead letters of this batch name but `schemas` lacks."""
        if source.format != "avro-confluent":
            return []
        ids = [row[0] for row in dead.where("reason = 'unknown-schema-id'").selectExpr(f"{UNKNOWN_SCHEMA_ID} AS id").distinct().collect()]
        known = {schema.schema_id for schema in schemas}
        found = [self.schemas[source.name].by_id(int(schema_id)) for schema_id in ids if schema_id is not None and int(schema_id) not in known]
        return [schema for schema in found if schema is not None]

    def _dead_letter_rows(self, source: KafkaSource, plan: BatchPlan, schemas: list[RegisteredSchema], routes) -> DataFrame:  # noqa: ANN001
        raw = read_raw(self.spark, source, plan, include_headers=True)
        decoded = self._decode(source, raw, schemas)
        routed = self._routed_rows(decoded, routes, source)
        failed = routed.where(f"{ERROR} IS NOT NULL" + (f" AND {ERROR} != 'tombstone'" if source.tombstones == "skip" else ""))
        return failed.selectExpr("key", "value", "headers", "topic", "partition", "offset", f"{ERROR} AS reason")

    # -- after the batch -----------------------------------------------------------------------------

class BatchIncomplete(RuntimeError):
    """Kafka returned fewer records than the planned offsets span; nothing was published."""


@dataclass
class _Outcome:
    monikers: list[Moniker] = field(default_factory=list)
    rows: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    output_dirs: list[str] = field(default_factory=list)
    failed: int = 0
    tombstones: int = 0
    batch_metrics: dict = field(default_factory=dict)

    def skipped_tombstones(self, source: KafkaSource) -> int:
        return self.tombstones if source.tombstones == "skip" else 0

    def dead_lettered(self, source: KafkaSource) -> int:
        """Failed records that go to the dead-letter topic (skipped tombstones do not)."""
        return self.failed - self.skipped_tombstones(source)


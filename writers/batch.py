"""Write one source's batch into every table it feeds, then send its dead letters; publish nothing.

The steps, each in its own module: read the planned offsets (`kafka_io.py`), decode
(`decode.py`), route and mark the records that cannot become rows (`routing.py`), learn or
predict which schema versions feed which table (`table_versions.py`), then flatten and write each
table's rows (`table_writer.py`); records that failed go to the dead-letter topic
(`dead_letters.py`). The monikers come back to the caller, which publishes them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from pyiceberg.catalog import Catalog
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from icekeeper.common.config.model import IcekeeperConfig, KafkaSource
from icekeeper.common.in_flight import InFlightClaims
from icekeeper.common.moniker import Moniker
from icekeeper.writers import sql
from icekeeper.writers.arrow_engine.engine import ArrowBatch, ArrowEngine
from icekeeper.writers.columns import ERROR, ROUTE, VERSION
from icekeeper.writers.dead_letters import send_dead_letters
from icekeeper.writers.decode import (
    UNKNOWN_SCHEMA_ID,
    DecodedBatch,
    decode_avro_confluent,
    decode_json,
    envelope_fields,
    frame_prefix,
    framed_schema_id_sql,
)
from icekeeper.writers.files import discard_output
from icekeeper.writers.kafka_io import read_raw
from icekeeper.writers.offsets import BatchPlan
from icekeeper.writers.progress import TableProgress
from icekeeper.writers.reconciliation import (
    BatchIntake,
    BatchUnreconciled,
    TableIntake,
    discrepancies,
    ledger,
)
from icekeeper.writers.record_keys import RecordKeys, record_keys_for
from icekeeper.writers.registry import (
    RegisteredSchema,
    RegistryUnavailable,
    TopicSchemas,
    registry_outage,
)
from icekeeper.writers.routing import Routes, routed_rows
from icekeeper.writers.table_versions import (
    only_pair,
    predicted_route_versions,
    prediction_checks,
    prediction_held,
    schema_ids_of,
    versions_by_table,
)
from icekeeper.writers.table_writer import RoutedBatch, TableWriter, at_or_after_sql

log = logging.getLogger(__name__)


class BatchIncomplete(RuntimeError):
    """Kafka returned fewer records than the planned offsets span; nothing was published."""


@dataclass
class BatchOutcome:
    """What writing one source's batch gave: monikers
    to publish, and counts for the batch report."""

    monikers: list[Moniker] = field(default_factory=list)
    rows: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    output_dirs: list[str] = field(default_factory=list)
    failed: int = 0
    tombstones: int = 0
    batch_metrics: dict = field(default_factory=dict)
    intake: BatchIntake | None = None
    """What the writing pass counted, reconciled with the dead letters before the monikers are
    returned (`writers/reconciliation.py`)."""

    def skipped_tombstones(self, source: KafkaSource) -> int:
        return self.tombstones if source.tombstones == "skip" else 0

    def dead_lettered(self, source: KafkaSource) -> int:
        """Failed records that go to the dead-letter topic (skipped tombstones do not)."""
        return self.failed - self.skipped_tombstones(source)


class BatchWriter:
    """Writes sources' batches for one writer; remembers per source which tables and versions its
    last batch fed."""

    def __init__(
        self,
        config: IcekeeperConfig,
        spark: SparkSession,
        catalog: Catalog,
        writer_id: str,
        claims: InFlightClaims,
        tables: dict[str, TableProgress],
        schemas: dict[str, TopicSchemas],
    ) -> None:
        self.config = config
        self.spark = spark
        self.schemas = schemas
        self.table_writer = TableWriter(config, catalog, writer_id, claims, tables)
        self.arrow_engine = (
            ArrowEngine(config, spark, catalog, writer_id, claims, tables)
            if config.writer.engine == "arrow"
            else None
        )
        self._route_schema_ids: dict[str, set[tuple[str, int]] | None] = {}
        """Per source, the (table, schema id) pairs of
        its last batch: the guess for the next one."""
        self._key_schemas: dict[str, list[RegisteredSchema]] = {}
        """Per Avro source, the key schemas its deletes without
        `before` named so far (`_learn_key_schemas`)."""

    def write(
        self,
        source: KafkaSource,
        plan: BatchPlan,
        seq: int,
        schemas: list[RegisteredSchema],
        routes: Routes,
    ) -> BatchOutcome:
        """Write the batch's files, then send its dead letters (nothing is published yet).

        Dead letters go before the monikers: a moniker covers its whole offset range, poison
        included, so once it is published a restart never reads these records again (chaos found
        it). When a dead letter names a schema id the registry knows under another subject, the
        files are discarded and the batch is written again with that schema too; likewise when a
        delete without `before` has a record key whose schema the writer did not know yet (key
        schemas are learnt this way, by id: batches without such deletes never ask the registry).
        """
        outcome = self._write_tables(source, plan, seq, schemas, routes)
        dead: DataFrame | None = None
        dead_letters: dict[str, int] = {}
        try:
            while outcome.dead_lettered(source):
                # Cached (poison is a handful of rows): counted by reason, searched for schema ids
                # and sent without reading the batch again.
                dead = self._dead_letter_rows(source, plan, schemas, routes).persist()
                registered = self._newly_registered(source, dead, schemas)
                learnt_keys = self._learn_key_schemas(source, routes, dead)
                if not registered and not learnt_keys:
                    break
                dead.unpersist()
                dead = None
                discard_output(outcome.output_dirs)
                schemas = schemas + registered
                outcome = self._write_tables(source, plan, seq, schemas, routes)
            if dead is not None:
                dead_letters = {
                    row["reason"]: int(row["count"])
                    for row in dead.groupBy("reason").count().collect()
                }
                outcome.errors = dict(dead_letters)
                if outcome.errors.get("unknown-schema-id") and (
                    outage := self._registry_outage(source, plan, dead, schemas)
                ):
                    raise RegistryUnavailable(outage)
            _reconcile(source, plan, seq, outcome, dead_letters)
            if dead is not None:
                send_dead_letters(dead, source)
        except (RegistryUnavailable, BatchUnreconciled):
            # Nothing of the batch is published or dead-lettered: the writer pauses
            # and reads it again, or fails the batch loudly (`_reconcile`).
            discard_output(outcome.output_dirs)
            raise
        finally:
            if dead is not None:
                dead.unpersist()
        return outcome

    def _decode(
        self, source: KafkaSource, raw: DataFrame, schemas: list[RegisteredSchema], routes: Routes
    ) -> DecodedBatch:
        keys = self._record_keys(source, routes)
        if source.format == "avro-confluent":
            return decode_avro_confluent(
                raw, schemas, envelope_fields(self.config.metadata_columns), keys
            )
        return decode_json(self.spark, raw, debezium=source.format == "debezium-json", keys=keys)

    def _record_keys(self, source: KafkaSource, routes: Routes) -> RecordKeys | None:
        """How record keys are read: only for sources feeding
        tables with a primary key (`record_keys.py`)."""
        return record_keys_for(routes.tables, self._key_schemas.get(source.name, []))

    def _write_tables(
        self,
        source: KafkaSource,
        plan: BatchPlan,
        seq: int,
        schemas: list[RegisteredSchema],
        routes: Routes,
    ) -> BatchOutcome:
        if self.arrow_engine is not None:
            written = self.arrow_engine.write(
                source, plan, seq, schemas, routes, self._key_schemas.get(source.name, [])
            )
            if written is not None:
                return _arrow_outcome(source, plan, written)
        raw = read_raw(self.spark, source, plan)
        decoded = self._decode(source, raw, schemas, routes)
        routed = routed_rows(decoded, routes, self.config.tables)
        batch = RoutedBatch(source, plan, seq, decoded, routed, routes)
        predicted = predicted_route_versions(
            self._route_schema_ids.get(source.name), decoded.versions
        ) or only_pair(routes, decoded.versions)
        outcome = self._write_routed(batch, predicted) if predicted else None
        if outcome is None:
            # No guess, or the guess missed (a new table or
            # schema version): learn the pairs, then write.
            learned = route_versions(routed)
            outcome = self._write_routed(batch, None, learned)
            self._route_schema_ids[source.name] = schema_ids_of(learned, decoded.versions)  # type: ignore[assignment]
        metrics = outcome.batch_metrics if outcome.batch_metrics else _batch_metrics_alone(routed)
        outcome.failed = int(metrics.get("failed") or 0)
        outcome.tombstones = int(metrics.get("tombstone") or 0)
        if outcome.intake is None:  # no table written: every record must have failed
            outcome.intake = BatchIntake(
                int(metrics.get("records") or 0), outcome.failed, outcome.tombstones
            )
        if (
            not source.offset_gaps
            and metrics.get("records") is not None
            and int(metrics["records"]) != plan.records
        ):
            discard_output(outcome.output_dirs)
            raise BatchIncomplete(
                f"read {metrics['records']} records where offsets span {plan.records}; the batch "
                "is retried"
            )
        return outcome

    def _write_routed(
        self,
        batch: RoutedBatch,
        predicted: list[tuple[str, int]] | None,
        learned: list[tuple[str, int]] | None = None,
    ) -> BatchOutcome | None:
        """Write every table of the batch with its own versions:
        `learned` route versions, or `predicted`, checked while the
        first table is written; None (nothing kept) when it missed."""
        outcome = BatchOutcome()
        checks = prediction_checks(predicted, ROUTE, VERSION) if predicted else {}
        table_versions = versions_by_table(predicted or learned or [], batch.decoded.versions)
        writes = [
            (route, identifier, versions)
            for route, versions in table_versions.items()
            for identifier in batch.routes.fed_by(route)
        ]
        accepted, before_start, intake_counts = _intake_counts(batch.plan, writes)
        taken: dict[str, TableIntake] = {}
        for index, (route, identifier, versions) in enumerate(writes):
            # The first table's write also counts the whole batch (and checks the guess).
            observations = (
                [
                    *batch_metric_columns(),
                    *[F.expr(expression).alias(name) for name, expression in checks.items()],
                    *[F.expr(expression).alias(name) for name, expression in intake_counts.items()],
                ]
                if index == 0
                else None
            )
            written = self.table_writer.write(
                batch, identifier, versions, observations, route=route
            )
            outcome.output_dirs.append(written.output_dir)
            if index == 0:
                outcome.batch_metrics = written.observed
            if index == 0 and predicted and not prediction_held(predicted, outcome.batch_metrics):
                discard_output(outcome.output_dirs)
                return None
            if written.moniker is not None:
                outcome.monikers.append(written.moniker)
                outcome.rows += written.moniker.records
            taken[identifier] = TableIntake(route, int(written.observed.get("rows") or 0))
        if writes:
            metrics = outcome.batch_metrics
            outcome.intake = BatchIntake(
                records=int(metrics.get("records") or 0),
                failed=int(metrics.get("failed") or 0),
                tombstones=int(metrics.get("tombstone") or 0),
                accepted={route: int(metrics.get(name) or 0) for route, name in accepted.items()},
                tables={
                    identifier: replace(
                        table, before_start=int(metrics.get(before_start.get(identifier)) or 0)
                    )
                    for identifier, table in taken.items()
                },
                fed_by={route: tuple(batch.routes.fed_by(route)) for route in accepted},
            )
        return outcome

    def _newly_registered(
        self, source: KafkaSource, dead: DataFrame, schemas: list[RegisteredSchema]
    ) -> list[RegisteredSchema]:
        """Schemas the registry knows by id that dead
        letters of this batch name but `schemas` lacks."""
        if source.format != "avro-confluent":
            return []
        ids = [
            row[0]
            for row in dead.where("reason = 'unknown-schema-id'")
            .selectExpr(f"{UNKNOWN_SCHEMA_ID} AS id")
            .distinct()
            .collect()
        ]
        known = {schema.schema_id for schema in schemas}
        found = [
            self.schemas[source.name].by_id(int(schema_id))
            for schema_id in ids
            if schema_id is not None and int(schema_id) not in known
        ]
        return [schema for schema in found if schema is not None]

    def _registry_outage(
        self, source: KafkaSource, plan: BatchPlan, dead: DataFrame, schemas: list[RegisteredSchema]
    ) -> str | None:
        """Why the unknown schema ids of `dead` are the
        registry's fault (`registry_outage`), or None."""
        registry = self.schemas[source.name]
        unknown_topics = {
            row["topic"]
            for row in dead.where("reason = 'unknown-schema-id'")
            .select("topic")
            .distinct()
            .collect()
        }
        try:
            subjects: list[str] | RegistryUnavailable = registry.subjects()
        except RegistryUnavailable as error:
            subjects = error

        def with_known_ids(topics: set[str]) -> set[str]:
            if not schemas:
                return set()
            prefixes = sql.in_list(
                "substring(value, 1, 5)",
                [sql.binary(frame_prefix(schema.schema_id)) for schema in schemas],
            )
            topic_list = sql.in_list("topic", [sql.string(topic) for topic in sorted(topics)])
            raw = read_raw(self.spark, source, plan)
            return {
                row["topic"]
                for row in raw.where(f"{topic_list} AND {prefixes}")
                .select("topic")
                .distinct()
                .collect()
            }

        return registry_outage(subjects, unknown_topics, with_known_ids)

    def _learn_key_schemas(self, source: KafkaSource, routes: Routes, dead: DataFrame) -> bool:
        """Remember the registry's key schemas that deletes without `before` in `dead` name by id
        and the writer lacks; True when it found any (then the batch is written again)."""
        if source.format != "avro-confluent" or self._record_keys(source, routes) is None:
            return False
        framed = (
            dead.where("reason = 'delete-without-key'")
            .selectExpr(f"{framed_schema_id_sql('key')} AS id")
            .distinct()
            .collect()
        )
        known = self._key_schemas.setdefault(source.name, [])
        ids = {int(row["id"]) for row in framed if row["id"] is not None} - {
            schema.schema_id for schema in known
        }
        found = [
            schema
            for schema_id in sorted(ids)
            if (schema := self.schemas[source.name].by_id(schema_id)) is not None
        ]
        known.extend(found)
        return bool(found)

    def _dead_letter_rows(
        self, source: KafkaSource, plan: BatchPlan, schemas: list[RegisteredSchema], routes: Routes
    ) -> DataFrame:
        raw = read_raw(self.spark, source, plan, include_headers=True)
        decoded = self._decode(source, raw, schemas, routes)
        routed = routed_rows(decoded, routes, self.config.tables)
        failed = routed.where(
            f"{ERROR} IS NOT NULL"
            + (f" AND {ERROR} != 'tombstone'" if source.tombstones == "skip" else "")
        )
        return failed.selectExpr(
            "key", "value", "headers", "topic", "partition", "offset", f"{ERROR} AS reason"
        )


def _arrow_outcome(source: KafkaSource, plan: BatchPlan, written: ArrowBatch) -> BatchOutcome:
    """The outcome of a batch the arrow engine wrote (`writers/arrow_engine/`)."""
    failed = sum(written.errors.values())
    outcome = BatchOutcome(
        monikers=written.monikers,
        rows=written.rows,
        output_dirs=written.output_dirs,
        failed=failed,
        tombstones=written.errors.get("tombstone", 0),
        intake=written.intake,
        batch_metrics={
            "records": written.records,
            "failed": failed,
            "tombstone": written.errors.get("tombstone", 0),
        },
    )
    if not source.offset_gaps and written.records != plan.records:
        discard_output(outcome.output_dirs)
        raise BatchIncomplete(
            f"read {written.records} records where offsets span {plan.records}; the batch is "
            "retried"
        )
    return outcome


def _intake_counts(
    plan: BatchPlan, writes: list[tuple[str, str, list]]
) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """What the first table's write also counts for the reconciliation: records each written
    route accepted, and each table's before its own start (where that differs from the read
    start). Returns route -> alias, table -> alias, and alias -> SQL of the counts."""
    routes = list(dict.fromkeys(route for route, _, _ in writes))
    accepted = {route: f"_ik_accepted_{index}" for index, route in enumerate(routes)}
    counts = {
        accepted[route]: f"count_if({ERROR} IS NULL AND {ROUTE} = {sql.string(route)})"
        for route in routes
    }
    before_start = {}
    for route, identifier, _ in writes:
        kept = at_or_after_sql(plan, identifier)
        if kept != "true":
            alias = before_start[identifier] = f"_ik_before_start_{len(before_start)}"
            counts[alias] = (
                f"count_if({ERROR} IS NULL AND {ROUTE} = {sql.string(route)} AND NOT {kept})"
            )
    return accepted, before_start, counts


def _reconcile(
    source: KafkaSource,
    plan: BatchPlan,
    seq: int,
    outcome: BatchOutcome,
    dead_letters: dict[str, int],
) -> None:
    """Raise `BatchUnreconciled`, logged at error level with the counts, when a record the batch
    read would land nowhere, or twice: written, dead-lettered or skipped (`reconciliation.py`)."""
    if outcome.intake is None:
        return
    skip = source.tombstones == "skip"
    problems = discrepancies(outcome.intake, dead_letters, skip)
    if not problems:
        return
    counts = ledger(outcome.intake, dead_letters, skip)
    log.error(
        "batch does not reconcile; nothing of it is published or dead-lettered, its files are "
        "discarded",
        extra={
            "source": source.name,
            "seq": seq,
            "offsets": {
                f"{t}:{p}": list(span) for (t, p), span in sorted(plan.read_ranges.items())
            },
            "problems": problems,
            **counts,
        },
    )
    raise BatchUnreconciled(problems, counts)


def route_versions(routed: DataFrame) -> list[tuple[str, int]]:
    """The batch's distinct (table, schema version) pairs: which tables it feeds, and with what.

    Records that fail to decode count with the version their frame names: harmless (the
    version's columns come out null) and it keeps this pass from decoding anything when
    routing is by topic, since the route and the version then depend on the topic and the
    frame's first five bytes alone.
    """
    pairs = (
        routed.where(f"{ROUTE} IS NOT NULL AND {VERSION} IS NOT NULL")
        .groupBy(ROUTE, VERSION)
        .count()
        .collect()
    )
    return [(row[ROUTE], int(row[VERSION])) for row in pairs]


def batch_metric_columns() -> list[Column]:
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


def _batch_metrics_alone(routed: DataFrame) -> dict:
    return routed.agg(*batch_metric_columns()).collect()[0].asDict()

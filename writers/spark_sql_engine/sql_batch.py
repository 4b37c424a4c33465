"""The `spark-sql` engine: one source's batch read, decoded, routed and written as Spark SQL.

The steps, each in its own module: read the planned offsets (`kafka_source.py`), decode
(`decoding.py`), route and mark the records that cannot become rows (`sql_routing.py`), learn or
predict which schema versions feed which table (`writers/table_versions.py`, counted here by
`sql_table_versions.py`), then have the core plan each table's batch and write its rows
(`table_writer.py`). The first table's write also counts the whole batch (records, failed,
tombstones, each route's accepted records), in the same pass, for the batch's reconciliation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.writers.engines import EngineWrite, SourceBatch, WrittenTable
from icekeeper.writers.files import discard_output
from icekeeper.writers.offsets import BatchPlan
from icekeeper.writers.reconciliation import BatchIntake, TableIntake
from icekeeper.writers.spark_sql_engine import sql
from icekeeper.writers.spark_sql_engine.columns import ERROR, ROUTE
from icekeeper.writers.spark_sql_engine.decoding import DecodedBatch
from icekeeper.writers.spark_sql_engine.kafka_source import read_raw
from icekeeper.writers.spark_sql_engine.sql_decoders import sql_decoder
from icekeeper.writers.spark_sql_engine.sql_routing import routed_rows
from icekeeper.writers.spark_sql_engine.sql_table_versions import (
    prediction_checks,
    prediction_held,
    route_versions,
)
from icekeeper.writers.spark_sql_engine.table_writer import (
    RoutedBatch,
    TableWriter,
    at_or_after_sql,
)
from icekeeper.writers.table_batch import TableBatches, table_starts
from icekeeper.writers.table_versions import (
    only_pair,
    predicted_route_versions,
    schema_ids_of,
    versions_by_table,
)


@dataclass
class _Written:
    """The tables one attempt wrote, and the batch counts its first table's write observed."""

    tables: list[WrittenTable] = field(default_factory=list)
    output_dirs: list[str] = field(default_factory=list)
    batch_metrics: dict = field(default_factory=dict)
    intake: BatchIntake | None = None


class SparkSqlEngine:
    """Writes sources' batches with Spark SQL for one writer; remembers per source which tables
    and versions its last batch fed."""

    def __init__(self, config: IcekeeperConfig, spark: SparkSession, tables: TableBatches) -> None:
        self.config = config
        self.spark = spark
        self.tables = tables
        self.table_writer = TableWriter(config)
        self._route_schema_ids: dict[str, set[tuple[str, int]] | None] = {}
        """Per source, the (table, schema id) pairs of
        its last batch: the guess for the next one."""

    def decode(self, batch: SourceBatch, raw: DataFrame) -> DecodedBatch:
        """The batch's raw records decoded by the source format's registered decoder
        (`sql_decoders.py`)."""
        decode = sql_decoder(batch.source.format)
        return decode(self.spark, raw, batch, self.config.metadata_columns)

    def write(self, batch: SourceBatch) -> EngineWrite:
        """Write every table the batch feeds (see the module docstring)."""
        source, plan, routes = batch.source, batch.plan, batch.routes
        raw = read_raw(self.spark, source, plan)
        decoded = self.decode(batch, raw)
        routed = routed_rows(decoded, routes, self.config.tables)
        routed_batch = RoutedBatch(source, plan, batch.seq, decoded, routed, routes)
        predicted = predicted_route_versions(
            self._route_schema_ids.get(source.name), decoded.versions
        ) or only_pair(routes, decoded.versions)
        written = self._write_routed(routed_batch, predicted) if predicted else None
        if written is None:
            # No guess, or the guess missed (a new table or
            # schema version): learn the pairs, then write.
            learned = route_versions(routed)
            written = self._write_routed(routed_batch, None, learned)
            self._route_schema_ids[source.name] = schema_ids_of(learned, decoded.versions)
        metrics = written.batch_metrics if written.batch_metrics else _batch_metrics_alone(routed)
        records = int(metrics.get("records") or 0)
        intake = written.intake or BatchIntake(  # no table written: every record must have failed
            records, int(metrics.get("failed") or 0), int(metrics.get("tombstone") or 0)
        )
        return EngineWrite(records, intake, written.tables, written.output_dirs)

    def _write_routed(
        self,
        batch: RoutedBatch,
        predicted: list[tuple[str, int]] | None,
        learned: list[tuple[str, int]] | None = None,
    ) -> _Written | None:
        """Write every table of the batch with its own versions:
        `learned` route versions, or `predicted`, checked while the
        first table is written; None (nothing kept) when it missed."""
        written = _Written()
        checks = prediction_checks(predicted) if predicted else {}
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
            table = self.tables.plan(batch.plan, batch.seq, identifier, route, versions)
            written.output_dirs.append(table.output_uri)
            table_write = self.table_writer.write(batch, table, observations)
            if index == 0:
                written.batch_metrics = table_write.observed
            if index == 0 and predicted and not prediction_held(predicted, written.batch_metrics):
                discard_output(written.output_dirs)
                return None
            written.tables.append(WrittenTable(table, table_write.files))
            taken[identifier] = TableIntake(route, int(table_write.observed.get("rows") or 0))
        if writes:
            metrics = written.batch_metrics
            written.intake = BatchIntake(
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
        return written


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
        kept = at_or_after_sql(table_starts(plan, identifier))
        if kept != "true":
            alias = before_start[identifier] = f"_ik_before_start_{len(before_start)}"
            counts[alias] = (
                f"count_if({ERROR} IS NULL AND {ROUTE} = {sql.string(route)} AND NOT {kept})"
            )
    return accepted, before_start, counts


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

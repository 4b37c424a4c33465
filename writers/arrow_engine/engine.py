"""The arrow engine's driver: plan a source's batch as tasks, run them on Spark, build monikers.

Spark stays the scheduler (tasks, retries, executors); each task runs `task.run_task` in a
Python worker and returns file facts. A small batch (`writer.driver_batch_records`) runs the
same task bodies in the driver's own threads: a Spark job costs 0.2-0.5 s whatever its size,
ten times the work of the few thousand records a low-latency writer reads per batch.

As on `spark-sql`, a table's columns come from the schema versions of its own records in the
batch: the (table, schema id) pairs of the source's last batch are the guess, checked against
the pairs the tasks count while writing; without a guess, or when it missed, a first pass counts
them (from the frames alone when routing is by topic).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyspark.sql import SparkSession

from icekeeper.common.arrow_parquet import untaken_properties, writer_options
from icekeeper.common.catalog import default_table_location, load_table_or_none, table_properties
from icekeeper.common.config.model import IcekeeperConfig, KafkaSource, TableSpec
from icekeeper.common.in_flight import InFlightClaims
from icekeeper.common.moniker import Moniker, moniker_id
from icekeeper.common.partitioning import partition_spec
from icekeeper.common.schema import Column, assign_ids, envelope_shape, op_column
from icekeeper.writers.arrow_engine.flatten import VersionPlan, arrow_schema
from icekeeper.writers.arrow_engine.partitions import partition_fields
from icekeeper.writers.arrow_engine.record_keys import KeyReader, key_readers
from icekeeper.writers.arrow_engine.support import (
    layout_reason,
    log_fallback_once,
    unsupported_reason,
)
from icekeeper.writers.arrow_engine.task import RouteClaim, TablePlan, TaskFacts, TaskPlan, run_task
from icekeeper.writers.arrow_engine.tasks import TaskGroup, TaskRange, task_ranges
from icekeeper.writers.arrow_engine.upserts import UpsertPlan, shared_key_count, whole_partitions
from icekeeper.writers.columns import version_column
from icekeeper.writers.decode import (
    VersionShape,
    _shape_from_avro,
    envelope_fields,
    skipped_envelope_fields,
)
from icekeeper.writers.files import batch_folder, discard_output
from icekeeper.writers.flatten import resolve_keys, table_columns
from icekeeper.writers.offsets import BatchPlan
from icekeeper.writers.progress import TableProgress
from icekeeper.writers.reconciliation import TOMBSTONE, BatchIntake, TableIntake
from icekeeper.writers.record_keys import record_keys_for
from icekeeper.writers.registry import RegisteredSchema
from icekeeper.writers.routing import Routes
from icekeeper.writers.table_versions import (
    only_pair,
    predicted_route_versions,
    schema_ids_of,
    versions_by_table,
)
from icekeeper.writers.table_writer import offset_ranges

log = logging.getLogger(__name__)


@dataclass
class ArrowBatch:
    """What the arrow engine wrote of one source's batch (`writers.batch` makes the outcome)."""

    records: int
    errors: Counter
    monikers: list[Moniker] = field(default_factory=list)
    rows: int = 0
    output_dirs: list[str] = field(default_factory=list)
    intake: BatchIntake | None = None
    """What the tasks counted, for the batch's reconciliation (`writers/reconciliation.py`)."""


class ArrowEngine:
    """Writes sources' batches with Arrow-native Spark tasks for one writer."""

    def __init__(
        self,
        config: IcekeeperConfig,
        spark: SparkSession,
        catalog: Catalog,
        writer_id: str,
        claims: InFlightClaims,
        tables: dict[str, TableProgress],
    ) -> None:
        self.config = config
        self.spark = spark
        self.catalog = catalog
        self.writer_id = writer_id
        self.claims = claims
        self.tables = tables
        self._route_schema_ids: dict[str, set[tuple[str, int]] | None] = {}

    def write(
        self,
        source: KafkaSource,
        plan: BatchPlan,
        seq: int,
        schemas: list[RegisteredSchema],
        routes: Routes,
        key_schemas: list[RegisteredSchema] | None = None,
    ) -> ArrowBatch | None:
        """Write the batch's tables; None when the batch must run on `spark-sql` (logged once).

        `key_schemas`: the record key schemas the writer knows (deletes without `before`)."""
        reason = (
            unsupported_reason(source, routes.tables, schemas)
            or layout_reason(routes.tables, self.config.writer.distribution)
            or self._properties_reason(routes.tables)
        )
        if reason is not None:
            log_fallback_once(source, reason)
            return None
        shapes = [
            _shape_from_avro(version_column(index), envelope_shape(s.resolved), s.schema_id)
            for index, s in enumerate(schemas)
        ]
        keep = envelope_fields(self.config.metadata_columns)
        versions = [
            _version_plan(index, s, shape, skipped_envelope_fields(s.text, keep))
            for index, (s, shape) in enumerate(zip(schemas, shapes, strict=True))
        ]
        tasks = task_ranges(plan, self.spark.sparkContext.defaultParallelism)
        readers = key_readers(
            versions, record_keys_for(routes.tables, key_schemas or []), key_schemas or []
        )
        predicted = predicted_route_versions(
            self._route_schema_ids.get(source.name), shapes
        ) or only_pair(routes, shapes)
        if predicted is None:
            learned = self._run(source, versions, routes, [], tasks)
            pairs = sorted(learned.pairs)
        else:
            pairs = predicted
        written = self._write(source, plan, seq, versions, shapes, routes, tasks, pairs, readers)
        if written is None:
            return None
        batch, facts = written
        if predicted is not None and sorted(facts.pairs) != predicted:
            # The guess missed (a new table or schema version): write again with what was counted.
            discard_output(batch.output_dirs)
            pairs = sorted(facts.pairs)
            written = self._write(
                source, plan, seq, versions, shapes, routes, tasks, pairs, readers
            )
            if written is None:
                return None
            batch, facts = written
        self._route_schema_ids[source.name] = schema_ids_of(pairs, shapes)
        return batch

    def _properties_reason(self, specs: list[TableSpec]) -> str | None:
        for spec in specs:
            table = load_table_or_none(self.catalog, spec.identifier)
            untaken = untaken_properties(table_properties(table, spec))
            if untaken:
                return f"table {spec.identifier} sets {', '.join(untaken)}"
        return None

    def _write(
        self,
        source: KafkaSource,
        plan: BatchPlan,
        seq: int,
        versions: list[VersionPlan],
        shapes: list[VersionShape],
        routes: Routes,
        tasks: list[TaskRange],
        pairs: list[tuple[str, int]],
        readers: dict[int, tuple[KeyReader, ...]],
    ) -> tuple[ArrowBatch, TaskFacts] | None:
        """Write every table the pairs name; None (nothing kept) when the batch needs
        `spark-sql`."""
        table_plans: list[TablePlan] = []
        schemas = {}
        locations = {}
        configured = {spec.identifier for spec in routes.tables}
        templated = [
            self.config.table(identifier)
            for route, _ in pairs
            for identifier in routes.fed_by(route)
            if identifier not in configured
        ]
        reason = (
            unsupported_reason(source, templated, [])
            or layout_reason(templated, self.config.writer.distribution)
            or self._properties_reason(templated)
        )
        if reason is not None:
            log_fallback_once(source, f"table_template: {reason}")
            return None
        for route, chosen in versions_by_table(pairs, shapes).items():
            for identifier in routes.fed_by(route):
                table_plan, schema, location = self._table_plan(
                    identifier, route, chosen, plan, seq
                )
                indexes = frozenset(index for name, index in pairs if name == route)
                table_plans.append(replace(table_plan, versions=indexes))
                schemas[identifier] = schema
                locations[identifier] = location
        output_dirs = [table_plan.output_uri for table_plan in table_plans]
        run_as: list[TaskRange] | list[TaskGroup] = tasks
        if any(table_plan.upsert for table_plan in table_plans):
            # A key's changes in one task, whole partitions per core (`upserts.py`).
            run_as = whole_partitions(tasks, self.spark.sparkContext.defaultParallelism)
        facts = self._run(source, versions, routes, table_plans, run_as, readers)
        if facts.errors.get("delete-without-key"):
            # A record key of a schema the writer has not learnt yet, or none at all:
            # `spark-sql` learns the one and dead-letters the other (`record_keys.py`).
            discard_output(output_dirs)
            log_fallback_once(source, "deletes without a before image whose key is not read")
            return None
        shared = {
            identifier: count
            for identifier, table_facts in facts.tables.items()
            if (count := table_facts.keys_in_two_ranges + shared_key_count(table_facts.key_hashes))
        }
        if shared:
            # A key in two Kafka partitions of the batch: `spark-sql` orders it by offset alone.
            discard_output(output_dirs)
            log_fallback_once(source, f"upsert keys in two Kafka partitions of a batch: {shared}")
            return None
        batch = ArrowBatch(
            facts.records,
            facts.errors,
            output_dirs=output_dirs,
            intake=_intake(facts, table_plans, routes),
        )
        for table_plan in table_plans:
            identifier = table_plan.identifier
            table_facts = facts.tables.get(identifier)
            if table_facts is None or not (table_facts.files or table_facts.deleted_keys_files):
                discard_output([table_plan.output_uri])
                continue
            progress = self.tables.setdefault(identifier, TableProgress())
            table = load_table_or_none(self.catalog, identifier)
            spec_id = table.spec().spec_id if table is not None else 0
            files = sorted(
                (written.entry(spec_id) for written in table_facts.files), key=lambda f: f.path
            )
            deleted_keys = sorted(
                (
                    written.entry(spec_id).model_copy(update={"content": "deleted-keys"})
                    for written in table_facts.deleted_keys_files
                ),
                key=lambda f: f.path,
            )
            written_bytes = sum(f.size_bytes for f in files + deleted_keys)
            progress.bytes_per_row = max(1.0, written_bytes / max(table_facts.rows, 1))
            rows_written = sum(f.record_count for f in files)  # upsert tables: one row per key
            ranges = offset_ranges(plan, identifier)
            batch.monikers.append(
                Moniker(
                    id=moniker_id(self.writer_id, identifier, ranges),
                    rereads_refused=True,
                    writer_id=self.writer_id,
                    seq=seq,
                    prev_seq=progress.last_seq,
                    table=identifier,
                    schema=json.loads(schemas[identifier].model_dump_json()),
                    files=files,
                    delete_files=deleted_keys,
                    offsets=ranges,
                    records=rows_written,
                    min_event_time_ms=table_facts.min_ms,
                    max_event_time_ms=table_facts.max_ms,
                    table_location=locations[identifier],
                )
            )
            batch.rows += rows_written
        return batch, facts

    def _table_plan(
        self,
        identifier: str,
        route: str,
        chosen: list[VersionShape],
        plan: BatchPlan,
        seq: int,
    ) -> tuple[TablePlan, Schema, str]:
        """How the tasks write `identifier`: its schema (ids agreeing with the table), its
        batch folder (claimed while it is filled) and file settings."""
        spec = self.config.table(identifier)
        table = load_table_or_none(self.catalog, identifier)
        columns = table_columns(chosen, self.config.metadata_columns)
        key_names = resolve_keys([c.name for c in columns], spec.primary_key)
        columns = [Column(c.name, c.type, c.name in key_names) for c in columns]
        schema = assign_ids(columns, table.metadata if table is not None else None, key_names)
        location = (
            table.location()
            if table is not None
            else default_table_location(self.config, identifier)
        )
        output = batch_folder(location, self.writer_id, seq)
        self.claims.claim(location, output)
        progress = self.tables.setdefault(identifier, TableProgress())
        max_records = max(
            1000, int(self.config.writer.target_file_size_bytes / max(progress.bytes_per_row, 1.0))
        )
        starts = {
            key: start
            for key, (read_start, _) in plan.read_ranges.items()
            if (start := plan.table_starts.get(identifier, {}).get(key, read_start)) > read_start
        }
        partition = table.spec() if table is not None else partition_spec(spec.partition_by, schema)
        table_plan = TablePlan(
            identifier,
            route,
            output,
            arrow_schema(schema),
            starts,
            max_records,
            writer_options(table_properties(table, spec)),
            tuple(partition_fields(partition, schema)),
            _upsert_plan(spec, key_names, schema, self.config),
        )
        return table_plan, schema, location

    def _run(
        self,
        source: KafkaSource,
        versions: list[VersionPlan],
        routes: Routes,
        table_plans: list[TablePlan],
        tasks: list[TaskRange] | list[TaskGroup],
        readers: dict[int, tuple[KeyReader, ...]] | None = None,
    ) -> TaskFacts:
        """Run the tasks on Spark and add up what they return."""
        task_plan = TaskPlan(
            source,
            versions,
            _route_claims(routes),
            _keyed_routes(routes),
            table_plans,
            self.config.metadata_columns,
            routes.template,
            readers or {},
        )
        if sum(t.records for t in tasks) <= self.config.writer.driver_batch_records:
            # A small batch: a Spark job's fixed cost would be most of its time (freshness).
            with ThreadPoolExecutor(max(1, min(len(tasks), os.cpu_count() or 1))) as pool:
                results = list(pool.map(lambda task: run_task(task_plan, task), tasks))
        else:
            results = (
                self.spark.sparkContext.parallelize(
                    [(task_plan, t) for t in tasks], max(1, len(tasks))
                )
                .map(lambda pair: run_task(*pair))
                .collect()
            )
        total = TaskFacts()
        for facts in results:
            total.records += facts.records
            total.errors.update(facts.errors)
            total.pairs.update(facts.pairs)
            total.accepted.update(facts.accepted)
            for identifier, table_facts in facts.tables.items():
                into = total.tables.setdefault(identifier, type(table_facts)())
                into.rows += table_facts.rows
                into.files.extend(table_facts.files)
                into.deleted_keys_files.extend(table_facts.deleted_keys_files)
                into.key_hashes.extend(table_facts.key_hashes)
                into.keys_in_two_ranges += table_facts.keys_in_two_ranges
                into.before_start += table_facts.before_start
                for bound, pick in (("min_ms", min), ("max_ms", max)):
                    ours, theirs = getattr(into, bound), getattr(table_facts, bound)
                    if theirs is not None:
                        setattr(into, bound, theirs if ours is None else pick(ours, theirs))
        return total


def _intake(facts: TaskFacts, table_plans: list[TablePlan], routes: Routes) -> BatchIntake:
    """The tasks' counts as the batch reconciles them: each record failed (by reason) or
    accepted by a route, and what each table took in."""
    tables = {}
    for table_plan in table_plans:
        table_facts = facts.tables.get(table_plan.identifier)
        tables[table_plan.identifier] = TableIntake(
            table_plan.route,
            table_facts.rows if table_facts is not None else 0,
            table_facts.before_start if table_facts is not None else 0,
        )
    return BatchIntake(
        records=facts.records,
        failed=sum(facts.errors.values()),
        tombstones=facts.errors.get(TOMBSTONE, 0),
        accepted=dict(facts.accepted),
        tables=tables,
        fed_by={route: tuple(routes.fed_by(route)) for route in facts.accepted},
        failed_by_reason=dict(facts.errors),
    )


def _upsert_plan(
    spec: TableSpec, key_names: list[str], schema: Schema, config: IcekeeperConfig
) -> UpsertPlan | None:
    """How the tasks keep one row per key of an upsert table (None for a changelog table)."""
    if not spec.upsert:
        return None
    op = op_column(config.metadata_columns)
    deletes = spec.delete_mode == "hard" and op in schema.column_names
    return UpsertPlan(tuple(key_names), op if deletes else None)


def _version_plan(
    index: int,
    schema: RegisteredSchema,
    shape: VersionShape,
    unchecked: dict[str, frozenset[str]],
) -> VersionPlan:
    return VersionPlan(
        index,
        schema.schema_id,
        schema.text,
        schema.resolved,
        shape.is_debezium,
        {column.name: column.semantic for column in shape.row},
        tuple(shape.source),
        tuple(shape.transaction),
        unchecked,
    )


def _route_claims(routes: Routes) -> list[RouteClaim]:
    """The routes' claims in `Routes.sql`'s order (a follower of a fan-out claims nothing)."""
    return [
        RouteClaim(spec.identifier, tuple(spec.topics), spec.source_db, spec.source_table)
        for spec in routes.claiming()
    ]


def _keyed_routes(routes: Routes) -> dict[str, tuple[str, ...]]:
    keyed: dict[str, tuple[str, ...]] = {}
    for spec in routes.tables:
        if spec.primary_key:
            route = routes.route_of(spec.identifier)
            keyed[route] = tuple(dict.fromkeys([*keyed.get(route, ()), *spec.primary_key]))
    return keyed

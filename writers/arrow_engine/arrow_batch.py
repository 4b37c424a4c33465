"""The arrow engine's driver: plan a source's batch as tasks, run them on Spark, add up their facts.

Spark stays the scheduler (tasks, retries, executors); each task runs `task.run_task` in a
Python worker and returns file facts. A small batch (`writer.driver_batch_records`) runs the
same task bodies in the driver's own threads: a Spark job costs 0.2-0.5 s whatever its size,
ten times the work of the few thousand records a low-latency writer reads per batch.

As on `spark-sql`, a table's columns come from the schema versions of its own records in the
batch: the (table, schema id) pairs of the source's last batch are the guess, checked against
the pairs the tasks count while writing; without a guess, or when it missed, a first pass counts
them (from the frames alone when routing is by topic). Each table's batch is planned by the core
(`writers/table_batch.py`), as for `spark-sql`; what the tasks wrote goes back to the core as
file facts (`writers/engines.py`), which builds the monikers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from pyiceberg.catalog import Catalog
from pyspark.sql import SparkSession

from icekeeper.common.arrow_parquet import untaken_properties, writer_options
from icekeeper.common.catalog import load_table_or_none, table_properties
from icekeeper.common.config.model import IcekeeperConfig, KafkaSource, TableSpec
from icekeeper.common.executor_env import ExecutorsLackPython, missing_executor_module
from icekeeper.common.moniker import FileEntry
from icekeeper.common.schema import envelope_shape
from icekeeper.writers.arrow_engine.arrow_flatten import VersionPlan, arrow_schema
from icekeeper.writers.arrow_engine.arrow_record_keys import KeyReader, key_readers
from icekeeper.writers.arrow_engine.arrow_upserts import shared_key_count, whole_partitions
from icekeeper.writers.arrow_engine.partitions import partition_fields
from icekeeper.writers.arrow_engine.support import layout_reason, unsupported_reason
from icekeeper.writers.arrow_engine.task import (
    TableFacts,
    TablePlan,
    TaskFacts,
    TaskPlan,
    run_task,
)
from icekeeper.writers.arrow_engine.task_ranges import TaskGroup, TaskRange, task_ranges
from icekeeper.writers.engines import EngineRefusal, EngineWrite, SourceBatch, WrittenTable
from icekeeper.writers.files import discard_output
from icekeeper.writers.key_columns import record_keys_for
from icekeeper.writers.reconciliation import TOMBSTONE, BatchIntake, TableIntake
from icekeeper.writers.registry import RegisteredSchema
from icekeeper.writers.routing import Routes
from icekeeper.writers.table_batch import TableBatch, TableBatches, TableFiles
from icekeeper.writers.table_versions import (
    only_pair,
    predicted_route_versions,
    schema_ids_of,
    versions_by_table,
)
from icekeeper.writers.version_shapes import (
    VersionShape,
    envelope_fields,
    shape_from_avro,
    skipped_envelope_fields,
    version_column,
)

log = logging.getLogger(__name__)


class ArrowEngine:
    """Writes sources' batches with Arrow-native Spark tasks for one writer."""

    def __init__(
        self,
        config: IcekeeperConfig,
        spark: SparkSession,
        catalog: Catalog,
        tables: TableBatches,
    ) -> None:
        self.config = config
        self.spark = spark
        self.catalog = catalog
        self.tables = tables
        self._route_schema_ids: dict[str, set[tuple[str, int]] | None] = {}

    def write(self, batch: SourceBatch) -> EngineWrite | EngineRefusal:
        """Write the batch's tables, or say why the batch must run on `spark-sql` (nothing kept)."""
        source, routes, schemas = batch.source, batch.routes, batch.schemas
        refusal = _refusal(
            ("unsupported-source", lambda: unsupported_reason(source, routes.tables, schemas)),
            ("layout", lambda: layout_reason(routes.tables, self.config.writer.distribution)),
            ("table-properties", lambda: self._properties_reason(routes.tables)),
        )
        if refusal is not None:
            return refusal
        shapes = [
            shape_from_avro(version_column(index), envelope_shape(s.resolved), s.schema_id)
            for index, s in enumerate(schemas)
        ]
        keep = envelope_fields(self.config.metadata_columns)
        versions = [
            _version_plan(index, s, shape, skipped_envelope_fields(s.text, keep))
            for index, (s, shape) in enumerate(zip(schemas, shapes, strict=True))
        ]
        tasks = task_ranges(batch.plan, self.spark.sparkContext.defaultParallelism)
        readers = key_readers(
            versions, record_keys_for(routes.tables, batch.key_schemas), batch.key_schemas
        )
        predicted = predicted_route_versions(
            self._route_schema_ids.get(source.name), shapes
        ) or only_pair(routes, shapes)
        if predicted is None:
            learned = self._run(source, versions, routes, [], tasks)
            pairs = sorted(learned.pairs)
        else:
            pairs = predicted
        written = self._write(batch, versions, shapes, tasks, pairs, readers)
        if isinstance(written, EngineRefusal):
            return written
        engine_write, facts = written
        if predicted is not None and sorted(facts.pairs) != predicted:
            # The guess missed (a new table or schema version): write again with what was counted.
            discard_output(engine_write.output_dirs)
            pairs = sorted(facts.pairs)
            written = self._write(batch, versions, shapes, tasks, pairs, readers)
            if isinstance(written, EngineRefusal):
                return written
            engine_write, facts = written
        self._route_schema_ids[source.name] = schema_ids_of(pairs, shapes)
        return engine_write

    def _properties_reason(self, specs: list[TableSpec]) -> str | None:
        for spec in specs:
            table = load_table_or_none(self.catalog, spec.identifier)
            untaken = untaken_properties(table_properties(table, spec))
            if untaken:
                return f"table {spec.identifier} sets {', '.join(untaken)}"
        return None

    def _write(
        self,
        batch: SourceBatch,
        versions: list[VersionPlan],
        shapes: list[VersionShape],
        tasks: list[TaskRange],
        pairs: list[tuple[str, int]],
        readers: dict[int, tuple[KeyReader, ...]],
    ) -> tuple[EngineWrite, TaskFacts] | EngineRefusal:
        """Write every table the pairs name; a refusal (nothing kept) when the batch needs
        `spark-sql`."""
        source, routes = batch.source, batch.routes
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
            return EngineRefusal(f"table_template: {reason}", "table-template")
        table_batches: list[TableBatch] = []
        table_plans: list[TablePlan] = []
        for route, chosen in versions_by_table(pairs, shapes).items():
            for identifier in routes.fed_by(route):
                table_batch = self.tables.plan(batch.plan, batch.seq, identifier, route, chosen)
                indexes = frozenset(index for name, index in pairs if name == route)
                table_batches.append(table_batch)
                table_plans.append(replace(_table_plan(table_batch), versions=indexes))
        output_dirs = [table_batch.output_uri for table_batch in table_batches]
        run_as: list[TaskRange] | list[TaskGroup] = tasks
        if any(table_plan.upsert for table_plan in table_plans):
            # A key's changes in one task, whole partitions per core (`arrow_upserts.py`).
            run_as = whole_partitions(tasks, self.spark.sparkContext.defaultParallelism)
        facts = self._run(source, versions, routes, table_plans, run_as, readers)
        if facts.errors.get("delete-without-key"):
            # A record key of a schema the writer has not learnt yet, or none at all:
            # `spark-sql` learns the one and dead-letters the other (`arrow_record_keys.py`).
            discard_output(output_dirs)
            return EngineRefusal(
                "deletes without a before image whose key is not read", "delete-key-unread"
            )
        shared = {
            identifier: count
            for identifier, table_facts in facts.tables.items()
            if (count := table_facts.keys_in_two_ranges + shared_key_count(table_facts.key_hashes))
        }
        if shared:
            # A key in two Kafka partitions of the batch: `spark-sql` orders it by offset alone.
            discard_output(output_dirs)
            return EngineRefusal(
                f"upsert keys in two Kafka partitions of a batch: {shared}",
                "upsert-key-in-two-partitions",
            )
        written = EngineWrite(
            facts.records,
            _intake(facts, table_plans, routes),
            [
                WrittenTable(tb, _table_files(tb, facts.tables.get(tb.identifier)))
                for tb in table_batches
            ],
            output_dirs,
        )
        return written, facts

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
            routes.claims(),
            routes.keyed_routes(),
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
            try:
                results = (
                    self.spark.sparkContext.parallelize(
                        [(task_plan, t) for t in tasks], max(1, len(tasks))
                    )
                    .map(lambda pair: run_task(*pair))
                    .collect()
                )
            except Exception as failure:  # Py4JJavaError: the executors' tracebacks as text
                module = missing_executor_module(str(failure))
                if module is None:
                    raise
                # Not a batch's fault, and no retry will help: the cluster's Python is not ours.
                raise ExecutorsLackPython(module) from None
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


def _table_plan(table_batch: TableBatch) -> TablePlan:
    """How the tasks write a table's batch: its Arrow schema, Parquet options and partitions."""
    return TablePlan(
        table_batch.identifier,
        table_batch.route,
        table_batch.output_uri,
        arrow_schema(table_batch.schema),
        table_batch.starts,
        table_batch.max_records_per_file,
        writer_options(table_batch.properties),
        tuple(partition_fields(table_batch.partition_spec, table_batch.schema)),
        table_batch.upsert,
    )


def _table_files(table_batch: TableBatch, table_facts: TableFacts | None) -> TableFiles:
    """The tasks' facts of a table as the core's file facts (files in path order)."""
    if table_facts is None:
        return TableFiles([])
    spec_id = table_batch.partition_spec.spec_id
    files = sorted((written.entry(spec_id) for written in table_facts.files), key=lambda f: f.path)
    deleted_keys: list[FileEntry] = sorted(
        (
            written.entry(spec_id).model_copy(update={"content": "deleted-keys"})
            for written in table_facts.deleted_keys_files
        ),
        key=lambda f: f.path,
    )
    return TableFiles(files, deleted_keys, table_facts.rows, table_facts.min_ms, table_facts.max_ms)


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


def _refusal(*checks: tuple[str, Callable[[], str | None]]) -> EngineRefusal | None:
    """The first check that finds a reason, as a refusal of its kind; the later ones are not run
    (the table properties' check loads the tables)."""
    for kind, check in checks:
        if (reason := check()) is not None:
            return EngineRefusal(reason, kind)
    return None

"""One arrow-engine task: read a range, decode, route, flatten, write; return file facts only.

This runs in a Spark executor's Python worker. The records are classified as the `spark-sql`
engine classifies them, in the same order of reasons: `tombstone`, `bad-magic-byte`,
`unknown-schema-id`, `undecodable-avro`, `invalid-utf8`, `unroutable`, `missing-key` /
`delete-without-key`, `unconvertible-value`. Only counts leave the task, never a record: the
dead letters themselves are found by the dead-letter pass (`spark_sql_engine/rejected_records.py`),
which the batch runs only when something failed; the batch reconciles the two before it
publishes anything (`writers/reconciliation.py`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icekeeper.common.arrow_parquet import WrittenFile, write_files
from icekeeper.common.collector import gc_paused
from icekeeper.common.config.model import KafkaSource, MetadataColumns
from icekeeper.common.storage import StorageSettings, configure_storage, storage_settings
from icekeeper.writers.arrow_engine.arrow_flatten import (
    VersionPlan,
    VersionRows,
    row_image,
    table_rows,
)
from icekeeper.writers.arrow_engine.arrow_record_keys import KeyReader, with_record_keys
from icekeeper.writers.arrow_engine.arrow_upserts import key_hashes, last_changes
from icekeeper.writers.arrow_engine.avro_block import SchemaDecoder
from icekeeper.writers.arrow_engine.kafka_read import read_range
from icekeeper.writers.arrow_engine.partitions import PartitionField, split_by_partition
from icekeeper.writers.arrow_engine.task_ranges import TaskGroup, TaskRange
from icekeeper.writers.arrow_engine.templates import template_routes, topic_template_route
from icekeeper.writers.confluent_frame import frame_prefix
from icekeeper.writers.files import DELETED_FOLDER, LIVE_FOLDER
from icekeeper.writers.key_columns import UpsertRule
from icekeeper.writers.routing import RouteClaim


@dataclass(frozen=True)
class TablePlan:
    """One table the tasks write: its route's records, flattened into `schema`."""

    identifier: str
    route: str
    output_uri: str
    schema: pa.Schema
    starts: dict[tuple[str, int], int]
    """Offsets before which this table already has the records (`BatchPlan.table_starts`)."""
    max_records_per_file: int
    parquet_options: dict[str, object]
    partition_fields: tuple[PartitionField, ...] = ()
    """The table's partition spec: each task writes one file set per partition value."""
    upsert: UpsertRule | None = None
    """Upsert tables: how the task keeps each key's last change (`arrow_upserts.py`)."""
    versions: frozenset[int] | None = None
    """The schema versions `schema` was planned from (None: any). A record of another version
    (the driver's guess missed it) is counted, not written: its values may not fit `schema`,
    and the driver writes the batch again with the versions the tasks counted."""


@dataclass(frozen=True)
class TaskPlan:
    """What every task of a batch gets."""

    source: KafkaSource
    versions: list[VersionPlan]
    claims: list[RouteClaim]
    keyed_routes: dict[str, tuple[str, ...]]
    """Route -> primary-key columns of a table it feeds (`missing-key` is checked for them:
    `Routes.keyed_routes`)."""
    tables: list[TablePlan]
    metadata: MetadataColumns
    template: str | None = None
    """The source's `table_template`: the route of records no claim holds."""
    record_keys: dict[int, tuple[KeyReader, ...]] = field(default_factory=dict)
    """Version index -> how its deletes without `before` read their record key
    (`arrow_record_keys.py`)."""
    storage: StorageSettings = field(default_factory=storage_settings)
    """The driver's storage door settings: an executor's Python worker configures its own with
    them before it writes (it never loaded the config)."""


@dataclass
class TableFacts:
    rows: int = 0
    min_ms: int | None = None
    max_ms: int | None = None
    files: list[WrittenFile] = field(default_factory=list)
    deleted_keys_files: list[WrittenFile] = field(default_factory=list)
    """Upsert tables: files of the keys whose last change deletes them."""
    key_hashes: list[np.ndarray] = field(default_factory=list)
    """Upsert tables: each task's key hashes (`arrow_upserts.key_hashes`), checked for overlap."""
    keys_in_two_ranges: int = 0
    """Upsert tables: keys a task read in two of its Kafka ranges (`arrow_upserts.LastChanges`)."""
    before_start: int = 0
    """Accepted records of the table's route before its own start (`TablePlan.starts`), counted
    apart from `rows` so that the batch can reconcile (`writers/reconciliation.py`)."""


@dataclass
class TaskFacts:
    """What a task returns to the driver."""

    records: int = 0
    errors: Counter = field(default_factory=Counter)
    pairs: Counter = field(default_factory=Counter)
    """(route, version index) -> records, as `spark-sql` counts them
    (`sql_table_versions.route_versions`)."""
    accepted: Counter = field(default_factory=Counter)
    """Route -> records decoded and routed without error (`writers/reconciliation.py`)."""
    tables: dict[str, TableFacts] = field(default_factory=dict)


def run_task(plan: TaskPlan, task: TaskRange | TaskGroup) -> TaskFacts:
    """The task's body (see the module docstring); a group's ranges are read one after the
    other and written together."""
    configure_storage(plan.storage)
    group = task if isinstance(task, TaskGroup) else TaskGroup(task.index, (task,))
    facts = TaskFacts()
    pieces: dict[str, list[_Piece]] = {t.identifier: [] for t in plan.tables}
    with gc_paused():
        for task_range in group.ranges:
            _read_pieces(plan, task_range, facts, pieces)
        for table in plan.tables:
            _write_table(table, group, pieces[table.identifier], facts)
    return facts


def _read_pieces(
    plan: TaskPlan, task: TaskRange, facts: TaskFacts, pieces: dict[str, list[_Piece]]
) -> None:
    """Read one range: count its records and errors, add each table's rows to `pieces`."""
    needs_keys = any(
        plan.metadata.kafka.prefix + "key" == name for t in plan.tables for name in t.schema.names
    )
    raw = read_range(plan.source, task, with_keys=needs_keys or bool(plan.record_keys))
    facts.records += len(raw.values)
    chosen_by_version = _frames(plan, raw.values, facts)
    if (
        not plan.tables
        and plan.template is None
        and all(c.source_db is None and c.source_table is None for c in plan.claims)
    ):
        # Learning which versions feed which table, routed by topic: the frames say it all.
        route = _topic_route(plan, task.topic)
        for index, chosen in chosen_by_version.items():
            if route is not None:
                facts.pairs[(route, index)] += len(chosen)
        return
    for version in plan.versions:
        chosen = chosen_by_version.get(version.index)
        if chosen is None:
            continue
        decoder = SchemaDecoder.of(version.schema_text, version.resolved, version.unchecked)
        decoded, failed = decoder.decode(raw.values.take(chosen))
        decoded = decoded.combine_chunks()
        if failed:
            facts.errors.update(failed.values())
            route = _topic_route(plan, task.topic)
            if route is not None:
                facts.pairs[(route, version.index)] += len(failed)
            lost = set(failed)
            chosen = pa.array([p for i, p in enumerate(chosen.to_pylist()) if i not in lost])
        if len(chosen) == 0:
            continue
        if version.index in plan.record_keys:
            record_keys = pa.array(raw.keys, pa.binary()).take(chosen)
            decoded = with_record_keys(decoded, record_keys, plan.record_keys[version.index])
        rows = VersionRows(
            version,
            decoded,
            task.topic,
            task.partition,
            raw.offsets.take(chosen),
            raw.timestamps_ms.take(chosen),
            pa.array(raw.keys, pa.binary()).take(chosen) if needs_keys else pa.nulls(0),
        )
        _classify_and_route(plan, rows, facts, pieces)


def _frames(plan: TaskPlan, values: pa.BinaryArray, facts: TaskFacts) -> dict[int, pa.Array]:
    """Positions of each version's records, by the 5-byte frame; counts the records that have
    no frame of a known schema (`tombstone`, `bad-magic-byte`, `unknown-schema-id`)."""
    tombstones = values.null_count
    framed = pc.and_(
        pc.greater_equal(pc.binary_length(values), 5),
        pc.equal(pc.binary_slice(values, 0, 1), b"\x00"),
    )
    framed = pc.fill_null(framed, False)
    prefixes = pc.binary_slice(values, 0, 5)
    chosen: dict[int, pa.Array] = {}
    known = 0
    for version in plan.versions:
        mine = pc.fill_null(pc.equal(prefixes, frame_prefix(version.schema_id)), False)
        positions = pc.indices_nonzero(mine)
        if len(positions):
            chosen[version.index] = positions
            known += len(positions)
    framed_count = pc.sum(framed).as_py() or 0
    for reason, count in (
        ("tombstone", tombstones),
        ("bad-magic-byte", len(values) - tombstones - framed_count),
        ("unknown-schema-id", framed_count - known),
    ):
        if count:
            facts.errors[reason] += count
    return chosen


def _topic_route(plan: TaskPlan, topic: str) -> str | None:
    """The route of a record that did not decode: claims on its topic alone can hold."""
    for claim in plan.claims:
        if claim.source_db is None and claim.source_table is None and topic in claim.topics:
            return claim.route
    return topic_template_route(plan.template, topic) if plan.template else None


def _routes(plan: TaskPlan, rows: VersionRows) -> pa.Array:
    count = len(rows.offsets)
    route = pa.nulls(count, pa.string())
    for claim in plan.claims:
        if claim.topics and rows.topic not in claim.topics:
            continue
        holds = pa.array([True] * count)
        for name, wanted in (("db", claim.source_db), ("table", claim.source_table)):
            if wanted is not None:
                actual = rows.source_field(name)
                equal = (
                    pc.equal(pc.cast(actual, pa.string()), wanted)
                    if actual is not None
                    else pa.nulls(count, pa.bool_())
                )
                holds = pc.and_kleene(holds, pc.fill_null(equal, False))
        route = pc.if_else(pc.and_(holds, pc.is_null(route)), claim.route, route)
    if plan.template:
        route = pc.coalesce(route, template_routes(plan.template, rows))
    return route


@dataclass(frozen=True)
class _Piece:
    """One version's rows of a table in a task, with their event times and Kafka offsets."""

    rows: pa.Table
    event_ms: pa.Array
    offsets: pa.Array
    source: tuple[str, int]
    """The Kafka topic-partition of the rows."""


def _classify_and_route(
    plan: TaskPlan, rows: VersionRows, facts: TaskFacts, pieces: dict[str, list[_Piece]]
) -> None:
    """Count the version's failed records by reason and its routed pairs; add each table's rows."""
    version = rows.version
    count = len(rows.offsets)
    route = _routes(plan, rows)
    for name, routed in _counts(route).items():
        facts.pairs[(name, version.index)] += routed
    row_columns, unconvertible = rows.converted_row()
    error = pc.if_else(pc.is_null(route), "unroutable", pa.nulls(count, pa.string()))
    for keyed_route, key_columns in plan.keyed_routes.items():
        missing = _any_key_null(rows, key_columns)
        if missing is None:
            continue
        if version.is_debezium:
            without_before = pc.and_(
                pc.equal(rows.envelope("op"), "d"), pc.is_null(rows.envelope("before"))
            )
            reason = pc.if_else(without_before, "delete-without-key", "missing-key")
        else:
            reason = pa.array(["missing-key"] * count)
        here = pc.and_(pc.fill_null(pc.equal(route, keyed_route), False), missing)
        error = pc.if_else(pc.and_(here, pc.is_null(error)), reason, error)
    if unconvertible is not None:
        hit = pc.and_(pc.fill_null(unconvertible, False), pc.is_null(error))
        error = pc.if_else(hit, "unconvertible-value", error)
    facts.errors.update(_counts(error))
    ok = pc.is_null(error)
    facts.accepted.update(_counts(pc.if_else(ok, route, pa.nulls(count, pa.string()))))
    source_ms = rows.source_field("ts_ms")
    kafka_ms = rows.timestamps_ms
    events = (
        kafka_ms if source_ms is None else pc.coalesce(pc.cast(source_ms, pa.int64()), kafka_ms)
    )
    for table in plan.tables:
        start = table.starts.get((rows.topic, rows.partition))
        keep = pc.and_(ok, pc.fill_null(pc.equal(route, table.route), False))
        if start is not None:
            before = pc.sum(pc.and_(keep, pc.less(rows.offsets, start))).as_py()
            if before:
                facts.tables.setdefault(table.identifier, TableFacts()).before_start += before
            keep = pc.and_(keep, pc.greater_equal(rows.offsets, start))
        if table.versions is not None and version.index not in table.versions:
            continue
        if not pc.any(keep).as_py():
            continue
        if pc.all(keep).as_py():
            selected, selected_columns, selected_ms = rows, row_columns, events
        else:
            selected = _filtered(rows, keep)
            selected_columns = {name: value.filter(keep) for name, value in row_columns.items()}
            selected_ms = events.filter(keep)
        flat = table_rows(selected, selected_columns, table.schema, plan.metadata)
        pieces[table.identifier].append(
            _Piece(flat, selected_ms, selected.offsets, (rows.topic, rows.partition))
        )


def _counts(values: pa.Array) -> dict[str, int]:
    """How often each non-null value occurs (Arrow's count, not a Python loop over records)."""
    if values.null_count == len(values):
        return {}
    counted = pc.value_counts(values.drop_null())
    return dict(
        zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist(), strict=True)
    )


def _any_key_null(rows: VersionRows, key_columns: tuple[str, ...]) -> pa.Array | None:
    """True where a key column is null in the record's row (or its version has no such column),
    as `spark-sql` decides (`sql_routing.routed_rows`)."""
    names = list(rows.version.row_semantics)
    result = None
    for key in key_columns:
        name = key if key in names else next((n for n in names if n.lower() == key.lower()), None)
        if name is None:
            return pa.array([True] * len(rows.offsets))
        null = pc.is_null(row_image(rows.decoded, rows.version, name))
        result = null if result is None else pc.or_(result, null)
    return result


def _filtered(rows: VersionRows, keep: pa.Array) -> VersionRows:
    return VersionRows(
        rows.version,
        rows.decoded.filter(keep),
        rows.topic,
        rows.partition,
        rows.offsets.filter(keep),
        rows.timestamps_ms.filter(keep),
        rows.keys.filter(keep) if len(rows.keys) else rows.keys,
    )


def _write_table(table: TablePlan, task: TaskGroup, pieces: list[_Piece], facts: TaskFacts) -> None:
    if not pieces:
        return
    rows = pa.concat_tables([piece.rows for piece in pieces])
    sources = list(dict.fromkeys(piece.source for piece in pieces))
    ranges = None
    if len(sources) > 1:
        # Each row's range in the task: range by range, as read (a group's whole partitions).
        ranges = pa.array(
            np.repeat(
                [sources.index(piece.source) for piece in pieces],
                [piece.rows.num_rows for piece in pieces],
            ),
            pa.int32(),
        )
    if len(pieces) > len(sources):
        # Several versions in one range: back into Kafka order, as the `spark-sql` engine writes.
        offsets = pa.concat_arrays([piece.offsets for piece in pieces])
        if ranges is None:
            order = pc.sort_indices(offsets)
        else:
            order = pc.sort_indices(
                pa.table({"range": ranges, "offset": offsets}),
                sort_keys=[("range", "ascending"), ("offset", "ascending")],
            )
        rows, ranges = rows.take(order), None if ranges is None else ranges.take(order)
    events = pa.chunked_array([piece.event_ms for piece in pieces])
    table_facts = facts.tables.setdefault(table.identifier, TableFacts())
    table_facts.rows += rows.num_rows
    low, high = pc.min_max(events).values()
    if low.as_py() is not None:
        table_facts.min_ms = low.as_py()
        table_facts.max_ms = high.as_py()
    if table.upsert is None:
        table_facts.files.extend(_write_parts(table, task, rows))
        return
    last = last_changes(rows, table.upsert, ranges)
    table_facts.keys_in_two_ranges += last.keys_in_two_ranges
    table_facts.files.extend(_write_parts(table, task, last.live, LIVE_FOLDER))
    table_facts.deleted_keys_files.extend(_write_parts(table, task, last.deleted, DELETED_FOLDER))
    kept = pa.concat_tables([last.live, last.deleted])
    table_facts.key_hashes.append(key_hashes(kept, table.upsert.key_columns))


def _write_parts(
    table: TablePlan, task: TaskGroup, rows: pa.Table, folder: str = ""
) -> list[WrittenFile]:
    """`rows` as files of each partition value, under `folder` of the batch folder."""
    written = []
    for part in split_by_partition(rows, list(table.partition_fields)):
        written.extend(
            write_files(
                part.rows,
                table.output_uri,
                task.index,
                table.max_records_per_file,
                table.parquet_options,
                "/".join(name for name in (folder, part.folder) if name),
                part.values,
            )
        )
    return written

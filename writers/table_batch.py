"""One table's share of a batch: its plan, which either engine writes, and its moniker.

Both engines write a table's rows of a batch the same way, so what they write to is decided once,
here (`TableBatches.plan`): the table's schema (the columns of the schema versions of its own
records in the batch, with field ids agreeing with the table: `table_schema`), its location and a
batch folder of its own under it (claimed while it is filled, so orphan removal leaves it alone),
how many records a file holds (from the bytes per row the table's last files had), its partition
spec and Parquet properties, how an upsert table keeps each key's last change, and where the
table's own start lies past the batch's read start (`BatchPlan.table_starts`).

The engine returns the files it wrote (`TableFiles`), and the moniker describing them is built
here too, the one place a writer makes a moniker (`table_moniker`): for a batch's files, and for
the offsets a table must learn although the batch gave it no row (`offset_only_monikers`). The
moniker is returned, never published here: the batch publishes it once all its tables' files are
written and its dead letters sent.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata

from icekeeper.common.catalog import default_table_location, load_table_or_none, table_properties
from icekeeper.common.config.model import IcekeeperConfig, MetadataColumns
from icekeeper.common.in_flight import InFlightClaims
from icekeeper.common.moniker import FileEntry, Moniker, OffsetRange, moniker_id
from icekeeper.common.partitioning import partition_spec
from icekeeper.common.schema import Column, assign_ids, op_column
from icekeeper.writers.files import batch_folder
from icekeeper.writers.key_columns import UpsertRule, resolve_keys
from icekeeper.writers.offsets import BatchPlan
from icekeeper.writers.offsets import TopicPartition as TP
from icekeeper.writers.progress import TableProgress
from icekeeper.writers.version_shapes import VersionShape, table_columns


@dataclass(frozen=True)
class TableBatch:
    """Where and how an engine writes one table's rows of a batch."""

    identifier: str
    route: str
    """The route whose records the table gets (`Routes.route_of`)."""
    versions: tuple[VersionShape, ...]
    """The schema versions of the table's records in the batch, which `schema` was planned from."""
    schema: Schema
    """The rows' columns, field ids agreeing with the table (`table_schema`)."""
    location: str
    output_uri: str
    """The batch folder, claimed while it is filled (`files.batch_folder`)."""
    max_records_per_file: int
    partition_spec: PartitionSpec
    properties: dict[str, str]
    """The table's properties (or those the bookkeeper will create it with): Parquet settings."""
    upsert: UpsertRule | None
    """Upsert tables: how each key's last change is kept; None for a changelog table."""
    starts: dict[TP, int] = field(default_factory=dict)
    """Topic-partitions where the table's own start lies past the batch's read start: the
    table has the records before it already (`table_starts`)."""


@dataclass(frozen=True)
class TableFiles:
    """What an engine wrote of one table's batch."""

    files: list[FileEntry]
    deleted_keys: list[FileEntry] = field(default_factory=list)
    """Upsert tables: files of the keys whose last change deletes them (content `deleted-keys`)."""
    rows: int = 0
    """Rows the table took in (an upsert table's before it kept each key's last change)."""
    min_ms: int | None = None
    max_ms: int | None = None
    """The rows' event times (Debezium's `source.ts_ms`, else the Kafka timestamp)."""


def table_schema(
    versions: Sequence[VersionShape],
    metadata: MetadataColumns,
    table: TableMetadata | None,
    primary_key: list[str],
) -> Schema:
    """The schema a table's rows are written with: its versions' columns (`table_columns`), the
    key columns marked, ids from `table`'s metadata (`assign_ids`: its current schema's by name,
    new ones after its last-column-id)."""
    columns = table_columns(list(versions), metadata)
    key_names = resolve_keys([c.name for c in columns], primary_key)
    columns = [Column(c.name, c.type, c.name in key_names) for c in columns]
    return assign_ids(columns, table, key_names)


def table_starts(plan: BatchPlan, identifier: str) -> dict[TP, int]:
    """The topic-partitions where `identifier`'s own start lies past the batch's read start,
    in read order, with that start."""
    return {
        key: start
        for key, (read_start, _) in plan.read_ranges.items()
        if (start := plan.table_starts.get(identifier, {}).get(key, read_start)) > read_start
    }


class TableBatches:
    """Plans tables' batches for one writer, and builds their monikers."""

    def __init__(
        self,
        config: IcekeeperConfig,
        catalog: Catalog,
        writer_id: str,
        claims: InFlightClaims,
        tables: dict[str, TableProgress],
    ) -> None:
        """
        Args:
            tables: the writer's progress per table: gives a moniker its `prev_seq`, and learns
                each table's bytes per row (which sizes its files).
        """
        self.config = config
        self.catalog = catalog
        self.writer_id = writer_id
        self.claims = claims
        self.tables = tables

    def plan(
        self,
        plan: BatchPlan,
        seq: int,
        identifier: str,
        route: str,
        versions: Sequence[VersionShape],
    ) -> TableBatch:
        """Plan `identifier`'s share of batch `seq` and claim its batch folder.

        Raises:
            ValueError: a primary-key column of the table is not among its columns.
        """
        spec = self.config.table(identifier)
        table = load_table_or_none(self.catalog, identifier)
        schema = table_schema(
            versions,
            self.config.metadata_columns,
            table.metadata if table is not None else None,
            spec.primary_key,
        )
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
        upsert = None
        if spec.upsert:
            op = op_column(self.config.metadata_columns)
            deletes = spec.delete_mode == "hard" and op in schema.column_names
            upsert = UpsertRule(
                tuple(resolve_keys(schema.column_names, spec.primary_key)), op if deletes else None
            )
        return TableBatch(
            identifier=identifier,
            route=route,
            versions=tuple(versions),
            schema=schema,
            location=location,
            output_uri=output,
            max_records_per_file=max_records,
            partition_spec=(
                table.spec() if table is not None else partition_spec(spec.partition_by, schema)
            ),
            properties=table_properties(table, spec),
            upsert=upsert,
            starts=table_starts(plan, identifier),
        )

    def moniker(
        self, table_batch: TableBatch, plan: BatchPlan, seq: int, written: TableFiles
    ) -> Moniker | None:
        """The moniker of what an engine wrote of `table_batch`; None when it wrote no file.
        Notes the table's bytes per row, which sizes its next batch's files."""
        if not written.files and not written.deleted_keys:
            return None
        progress = self.tables.setdefault(table_batch.identifier, TableProgress())
        written_bytes = sum(f.size_bytes for f in written.files + written.deleted_keys)
        progress.bytes_per_row = max(1.0, written_bytes / max(written.rows, 1))
        return table_moniker(
            self.writer_id,
            seq,
            progress.last_seq,
            table_batch.identifier,
            table_batch.schema,
            table_batch.location,
            plan,
            written,
        )


def table_moniker(
    writer_id: str,
    seq: int,
    prev_seq: int | None,
    identifier: str,
    schema: Schema,
    location: str,
    plan: BatchPlan,
    written: TableFiles | None = None,
) -> Moniker:
    """The moniker of `identifier`'s share of batch `seq`: its offsets in the batch
    (`offset_ranges`) and the files `written` (none: the offsets alone). Its `records` are the
    data files' rows (an upsert table's: one per key)."""
    written = written or TableFiles([])
    ranges = offset_ranges(plan, identifier)
    return Moniker(
        id=moniker_id(writer_id, identifier, ranges),
        rereads_refused=True,
        writer_id=writer_id,
        seq=seq,
        prev_seq=prev_seq,
        table=identifier,
        schema=json.loads(schema.model_dump_json()),
        files=written.files,
        delete_files=written.deleted_keys,
        offsets=ranges,
        records=sum(f.record_count for f in written.files),
        min_event_time_ms=written.min_ms,
        max_event_time_ms=written.max_ms,
        table_location=location,
    )


def offset_only_monikers(
    catalog: Catalog,
    writer_id: str,
    plan: BatchPlan,
    seq: int,
    written: list[Moniker],
    tables: dict[str, TableProgress],
) -> list[Moniker]:
    """Monikers without files for the tables whose offsets must reach the table although they
    got no row of this batch (`written` has none of theirs):
    - a table that starts a partition over on a recreated topic: the restart is in the offsets,
      which the table's committed ones must take, else the next batch would find them beyond the
      partition's end and start over again;
    - a table that refused this writer's monikers (`TableProgress.rereading`): the writer read
      the refused offsets again, and the table must learn that it did, else every batch would
      read them again."""
    monikers = []
    rereading = {
        identifier
        for identifier in set(plan.table_starts) - {"*"}  # this source's tables only
        if identifier in tables and tables[identifier].rereading
    }
    for identifier in sorted(
        (set(plan.restarted) | rereading) - {m.table for m in written} - {"*"}
    ):
        table = load_table_or_none(catalog, identifier)
        if table is None or not offset_ranges(plan, identifier):
            continue  # nothing committed to start over from
        monikers.append(
            table_moniker(
                writer_id,
                seq,
                tables.setdefault(identifier, TableProgress()).last_seq,
                identifier,
                table.schema(),
                table.location(),
                plan,
            )
        )
    return monikers


def offset_ranges(plan: BatchPlan, identifier: str) -> list[OffsetRange]:
    """The offsets a moniker of `identifier` covers:
    its own span of each partition the batch read."""
    return [
        OffsetRange(
            topic=topic,
            partition=partition,
            from_offset=start,
            until_offset=until,
            topic_reset=True if (topic, partition) in plan.restarted.get(identifier, ()) else None,
        )
        for (topic, partition) in sorted(plan.read_ranges)
        if (span := plan.table_range(identifier, (topic, partition))) is not None
        for start, until in [span]
    ]

"""Purge an upsert table's mostly-deleted data files right after the bookkeeper commits to it.

Copy-on-write for the files that are mostly deleted: the live rows of the files `purge_plan.py`
chooses (the key index says which rows those are) are copied into new files, and one `replace`
snapshot swaps the new files in and the old ones out, with the delete files that only concern them.
Readers between two reaper passes then read about one row per key instead of every version of it.

The hand-off is the reaper's (`common/rewrites.py`): the new files are written under the request's
own folder, the request is published, and only then committed by the bookkeeper's
`RewriteCommitter`, which checks the rows against the key index once more and moves the index to
the new files. A bookkeeper that dies between publishing and committing leaves the request to its
successor, which commits it (deleting again any row updated meanwhile) or refuses it; a purge
never deletes anything itself before its commit is durable (the replaced files go with snapshot
expiry, as any replaced file), and a refused purge's own new files are deleted at once.

A purge is maintenance: the data commit before it is durable and acknowledged, and a purge that
fails (a file storage cannot serve, a refusal) only leaves the files for a later cycle.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from icekeeper.bookkeeper.purge_plan import FileLiveness, PurgeGroup, PurgePlan, plan_purge
from icekeeper.bookkeeper.rewrites import RewriteCommitter
from icekeeper.bookkeeper.table_key_indexes import TableKeyIndexes, live_files
from icekeeper.common.arrow_parquet import write_files, writer_options
from icekeeper.common.config.model import BookkeeperConfig
from icekeeper.common.delete_files import single_target
from icekeeper.common.moniker import FileEntry
from icekeeper.common.rewrites import RewriteRequest, is_pending, output_folder, publish_rewrite
from icekeeper.common.storage import delete_folder, open_filesystem

log = logging.getLogger(__name__)

FIELD_ID = b"PARQUET:field_id"


class PurgeSkipped(Exception):
    """A data file that cannot be purged as it is (its rows or columns are not what the table and
    the index say); the others of its purge go on."""


@dataclass
class PurgeOutcome:
    """What one purge of one table did."""

    files_replaced: int = 0
    files_written: int = 0
    rows_moved: int = 0
    """Live rows copied into the new files."""
    rows_dropped: int = 0
    """Deleted rows readers no longer read."""
    bytes_read: int = 0
    bytes_written: int = 0
    deferred: int = 0
    """Files that qualify but wait for a later cycle (budget)."""
    snapshot_id: int | None = None
    refused: str | None = None
    set_aside: str | None = None
    """Why an earlier purge's request was set aside (`RewriteCommitter`): its files missing."""
    skipped: str | None = None
    seconds: float = 0.0


class Purger:
    """Purges mostly-deleted data files of the upsert tables one bookkeeper commits to."""

    def __init__(
        self,
        catalog: Catalog,
        rewrites: RewriteCommitter,
        key_indexes: TableKeyIndexes,
        settings: BookkeeperConfig,
        workers: int,
    ) -> None:
        """`rewrites` commits the purges' requests; `key_indexes` says which rows are live."""
        self.catalog = catalog
        self.rewrites = rewrites
        self.key_indexes = key_indexes
        self.settings = settings
        self._workers = max(1, workers)
        self._unfinished: dict[str, RewriteRequest] = {}
        """Per table, a published purge whose commit failed (storage, conflicts): committed before
        any new purge of the table, so two requests never replace the same files."""

    def purge(self, identifier: str) -> PurgeOutcome:
        """Purge what `plan_purge` chooses in table `identifier` as it is now, and commit it.

        Raises what storage or the catalog raise (the caller counts it and tries again later);
        `StaleEpoch` when a newer bookkeeper committed the table."""
        started = time.monotonic()
        outcome = PurgeOutcome()
        # As the commit just made left it, where the catalog answers a commit with the new
        # metadata (REST): a purge planned on a stale table is refused at its commit.
        table = self.rewrites.commit_path.current_table(identifier) or self.catalog.load_table(
            identifier
        )
        unfinished = self._unfinished.pop(identifier, None)
        if unfinished is not None:
            # Committed or refused by the poll for pending rewrites meanwhile, if no longer pending.
            if is_pending(table.location(), unfinished.id):
                outcome.files_replaced = len(unfinished.replaced)
                outcome.files_written = len(unfinished.files)
                self._commit(identifier, unfinished, outcome)
        else:
            plan = self._plan(identifier, table, outcome)
            request = self._written(identifier, table, plan, outcome) if plan else None
            if request is not None:
                self._commit(identifier, request, outcome)
        outcome.seconds = time.monotonic() - started
        if outcome.snapshot_id is not None:
            log.info(
                "purge committed",
                extra={
                    "table": identifier,
                    "snapshot_id": outcome.snapshot_id,
                    "files_replaced": outcome.files_replaced,
                    "files_written": outcome.files_written,
                    "rows_moved": outcome.rows_moved,
                    "rows_dropped": outcome.rows_dropped,
                    "bytes_read": outcome.bytes_read,
                    "bytes_written": outcome.bytes_written,
                    "deferred": outcome.deferred,
                    "seconds": round(outcome.seconds, 3),
                },
            )
        return outcome

    # -- choosing ---------------------------------------------------------------------------------

    def _plan(self, identifier: str, table: Table, outcome: PurgeOutcome) -> PurgePlan:
        """The files to purge in `table`'s current snapshot, from its key index."""
        settings = self.settings
        snapshot = table.current_snapshot()
        upserts = self.key_indexes
        if snapshot is None or settings.purge_deleted_share <= 0:
            return PurgePlan()
        if upserts.has_doubled_rows(identifier):
            outcome.skipped = "keys with several live rows are not deleted yet"
            return PurgePlan()
        data_files, delete_files = live_files(table, snapshot)
        candidates = _worn_by_metadata(
            data_files, delete_files, settings.purge_deleted_share, _largest_purged(settings)
        )
        if not candidates:
            return PurgePlan()  # the common case: spares counting rows in the whole index
        index = upserts.warm(table)
        if index.snapshot_id != snapshot.snapshot_id:
            outcome.skipped = "the key index does not reflect the current snapshot"
            return PurgePlan()
        live_rows = index.live_rows_per_file()
        # A live data file the index has no ordinal for has no live key: the index, current with
        # the snapshot, numbers every file it adds and forgets only those (`prune_files`).
        files = [
            FileLiveness(
                path=data.file_path,
                spec_id=data.spec_id,
                partition=tuple(data.partition),
                record_count=data.record_count,
                size_bytes=data.file_size_in_bytes,
                live_rows=int(live_rows[ordinal]) if ordinal is not None else 0,
            )
            for data in candidates
            for ordinal in [index.ordinal_of(data.file_path)]
        ]
        plan = plan_purge(
            files,
            settings.purge_deleted_share,
            settings.purge_max_file_bytes,
            settings.purge_max_bytes_per_cycle,
        )
        outcome.deferred = plan.deferred
        return plan

    # -- copying ----------------------------------------------------------------------------------

    def _written(
        self, identifier: str, table: Table, plan: PurgePlan, outcome: PurgeOutcome
    ) -> RewriteRequest | None:
        """The live rows of `plan`'s files written as new files, and the request naming them,
        published; None when no file was left to purge."""
        index = self.key_indexes.index_of(identifier)
        assert index is not None  # `_plan` warmed it
        snapshot = table.current_snapshot()
        schema = table.schema()
        schema_ids = {field.field_id for field in schema.fields}
        ordinals = {
            file.path: index.ordinal_of(file.path) for group in plan.groups for file in group.files
        }
        positions = index.live_positions([o for o in ordinals.values() if o is not None])
        request_id = uuid.uuid4().hex
        output = output_folder(table.location(), request_id)
        output_uri = output if "://" in output else "file://" + output
        # Iceberg's timestamps are microseconds; a file pyarrow reads as nanoseconds (INT96 from
        # another tool's Spark) is written back in micros, not as a type Iceberg v2 has not.
        options = {**writer_options(table.properties), "coerce_timestamps": "us"}
        entries: list[FileEntry] = []
        replaced = [file.path for file in plan.emptied]
        with ThreadPoolExecutor(self._workers, thread_name_prefix="purge") as pool:
            for group in plan.groups:
                read = list(
                    pool.map(
                        lambda file: _live_rows_or_skip(
                            file, positions[ordinals[file.path]], schema_ids
                        ),
                        group.files,
                    )
                )
                by_schema: dict[bytes, list[pa.Table]] = {}
                for file, rows in zip(group.files, read):
                    if isinstance(rows, PurgeSkipped):
                        log.debug(
                            "data file not purged",
                            extra={"table": identifier, "file": file.path, "reason": str(rows)},
                        )
                        continue
                    replaced.append(file.path)
                    outcome.bytes_read += file.size_bytes
                    by_schema.setdefault(_fields_key(rows.schema), []).append(rows)
                entries.extend(
                    _write_group(table, group, by_schema, output_uri, len(entries), options)
                )
        if not replaced:
            delete_folder(output_uri)
            return None
        replaced_set = set(replaced)
        chosen = [file for file in plan.replaced if file.path in replaced_set]
        outcome.files_replaced = len(chosen)
        outcome.files_written = len(entries)
        outcome.rows_moved = sum(entry.record_count for entry in entries)
        outcome.rows_dropped = sum(file.record_count - file.live_rows for file in chosen)
        outcome.bytes_written = sum(entry.size_bytes for entry in entries)
        request = RewriteRequest(
            id=request_id,
            table=identifier,
            base_snapshot_id=snapshot.snapshot_id,
            replaced=replaced,
            files=entries,
            schema=schema.model_dump(mode="json", by_alias=True),
            output_folder=output_uri,
            origin="bookkeeper",
        )
        publish_rewrite(table.location(), request)
        return request

    # -- committing -------------------------------------------------------------------------------

    def _commit(self, identifier: str, request: RewriteRequest, outcome: PurgeOutcome) -> None:
        """Commit the published `request` now (not at the next `rewrite_poll_interval`)."""
        self._unfinished[identifier] = request
        result = self.rewrites.commit(identifier, request)
        self._unfinished.pop(identifier, None)
        outcome.snapshot_id = result.snapshot_id
        outcome.refused = result.refusal
        outcome.set_aside = result.set_aside


def _largest_purged(settings: BookkeeperConfig) -> int:
    """A file bigger than the cycle's budget could never be read within it."""
    return min(settings.purge_max_file_bytes, settings.purge_max_bytes_per_cycle)


def _worn_by_metadata(
    data_files: list[DataFile], delete_files: list[DataFile], deleted_share: float, max_bytes: int
) -> list[DataFile]:
    """The data files that may qualify, judged from the manifests alone: a file-scoped delete
    file's record count is its data file's deleted rows (at most: positions deleted twice count
    twice), so a file below the share by that count is below it in the index too. When some delete
    file may point into several data files, every file small enough is a candidate."""
    deleted: Counter[str] = Counter()
    for delete_file in delete_files:
        target = single_target(delete_file)
        if target is None:
            return [data for data in data_files if data.file_size_in_bytes <= max_bytes]
        deleted[target] += delete_file.record_count
    return [
        data
        for data in data_files
        if data.file_size_in_bytes <= max_bytes
        and data.record_count > 0
        and deleted[data.file_path] >= deleted_share * data.record_count
    ]


def _write_group(
    table: Table,
    group: PurgeGroup,
    by_schema: dict[bytes, list[pa.Table]],
    output_uri: str,
    first_task: int,
    options: dict[str, object],
) -> list[FileEntry]:
    """One new file per Arrow schema among the group's live rows (files written before a schema
    change have other columns), with the group's partition, as the table's properties ask."""
    spec = table.specs()[group.spec_id]
    partition = {field.name: value for field, value in zip(spec.fields, group.partition)}
    entries = []
    for number, parts in enumerate(by_schema.values()):
        rows = pa.concat_tables(parts)
        written = write_files(
            rows,
            output_uri,
            first_task + number,
            max(1, rows.num_rows),
            options,
            partition=partition,
        )
        entries.extend(file.entry(group.spec_id) for file in written)
    return entries


def _live_rows_or_skip(
    file: FileLiveness, positions: np.ndarray, schema_ids: set[int]
) -> pa.Table | PurgeSkipped:
    """Every column of the rows `positions` of data file `file`, or why it is not purged.
    Storage errors are raised: the purge waits for a later cycle."""
    if len(positions) != file.live_rows:
        return PurgeSkipped(f"the index has {len(positions)} live rows, {file.live_rows} counted")
    filesystem, local = open_filesystem(file.path)
    with filesystem.open_input_file(local) as handle:
        parquet = pq.ParquetFile(handle)
        unknown = _top_level_field_ids(parquet.schema_arrow) - schema_ids
        if unknown:  # a dropped column: the commit would refuse the new file
            return PurgeSkipped(f"field ids {sorted(unknown)} are not in the table's schema")
        if parquet.metadata.num_rows != file.record_count:
            return PurgeSkipped(
                f"{parquet.metadata.num_rows} rows, the manifest says {file.record_count}"
            )
        rows = parquet.read()
    return rows.take(pa.array(positions, pa.int64())).replace_schema_metadata(None)


def _top_level_field_ids(schema: pa.Schema) -> set[int]:
    return {int(field.metadata[FIELD_ID]) for field in schema if FIELD_ID in (field.metadata or {})}


def _fields_key(schema: pa.Schema) -> bytes:
    """Equal for equal fields (names, types, nullability, field ids), whatever the schema's own
    metadata (Spark's and pyarrow's files carry different ones)."""
    return pa.schema(list(schema)).serialize().to_pybytes()

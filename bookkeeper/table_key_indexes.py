"""The upsert tables' key indexes: per commit, the position deletes that keep one live row per key.

For each commit the moniker append and Event Grid producers (through `row_delta.py`) hand over
the monikers or files they are about to commit, in commit order, and a rewrite its new files
(`rewrites.py`). This module reads the key columns of their new data files and deleted-keys
files (only those columns), asks the table's key index which rows those keys replace, writes
the position deletes, and, once the commit is durable, records the keys' new rows in the index.
A conflict or a crash before the commit leaves the index as it was: it is changed only by
`committed`.

The index follows the table, not the other way round: before planning, it is caught up with every
snapshot committed since the one it reflects (the reaper's rewrites, another bookkeeper's commits
after a takeover), and rebuilt from the table's live rows when it is missing, unreadable or does
not descend from the table's history (see `key_index_store.py`).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyiceberg.manifest import DataFile, DataFileContent, ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from icekeeper.bookkeeper.datafiles import FileUnavailable, InvalidFile
from icekeeper.bookkeeper.key_index import ABSENT, CycleChanges, KeyIndex, pack, unpack
from icekeeper.bookkeeper.key_index_store import load_index, save_index
from icekeeper.bookkeeper.live_deletes import LiveDelete, LiveDeletes, positions_in
from icekeeper.bookkeeper.position_deletes import DataFileRef, write_position_deletes
from icekeeper.bookkeeper.row_keys import exact_keys, file_key_words
from icekeeper.common.delete_files import read_position_deletes
from icekeeper.common.locations import resolved_location
from icekeeper.common.moniker import FileEntry

log = logging.getLogger(__name__)


@dataclass
class MonikerKeys:
    """The keys one moniker writes (per data file, in row order) and the keys it deletes."""

    files: list[tuple[DataFileRef, np.ndarray, np.ndarray]]
    deleted: tuple[np.ndarray, np.ndarray]


class RewriteRefused(ValueError):
    """A compaction the bookkeeper will not commit; the message says why."""


@dataclass
class RewriteCycle:
    """A planned rewrite commit: where the live keys' rows move, and the stale rows to delete."""

    identifier: str
    changes: CycleChanges
    delete_files: list[DataFile]
    rows_moved: int
    rows_stale: int


@dataclass
class UpsertCycle:
    """A planned cycle: its index changes (applied after the commit), its position-delete files,
    and the live delete files they take over (removed by the same snapshot)."""

    identifier: str
    changes: CycleChanges
    delete_files: list[DataFile]
    rows_replaced: int
    removed_deletes: list[LiveDelete] = field(default_factory=list)


def file_ref(data: DataFile) -> DataFileRef:
    return DataFileRef(data.file_path, data.spec_id, tuple(data.partition))


class TableKeyIndexes:
    """The key indexes of the upsert tables one bookkeeper commits to."""

    def __init__(self, workers: int, save_interval_s: float) -> None:
        self._indexes: dict[str, KeyIndex] = {}
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="keys")
        self._save_interval_s = save_interval_s
        self._saved_at: dict[str, float] = {}
        self._doubled: dict[str, np.ndarray] = {}
        """Per table, rows found at a rebuild whose key has a newer row (a table that was a
        changelog before): deleted by the next commit, so the table becomes a mirror."""
        self._live_deletes = LiveDeletes()

    # -- reading a cycle's keys --------------------------------------------------------------------

    def read_keys(
        self, table: Table, monikers: list[tuple[list[DataFile], list[FileEntry]]]
    ) -> list[MonikerKeys | InvalidFile | FileUnavailable]:
        """Key words of each moniker's data files and deleted-keys files. A file storage cannot
        serve now makes its moniker a `FileUnavailable` (it waits), an unreadable one an
        `InvalidFile` (quarantined by the committer); the others go on."""
        schema = table.schema()
        key_ids = list(schema.identifier_field_ids)
        if not key_ids:
            return [
                InvalidFile(
                    f"{'.'.join(table.name())} is an upsert table without identifier fields "
                    "(primary key)"
                )
            ] * len(monikers)
        exact = exact_keys(schema)
        index = self._indexes.get(".".join(table.name()))
        misnamed = [_names_a_data_file(files, deleted, index) for files, deleted in monikers]
        paths = [data.file_path for files, _ in monikers for data in files] + [
            entry.path
            for (_, deleted), problem in zip(monikers, misnamed)
            if problem is None
            for entry in deleted
        ]
        words = dict(
            zip(paths, self._pool.map(lambda path: _words_or_error(path, key_ids, exact), paths))
        )
        found: list[MonikerKeys | InvalidFile | FileUnavailable] = []
        for (files, deleted), problem in zip(monikers, misnamed):
            if problem is not None:
                found.append(problem)
                continue
            problems = [
                words[path]
                for path in [d.file_path for d in files] + [e.path for e in deleted]
                if isinstance(words[path], (InvalidFile, FileUnavailable))
            ]
            if (
                problems
            ):  # unavailable first: the moniker waits rather than being quarantined for a blip
                found.append(
                    next((p for p in problems if isinstance(p, FileUnavailable)), problems[0])
                )
                continue
            deleted_words = [words[entry.path] for entry in deleted]
            found.append(
                MonikerKeys(
                    files=[(file_ref(data), *words[data.file_path]) for data in files],
                    deleted=(
                        _concat([w[0] for w in deleted_words]),
                        _concat([w[1] for w in deleted_words]),
                    ),
                )
            )
        return found

    # -- planning and committing -------------------------------------------------------------------

    def plan(self, table: Table, monikers: list[MonikerKeys]) -> UpsertCycle:
        """The cycle's position deletes, written, against the index caught up with `table`."""
        identifier = ".".join(table.name())
        index = self._current(identifier, table)
        his, los, locations = [], [], []
        for keys in monikers:
            his.append(keys.deleted[0])
            los.append(keys.deleted[1])
            locations.append(np.full(len(keys.deleted[0]), ABSENT, np.uint64))
            for ref, hi, lo in keys.files:
                his.append(hi)
                los.append(lo)
                locations.append(pack(index.file_ordinal(ref), np.arange(len(hi))))
        changes = index.plan(_concat(his), _concat(los), _concat(locations))
        replaced = _concat(
            [changes.replaced, self._doubled.get(identifier, np.empty(0, np.uint64))]
        )
        delete_files, removed_deletes = self._write_deletes(table, index, replaced)
        return UpsertCycle(identifier, changes, delete_files, len(replaced), removed_deletes)

    def committed(self, cycle: UpsertCycle, snapshot_id: int, table: Table) -> None:
        """Record a durable commit in the index; save the index now and then."""
        index = self._indexes[cycle.identifier]
        index.apply(cycle.changes, snapshot_id)
        self._doubled.pop(cycle.identifier, None)
        self._save_if_due(cycle.identifier, table)

    def plan_rewrite(
        self, table: Table, new_files: list[DataFile], replaced: set[str]
    ) -> RewriteCycle:
        """Commit plan for compacted `new_files` that replace the data files `replaced`.

        The new files hold the rows of `replaced` that were live when the compaction read them. A
        key whose live row is still in a replaced file moves to its row in a new file; any other
        row of the new files (its key was updated or deleted since) is stale and gets a position
        delete in the same commit. Refused when a live row of a replaced file has no place in the
        new files: committing would lose it.
        """
        identifier = ".".join(table.name())
        index = self._current(identifier, table)
        if identifier in self._doubled:
            raise RewriteRefused(
                "keys with several live rows (found at the index rebuild) are not deleted yet; "
                "compact after the next commit"
            )
        key_ids = list(table.schema().identifier_field_ids)
        replaced_ordinals = np.fromiter(
            (o for path in replaced if (o := index.ordinal_of(path)) is not None), np.int64
        )
        words = list(
            self._pool.map(
                lambda data: file_key_words(data.file_path, key_ids, index.exact), new_files
            )
        )
        his, los, locations, stale_targets, stale_positions, new_ordinals = [], [], [], [], [], []
        for data, (hi, lo) in zip(new_files, words):
            ref = file_ref(data)
            ordinal = index.file_ordinal(ref)
            new_ordinals.append(ordinal)
            current = index.locations_of(hi, lo)
            live = (current != ABSENT) & np.isin(unpack(current)[0], replaced_ordinals)
            positions = np.arange(len(hi))
            his.append(hi[live])
            los.append(lo[live])
            locations.append(pack(ordinal, positions[live]))
            if not live.all():
                stale_targets.append(ref)
                stale_positions.append(positions[~live])
        changes = index.plan(_concat(his), _concat(los), _concat(locations))
        # A key twice among the new files (twice live in
        # the replaced ones): only its last row stays.
        doubled = changes.replaced[
            np.isin(unpack(changes.replaced)[0], np.array(new_ordinals, np.int64))
        ]
        live_in_replaced = int(
            np.count_nonzero(np.isin(unpack(index.live_locations())[0], replaced_ordinals))
        )
        moved = len(changes.hi)
        if moved < live_in_replaced:
            raise RewriteRefused(
                f"{live_in_replaced - moved} live rows of the replaced files are not in the new "
                "files"
            )
        if len(doubled):
            ordinals, positions = unpack(doubled)
            for ordinal in np.unique(ordinals):
                stale_targets.append(index.files[int(ordinal)])
                stale_positions.append(positions[ordinals == ordinal])
        merged: dict[str, tuple[DataFileRef, list[np.ndarray]]] = {}
        for target, positions in zip(stale_targets, stale_positions):
            merged.setdefault(target.path, (target, []))[1].append(positions)
        targets = [target for target, _ in merged.values()]
        delete_files = write_position_deletes(
            table.location(),
            targets,
            [np.sort(np.concatenate(parts)) for _, parts in merged.values()],
        )
        stale = sum(len(positions) for positions in stale_positions)
        return RewriteCycle(identifier, changes, delete_files, moved, stale)

    def rewritten(self, cycle: RewriteCycle, snapshot_id: int, table: Table) -> None:
        """Record a durable rewrite commit: the moved keys point at their rows in the new files.

        Saved now and then, as after a cycle: the bookkeeper's purges rewrite files most cycles,
        and saving a 10M-key index (240 MB) each time would cost more than they do. An index saved
        before a rewrite catches up through it like through any snapshot (the new files' rows,
        less the rows its stale deletes remove)."""
        self._indexes[cycle.identifier].apply(cycle.changes, snapshot_id)
        self._save_if_due(cycle.identifier, table)

    def live_rows_in(self, table: Table, paths: list[str]) -> int:
        """Live rows the index has in data files `paths` of `table` (none in a file it never
        knew)."""
        index = self._current(".".join(table.name()), table)
        ordinals = [o for path in paths if (o := index.ordinal_of(path)) is not None]
        return int(index.live_rows_per_file()[ordinals].sum()) if ordinals else 0

    def has_doubled_rows(self, identifier: str) -> bool:
        """Whether the table's index, rebuilt, found keys with several live rows that no commit
        has deleted yet (`plan_rewrite` refuses to move rows until then)."""
        return identifier in self._doubled

    def save_all(self, tables: dict[str, Table]) -> None:
        """Persist every index (a clean stop: the next bookkeeper starts from here)."""
        for identifier, table in tables.items():
            # An index whose doubled rows are not deleted yet is not saved: the next bookkeeper
            # rebuilds it and finds them again.
            if identifier in self._indexes and identifier not in self._doubled:
                self._save(identifier, table)

    def identifiers(self) -> list[str]:
        return list(self._indexes)

    def index_of(self, identifier: str) -> KeyIndex | None:
        return self._indexes.get(identifier)

    def warm(self, table: Table) -> KeyIndex:
        """The table's index, loaded, caught up or rebuilt now rather than in the first cycle that
        needs it: a bookkeeper starting (or taking over) is ready before its first commit."""
        return self._current(".".join(table.name()), table)

    def _save_if_due(self, identifier: str, table: Table) -> None:
        if time.monotonic() - self._saved_at.get(identifier, 0.0) >= self._save_interval_s:
            self._save(identifier, table)

    def _save(self, identifier: str, table: Table) -> None:
        """Save the index, without the data files it no longer needs (`KeyIndex.prune_files`:
        saves, between cycles, are the one moment no planned cycle holds ordinals). Not while
        rows found doubled at a rebuild wait for their deletes: those point into such files."""
        index = self._indexes[identifier]
        if identifier not in self._doubled:
            index.prune_files()
        save_index(table, index)
        self._saved_at[identifier] = time.monotonic()

    def _write_deletes(
        self, table: Table, index: KeyIndex, replaced: np.ndarray
    ) -> tuple[list[DataFile], list[LiveDelete]]:
        """One delete file per data file with `replaced` rows, holding also the positions of that
        data file's live file-scoped delete files in `table`'s current snapshot; returns the new
        files and the live ones they take over (see `live_deletes.py`)."""
        if not len(replaced):
            return [], []
        ordinals, positions = unpack(np.sort(replaced))
        starts = np.flatnonzero(np.r_[True, ordinals[1:] != ordinals[:-1]])
        ends = np.r_[starts[1:], len(ordinals)]
        targets = [index.files[int(ordinals[start])] for start in starts]
        target_positions = [positions[start:end] for start, end in zip(starts, ends)]
        live = self._live_deletes.by_data_file(table, table.current_snapshot())
        earlier = [
            (number, old)
            for number, target in enumerate(targets)
            for old in live.get(target.path, ())
        ]
        taken_over: list[LiveDelete] = []
        earlier_positions = self._pool.map(
            lambda item: positions_in(item[1], targets[item[0]].path), earlier
        )
        for (number, old), old_positions in zip(earlier, earlier_positions):
            if old_positions is not None:
                target_positions[number] = _sorted_union(target_positions[number], old_positions)
                taken_over.append(old)
        return write_position_deletes(table.location(), targets, target_positions), taken_over

    # -- following the table -----------------------------------------------------------------------

    def _current(self, identifier: str, table: Table) -> KeyIndex:
        """The table's index as of its current snapshot: kept, loaded, caught up or rebuilt."""
        current = table.current_snapshot()
        exact = exact_keys(table.schema())
        index = self._indexes.get(identifier)
        if index is None or index.exact != exact:
            index = load_index(table)
            if index is not None and index.exact != exact:
                index = None
        if index is not None and (current is None or index.snapshot_id != current.snapshot_id):
            index = self._caught_up(table, index)
        if index is None:
            index = self._rebuilt(table)
        self._indexes[identifier] = index
        return index

    def _caught_up(self, table: Table, index: KeyIndex) -> KeyIndex | None:
        """`index` moved forward through the snapshots after its own; None when its snapshot is not
        an ancestor of the current one (expired, rolled back, another table)."""
        later: list[Snapshot] = []
        snapshot = table.current_snapshot()
        while snapshot is not None and snapshot.snapshot_id != index.snapshot_id:
            later.append(snapshot)
            snapshot = (
                table.snapshot_by_id(snapshot.parent_snapshot_id)
                if snapshot.parent_snapshot_id is not None
                else None
            )
        if snapshot is None and index.snapshot_id is not None:
            log.info(
                "key index is not from this table's history; rebuilding",
                extra={"table": ".".join(table.name())},
            )
            return None
        started = time.monotonic()
        for snapshot in reversed(later):
            data, deletes = _added_files(table, snapshot)
            self._apply_live_rows(table, index, data, deletes, snapshot.snapshot_id)
        if later:
            log.info(
                "key index caught up",
                extra={
                    "table": ".".join(table.name()),
                    "snapshots": len(later),
                    "seconds": round(time.monotonic() - started, 3),
                },
            )
        return index

    def _rebuilt(self, table: Table) -> KeyIndex:
        """A new index from the table's live rows (every live data file's keys, minus its deletes).

        Files are read in commit order (data sequence number), rows in file order, so where a key
        has several live rows (the table was a changelog before) the newest is kept; the others
        are deleted by the next commit (`_doubled`)."""
        started = time.monotonic()
        identifier = ".".join(table.name())
        index = KeyIndex(exact=exact_keys(table.schema()))
        current = table.current_snapshot()
        if current is not None:
            data, deletes = live_files(table, current)
            doubled = self._apply_live_rows(
                table, index, data, deletes, current.snapshot_id, forget_first=False
            )
            if len(doubled):
                self._doubled[identifier] = doubled
                log.warning(
                    "keys with several live rows: the older ones are deleted by the next commit",
                    extra={"table": identifier, "rows": len(doubled)},
                )
        log.info(
            "key index rebuilt",
            extra={
                "table": identifier,
                "keys": index.live_keys,
                "seconds": round(time.monotonic() - started, 3),
            },
        )
        return index

    def _apply_live_rows(
        self,
        table: Table,
        index: KeyIndex,
        data: list[DataFile],
        deletes: list[DataFile],
        snapshot_id: int | None,
        forget_first: bool = True,
    ) -> np.ndarray:
        """Forget rows that `deletes` remove, then point keys at the live rows of `data`; returns
        the locations of live rows that a later row of the same key replaced."""
        key_ids = list(table.schema().identifier_field_ids)
        deleted: dict[str, set[int]] = {}
        for paths, positions in self._pool.map(
            lambda d: read_position_deletes(d.file_path), deletes
        ):
            for path, position in zip(paths, positions.tolist()):
                deleted.setdefault(path, set()).add(position)
        if forget_first:
            gone = [
                pack(ordinal, np.fromiter(positions, np.int64))
                for path, positions in deleted.items()
                if (ordinal := index.ordinal_of(path)) is not None
            ]
            index.remove_locations(_concat(gone))
        his, los, locations = [], [], []
        words = self._pool.map(lambda d: file_key_words(d.file_path, key_ids, index.exact), data)
        for data_file, (hi, lo) in zip(data, words):
            positions = np.arange(len(hi))
            if data_file.file_path in deleted:
                positions = np.setdiff1d(
                    positions, np.fromiter(deleted[data_file.file_path], np.int64)
                )
            his.append(hi[positions])
            los.append(lo[positions])
            locations.append(pack(index.file_ordinal(file_ref(data_file)), positions))
        changes = index.plan(_concat(his), _concat(los), _concat(locations))
        index.apply(changes, snapshot_id)
        return changes.replaced


def live_files(table: Table, snapshot: Snapshot | None) -> tuple[list[DataFile], list[DataFile]]:
    """The live data files of `snapshot` by data sequence number (then path), and its
    position-delete files (none without a snapshot)."""
    data, deletes = [], []
    for manifest in snapshot.manifests(table.io) if snapshot is not None else []:
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.content == DataFileContent.DATA:
                data.append(
                    (entry.sequence_number or 0, entry.data_file.file_path, entry.data_file)
                )
            elif entry.data_file.content == DataFileContent.POSITION_DELETES:
                deletes.append(entry.data_file)
    return [data_file for _, _, data_file in sorted(data, key=lambda item: item[:2])], deletes


def _added_files(table: Table, snapshot: Snapshot) -> tuple[list[DataFile], list[DataFile]]:
    """Data files and position-delete files that `snapshot` added."""
    data, deletes = [], []
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if (
                entry.status != ManifestEntryStatus.ADDED
                or entry.snapshot_id != snapshot.snapshot_id
            ):
                continue
            if entry.data_file.content == DataFileContent.DATA:
                data.append(entry.data_file)
            elif entry.data_file.content == DataFileContent.POSITION_DELETES:
                deletes.append(entry.data_file)
    return data, deletes


def _names_a_data_file(
    files: list[DataFile], deleted: list[FileEntry], index: KeyIndex | None
) -> InvalidFile | None:
    """Why a moniker's deleted-keys entries cannot be read as such: one names a data file (of the
    moniker, or one the key index has rows in), whose keys it would all delete. A writer's
    deleted-keys file is a new file of its own; only a malformed moniker names another."""
    own = {resolved_location(data.file_path) for data in files}
    for entry in deleted:
        if resolved_location(entry.path) in own or (
            index is not None and index.ordinal_of(entry.path) is not None
        ):
            return InvalidFile(
                f"{entry.path}: named as a deleted-keys file but it is a data file of the table"
            )
    return None


def _words_or_error(
    path: str, key_ids: list[int], exact: bool
) -> tuple[np.ndarray, np.ndarray] | InvalidFile | FileUnavailable:
    """The file's key words; `FileUnavailable` when storage fails to serve it (its footer was read
    a moment ago, so this is storage, not the file: retried), `InvalidFile` when its key columns
    are missing or not decodable (quarantined)."""
    try:
        return file_key_words(path, key_ids, exact)
    except FileNotFoundError:
        return FileUnavailable(f"{path}: not found", missing=True)
    except (
        KeyError,
        ValueError,
        pa.ArrowException,
    ) as error:  # ArrowInvalid is a ValueError: bad content
        return InvalidFile(f"{path}: key columns unreadable ({error})")
    except OSError as error:
        return FileUnavailable(f"{path}: storage error reading key columns ({error})")


def _sorted_union(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The sorted distinct values of two sorted int64 arrays (np.union1d hashes them first:
    measured ~10x slower on 100k positions; a stable sort finds the two sorted runs)."""
    merged = np.concatenate([first.astype(np.int64), second.astype(np.int64)])
    merged.sort(kind="stable")
    return merged[np.r_[True, merged[1:] != merged[:-1]]] if len(merged) else merged


def _concat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays).astype(np.uint64) if arrays else np.empty(0, np.uint64)

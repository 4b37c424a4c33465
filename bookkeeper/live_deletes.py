"""The live position-delete files of each data file, as of a snapshot: what a cycle's new delete
file for that data file takes over (at most one live delete file per data file).

A data file touched by N bookkeeper cycles used to collect N delete files, and every reader opens
each of them for it: in `icekeeper bench upsert`, 24 data files had 39 delete files and a DuckDB
scan took 3.77x the same rows in one file. Iceberg's Spark writes keep one (apache/iceberg#11273,
with file-scoped deletes): `SparkBatchQueryScan.rewritableDeletes()` finds each data file's
previous file-scoped delete files, the new delete file holds their positions too, and the commit
drops them (`RowDelta.removeDeletes`); deletion vectors (format version 3) follow the same rule.
The bookkeeper does the same: the new delete file of data file X holds the positions of X's live
file-scoped delete files and the cycle's, and the same snapshot removes those files.

Only file-scoped delete files (one data file in their `file_path` bounds, as the bookkeeper and
Iceberg's Java writers write them) are taken over; one that may cover several data files stays.
Looked up on the snapshot the cycle commits on (its compare-and-swap fails if another commit came
first, and the cycle is planned again), never from a stale copy. Reading the entries of every
delete manifest each cycle is what this module spares: manifests never change once written, so
their live entries are kept by manifest path (for the manifests the last looked-up snapshot
lists), and a cycle reads only the delete manifests written since.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from icekeeper.bookkeeper.manifests import written_manifest_list
from icekeeper.common.delete_files import read_positions_in, single_target


@dataclass(frozen=True)
class LiveDelete:
    """A live position-delete file of one data file, and the manifest that lists it."""

    delete_file: DataFile
    manifest_path: str


class LiveDeletes:
    """Per table, the live entries of the delete manifests its last looked-up snapshot lists."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, tuple[DataFile, ...]]] = {}

    def by_data_file(self, table: Table, snapshot: Snapshot | None) -> dict[str, list[LiveDelete]]:
        """Data file path -> its live file-scoped position-delete files in `snapshot`."""
        identifier = ".".join(table.name())
        if snapshot is None:
            self._entries.pop(identifier, None)
            return {}
        manifests = written_manifest_list(snapshot.manifest_list) or snapshot.manifests(table.io)
        known = self._entries.get(identifier, {})
        current: dict[str, tuple[DataFile, ...]] = {}
        for manifest in manifests:
            if manifest.content != ManifestContent.DELETES:
                continue
            entries = known.get(manifest.manifest_path)
            if entries is None:
                entries = tuple(
                    entry.data_file
                    for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
                    if entry.data_file.content == DataFileContent.POSITION_DELETES
                )
            current[manifest.manifest_path] = entries
        self._entries[identifier] = current
        found: dict[str, list[LiveDelete]] = {}
        for manifest_path, delete_files in current.items():
            for delete_file in delete_files:
                target = single_target(delete_file)
                if target is not None:
                    found.setdefault(target, []).append(LiveDelete(delete_file, manifest_path))
        return found


def positions_in(live: LiveDelete, data_path: str) -> np.ndarray | None:
    """The row positions `live` deletes in data file `data_path`; None when some of its rows point
    into another data file (its bounds were not exact): such a file is not taken over."""
    return read_positions_in(live.delete_file.file_path, data_path)

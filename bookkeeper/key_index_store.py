"""The key index on storage, beside the table: what a restarted or new bookkeeper starts from.

One Parquet file per table at `<table location>/icekeeper/key-index.parquet`: the three index
arrays as columns, and in its metadata the snapshot id it reflects, the key kind and the data files
its locations point into: only those, files no live key points into are pruned before each save
(`KeyIndex.prune_files`; the list, saved whole each time, otherwise grew by every data file ever
committed). Pruning changes no format: an index saved before it loads as ever. It is written whole
through the storage door (`write_whole_with`: renamed into place on a local folder, one PUT on an
object store), so a bookkeeper that dies while saving leaves the previous index. A stale
bookkeeper's late save can replace a newer one's; that costs a catch-up, not a wrong answer: the
index names the snapshot it reflects and is caught up from the table's later snapshots, or rebuilt
when that snapshot is not an ancestor of the current one. A file that is missing, unreadable or of
another version is not an error: the caller rebuilds the index from the table. The reaper's orphan
removal spares the folder (`common.locations.TABLE_STATE_FOLDER`).
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs
from pyiceberg.table import Table

from icekeeper.bookkeeper.key_index import KeyIndex
from icekeeper.bookkeeper.position_deletes import DataFileRef
from icekeeper.common.locations import TABLE_STATE_FOLDER
from icekeeper.common.storage import make_folder, open_filesystem, write_whole_with

log = logging.getLogger(__name__)

_FORMAT = 1
_METADATA_KEY = b"icekeeper.key-index"


def index_location(table_location: str) -> str:
    return f"{table_location.rstrip('/')}/{TABLE_STATE_FOLDER}/key-index.parquet"


def save_index(table: Table, index: KeyIndex) -> None:
    """Write `index` for `table`, replacing the previous one only once the new one is complete."""
    save_index_at(table.location(), str(table.metadata.table_uuid), index)


def save_index_at(table_location: str, table_uuid: str, index: KeyIndex) -> None:
    """`save_index` by the table's location and uuid (what `icekeeper bench key-index-files` times
    without a catalog)."""
    header = {
        "format": _FORMAT,
        "snapshot_id": index.snapshot_id,
        "exact": index.exact,
        "table_uuid": table_uuid,
        "files": [[ref.path, ref.spec_id, list(ref.partition)] for ref in index.files],
    }
    hi, lo, location = index.arrays()
    arrays = pa.table({"hi": hi, "lo": lo, "location": location})
    arrays = arrays.replace_schema_metadata({_METADATA_KEY: json.dumps(header).encode()})
    location = index_location(table_location)
    filesystem, path = open_filesystem(location)
    make_folder(filesystem, path.rsplit("/", 1)[0])
    # Uncompressed: hashes do not compress, and reading back is what recovery waits on.
    write_whole_with(
        filesystem, path, lambda stream: pq.write_table(arrays, stream, compression="none")
    )


def load_index(table: Table) -> KeyIndex | None:
    """The saved index of `table`, or None when there is none usable (the caller rebuilds it)."""
    return load_index_at(table.location(), str(table.metadata.table_uuid))


def load_index_at(table_location: str, table_uuid: str) -> KeyIndex | None:
    """`load_index` by the table's location and uuid."""
    location = index_location(table_location)
    filesystem, path = open_filesystem(location)
    try:
        if filesystem.get_file_info(path).type != pafs.FileType.File:
            return None
        with filesystem.open_input_file(path) as handle:
            arrays = pq.read_table(handle)
        header = json.loads(arrays.schema.metadata[_METADATA_KEY])
        if header.get("format") != _FORMAT or header.get("table_uuid") != table_uuid:
            return None
        files = [
            DataFileRef(path, spec_id, tuple(partition))
            for path, spec_id, partition in header["files"]
        ]
        index = KeyIndex(
            exact=bool(header["exact"]),
            files=files,
            snapshot_id=header["snapshot_id"],
            hi=_column(arrays, "hi"),
            lo=_column(arrays, "lo"),
            location=_column(arrays, "location"),
        )
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as error:
        log.warning(
            "saved key index unreadable; rebuilding from the table",
            extra={"location": location, "error": str(error)},
        )
        return None
    return index


def _column(arrays: pa.Table, name: str) -> np.ndarray:
    return (
        arrays.column(name)
        .combine_chunks()
        .to_numpy(zero_copy_only=False)
        .astype(np.uint64, copy=True)
    )

"""Reading Iceberg position-delete files (and any Parquet columns by field id), for every role.

The bookkeeper reads them to keep its key index; the reaper to see how much of each data file is
deleted and which delete files leave with a data file.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile

from icekeeper.common.locations import normalize_location
from icekeeper.common.storage import open_filesystem

POSITION_DELETE_PATH_ID = 2147483546
POSITION_DELETE_POS_ID = 2147483545
"""Field ids of `file_path` and `pos` in every Iceberg
position-delete file (reserved by the spec)."""


def read_columns_by_id(path: str, field_ids: list[int]) -> list[pa.ChunkedArray]:
    """Columns `field_ids` of Parquet file `path`, found by the Iceberg field ids in its schema
    (names may differ after a rename; ids do not). Reads those columns only."""
    filesystem, local = open_filesystem(path)
    with filesystem.open_input_file(local) as handle:
        parquet = pq.ParquetFile(handle)
        return _columns_by_id(parquet, path, field_ids)


def _columns_by_id(
    parquet: pq.ParquetFile, path: str, field_ids: list[int]
) -> list[pa.ChunkedArray]:
    names = _names_by_id(parquet, path, field_ids)
    table = parquet.read(columns=names)
    return [table.column(index) for index in range(len(field_ids))]


def _names_by_id(parquet: pq.ParquetFile, path: str, field_ids: list[int]) -> list[str]:
    names = {}
    for column in parquet.schema_arrow:
        metadata = column.metadata or {}
        if b"PARQUET:field_id" in metadata:
            names[int(metadata[b"PARQUET:field_id"])] = column.name
    missing = [field_id for field_id in field_ids if field_id not in names]
    if missing:
        raise KeyError(f"{path}: no columns with field ids {missing}")
    return [names[field_id] for field_id in field_ids]


def read_position_deletes(path: str) -> tuple[list[str], np.ndarray]:
    """The (data file path, row position) pairs of a position-delete file."""
    columns = read_columns_by_id(path, [POSITION_DELETE_PATH_ID, POSITION_DELETE_POS_ID])
    return columns[0].to_pylist(), pc.cast(columns[1], pa.int64()).to_numpy()


def read_positions_in(path: str, data_path: str) -> np.ndarray | None:
    """The row positions position-delete file `path` deletes in data file `data_path`, or None
    when some of its rows point into another data file. When the footer's statistics show
    `data_path` as the only value of `file_path` (as in every file-scoped delete file), only the
    positions are read: reading the path column too took ~4x as long (400k rows)."""
    filesystem, local = open_filesystem(path)
    with filesystem.open_input_file(local) as handle:
        parquet = pq.ParquetFile(handle)
        path_name, pos_name = _names_by_id(
            parquet, path, [POSITION_DELETE_PATH_ID, POSITION_DELETE_POS_ID]
        )
        if _only_value(parquet.metadata, path_name) == data_path:
            positions = parquet.read(columns=[pos_name]).column(0)
        else:
            paths, positions = _columns_by_id(
                parquet, path, [POSITION_DELETE_PATH_ID, POSITION_DELETE_POS_ID]
            )
            if len(paths) and not pc.all(pc.equal(paths, data_path)).as_py():
                return None
    return pc.cast(positions, pa.int64()).to_numpy()


def _only_value(metadata: pq.FileMetaData, column_name: str) -> str | None:
    """The one value of string column `column_name` in every row group, by the footer's
    statistics; None when they do not show one (missing, several values, nulls)."""
    values = set()
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for index in range(row_group.num_columns):
            chunk = row_group.column(index)
            if chunk.path_in_schema != column_name:
                continue
            stats = chunk.statistics
            if stats is None or not stats.has_min_max or stats.null_count != 0:
                return None
            values.update({stats.min, stats.max})
    return values.pop() if len(values) == 1 else None


def single_target(delete_file: DataFile) -> str | None:
    """The one data file a file-scoped delete file points into (equal `file_path` bounds, as the
    bookkeeper writes them), None when its entries may point into several."""
    lower = (delete_file.lower_bounds or {}).get(POSITION_DELETE_PATH_ID)
    upper = (delete_file.upper_bounds or {}).get(POSITION_DELETE_PATH_ID)
    return lower.decode() if lower is not None and lower == upper else None


def referenced_data_files(delete_file: DataFile) -> set[str]:
    """The data files a position-delete file has entries for (read only when not file-scoped)."""
    target = single_target(delete_file)
    return {target} if target is not None else set(read_position_deletes(delete_file.file_path)[0])


def deleted_positions_per_file(delete_files: Iterable[DataFile]) -> Counter[str]:
    """Deleted rows per data file (normalized path) across
    `delete_files` (positions deleted twice count twice)."""
    counts: Counter[str] = Counter()
    for delete_file in delete_files:
        target = single_target(delete_file)
        if target is not None:
            counts[normalize_location(target)] += delete_file.record_count
        else:
            counts.update(
                normalize_location(path) for path in read_position_deletes(delete_file.file_path)[0]
            )
    return counts

"""Position-delete files of format-version 2 tables: which rows of which data files stop being live.

One file per partition and cycle, rows sorted by (file_path, pos) as the spec requires, with full
(untruncated) `file_path` bounds: readers match a delete file to data files by partition and
prune by those bounds, and a file that names one data file only (equal bounds) is matched to it
directly by pyiceberg, Spark and Trino. Position deletes rather than equality deletes: every
engine reads them (pyiceberg, Snowflake and Databricks cannot read equality deletes) and a scan
does not slow down with their count the way it does with equality deletes (apache/iceberg#9363).

Written before the commit that names them; a cycle that dies leaves unreferenced files, which
the reaper's orphan removal deletes after its grace period.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record

from bookkeeper.row_keys import POSITION_DELETE_PATH_ID, POSITION_DELETE_POS_ID
from common.storage import open_filesystem

DELETES_FOLDER = "icekeeper-deletes"
"""Under the table's `data/` folder."""

_SCHEMA = pa.schema([
    pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(POSITION_DELETE_PATH_ID).encode()}),
    pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POSITION_DELETE_POS_ID).encode()}),
])


@dataclass(frozen=True)
class DataFileRef:
    """What a delete file needs of the data file it points into: its path and partition."""

    path: str
    spec_id: int
    partition: tuple


def write_position_deletes(table_location: str, targets: list[DataFileRef], positions: list[np.ndarray]) -> list[DataFile]:
    """Write the deletes of rows `positions[i]` of data file `targets[i]`; one delete file per partition.

    Returns the delete files as manifest entries' data files, with their metrics.
    """
    groups: dict[tuple[int, tuple], list[int]] = {}
    for number, target in enumerate(targets):
        if len(positions[number]):
            groups.setdefault((target.spec_id, target.partition), []).append(number)
    written = []
    folder = f"{table_location.rstrip('/')}/data/{DELETES_FOLDER}"
    for (spec_id, partition), numbers in groups.items():
        numbers.sort(key=lambda number: targets[number].path)
        paths = [targets[number].path for number in numbers]
        sorted_positions = [np.sort(positions[number]) for number in numbers]
        counts = [len(array) for array in sorted_positions]
        all_positions = np.concatenate(sorted_positions).astype(np.int64)
        table = pa.table({
            "file_path": pa.array(np.repeat(np.array(paths, dtype=object), counts), pa.string()),
            "pos": pa.array(all_positions, pa.int64()),
        }, schema=_SCHEMA)
        location = f"{folder}/{uuid.uuid4().hex}.parquet"
        filesystem, local = open_filesystem(location)
        filesystem.create_dir(local.rsplit("/", 1)[0], recursive=True)
        with filesystem.open_output_stream(local) as stream:
            pq.write_table(table, stream, compression="zstd")
        size = filesystem.get_file_info(local).size
        written.append(_delete_file(location, size, table.num_rows, paths, (int(all_positions.min()), int(all_positions.max())), spec_id, partition))
    return written


def _delete_file(location: str, size: int, rows: int, paths: list[str], position_range: tuple[int, int], spec_id: int,
                 partition: tuple) -> DataFile:
    delete = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=Record(*partition),
        record_count=rows,
        file_size_in_bytes=size,
        column_sizes=None,
        value_counts={POSITION_DELETE_PATH_ID: rows, POSITION_DELETE_POS_ID: rows},
        null_value_counts={POSITION_DELETE_PATH_ID: 0, POSITION_DELETE_POS_ID: 0},
        nan_value_counts={},
        lower_bounds={POSITION_DELETE_PATH_ID: paths[0].encode(), POSITION_DELETE_POS_ID: _long(position_range[0])},
        upper_bounds={POSITION_DELETE_PATH_ID: paths[-1].encode(), POSITION_DELETE_POS_ID: _long(position_range[1])},
        key_metadata=None,
        split_offsets=None,
        equality_ids=None,
        sort_order_id=None,
    )
    delete.spec_id = spec_id  # pyiceberg 0.12's from_args drops it (see datafiles.data_file)
    return delete


def _long(value: int) -> bytes:
    """Iceberg's single-value binary form of a long: 8 bytes, little-endian."""
    return int(value).to_bytes(8, "little", signed=True)

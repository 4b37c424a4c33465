"""Position-delete files of format-version 2 tables: which rows of which data files stop being live.

One file per data file ("file-scoped", Iceberg's default `write.delete.granularity` since 1.7):
a cycle's file for a data file also holds the rows of the data file's live delete file, which the
same snapshot removes (`live_deletes.py`). Rows sorted by position, with the data file's path as
both `file_path` bounds: pyiceberg, Spark and Trino match such a file to its data file directly.
A delete file covering a whole partition is read once per data file its path range spans: with
them, the reaper's upsert compaction test spent 164 s (Spark's rewrite of ~150 small files alone
41 s); with file-scoped deletes, 76 s. Position deletes rather than equality deletes: every
engine reads them (pyiceberg, Snowflake and Databricks cannot read equality deletes) and a scan
does not slow down with their count the way it does with equality deletes (apache/iceberg#9363).

Written before the commit that names them; a cycle that dies leaves unreferenced files, which
the reaper's orphan removal deletes after its grace period.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record

from icekeeper.common.delete_files import POSITION_DELETE_PATH_ID, POSITION_DELETE_POS_ID
from icekeeper.common.storage import make_folder, open_filesystem

DELETES_FOLDER = "icekeeper-deletes"
"""Under the table's `data/` folder."""

_SCHEMA = pa.schema(
    [
        pa.field(
            "file_path",
            pa.dictionary(pa.int32(), pa.string()),  # see `write_position_deletes`
            nullable=False,
            metadata={b"PARQUET:field_id": str(POSITION_DELETE_PATH_ID).encode()},
        ),
        pa.field(
            "pos",
            pa.int64(),
            nullable=False,
            metadata={b"PARQUET:field_id": str(POSITION_DELETE_POS_ID).encode()},
        ),
    ]
)


@dataclass(frozen=True)
class DataFileRef:
    """What a delete file needs of the data file it points into: its path and partition."""

    path: str
    spec_id: int
    partition: tuple


def write_position_deletes(
    table_location: str, targets: list[DataFileRef], positions: list[np.ndarray]
) -> list[DataFile]:
    """Write the deletes of rows `positions[i]` of data file `targets[i]`, one delete file per data
    file (in parallel: on object stores each is a round trip). Returns them as manifest entries'
    data files, with their metrics."""
    folder = f"{table_location.rstrip('/')}/data/{DELETES_FOLDER}"
    filesystem, local_folder = open_filesystem(folder)
    make_folder(filesystem, local_folder)
    work = [
        (target, np.sort(np.asarray(rows, np.int64), kind="stable"))  # mostly sorted already
        for target, rows in zip(targets, positions)
        if len(rows)
    ]

    def write(item: tuple[DataFileRef, np.ndarray]) -> DataFile:
        target, rows = item
        # The one path as a dictionary column: Parquet stores a string column, dictionary
        # encoded, as it would for a column of repeated strings, without building and hashing
        # each row's copy (a merged delete file holds every deleted row of its data file; a
        # Python list of the path took ~4x as long as this on 100k rows). Without the Arrow
        # schema in the file, readers see a plain string column. Positions are all distinct:
        # a dictionary for them overflows and falls back to plain encoding after the work
        # (400k positions: half the time and 60% of the bytes without it).
        paths = pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(len(rows), np.int32)), pa.array([target.path], pa.string())
        )
        table = pa.table({"file_path": paths, "pos": pa.array(rows, pa.int64())}, schema=_SCHEMA)
        name = f"{uuid.uuid4().hex}.parquet"
        with filesystem.open_output_stream(f"{local_folder}/{name}") as stream:
            pq.write_table(
                table,
                stream,
                compression="zstd",
                use_dictionary=["file_path"],
                store_schema=False,
            )
        size = filesystem.get_file_info(f"{local_folder}/{name}").size
        return _delete_file(
            f"{folder}/{name}", size, len(rows), target, (int(rows[0]), int(rows[-1]))
        )

    with ThreadPoolExecutor(max_workers=min(16, max(1, len(work)))) as pool:
        return list(pool.map(write, work))


def _delete_file(
    location: str, size: int, rows: int, target: DataFileRef, position_range: tuple[int, int]
) -> DataFile:
    delete = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=Record(*target.partition),
        record_count=rows,
        file_size_in_bytes=size,
        column_sizes=None,
        value_counts={POSITION_DELETE_PATH_ID: rows, POSITION_DELETE_POS_ID: rows},
        null_value_counts={POSITION_DELETE_PATH_ID: 0, POSITION_DELETE_POS_ID: 0},
        nan_value_counts={},
        lower_bounds={
            POSITION_DELETE_PATH_ID: target.path.encode(),
            POSITION_DELETE_POS_ID: _long(position_range[0]),
        },
        upper_bounds={
            POSITION_DELETE_PATH_ID: target.path.encode(),
            POSITION_DELETE_POS_ID: _long(position_range[1]),
        },
        key_metadata=None,
        split_offsets=None,
        equality_ids=None,
        sort_order_id=None,
    )
    delete.spec_id = target.spec_id  # pyiceberg 0.12's from_args drops it (see datafiles.data_file)
    return delete


def _long(value: int) -> bytes:
    """Iceberg's single-value binary form of a long: 8 bytes, little-endian."""
    return int(value).to_bytes(8, "little", signed=True)

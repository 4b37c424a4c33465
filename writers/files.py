"""Where a batch's Parquet files go, and removing them when the batch is not published.

Every batch writes into a folder of its own, so files are never overwritten and concurrent writers
never share Spark's `_temporary` folder. The writing itself (partitioned by Iceberg's transforms)
and listing the files back are shared with the reaper: `common/parquet_files.py`.
"""

from __future__ import annotations

import uuid

from icekeeper.common.parquet_files import (
    PartitionColumn,
    list_written_files,
    parquet_write_options,
    partition_columns,
    write_parquet,
)
from icekeeper.common.storage import delete_folder

__all__ = [  # what writers import from here, written in common/parquet_files.py
    "PartitionColumn",
    "batch_folder",
    "discard_output",
    "list_written_files",
    "parquet_write_options",
    "partition_columns",
    "path_segment",
    "write_parquet",
]


def path_segment(name: str) -> str:
    """A folder or file name from a writer's or a source's name: characters other than letters,
    digits and `._-` become `_`."""
    return "".join(char if char.isalnum() or char in "._-" else "_" for char in name)


def batch_folder(table_location: str, writer_id: str, seq: int) -> str:
    """A new folder for one table's files of one batch:
    `<location>/data/<writer>/<seq>-<random>`."""
    folder = f"{seq:012d}-{uuid.uuid4().hex[:8]}"
    return f"{table_location.rstrip('/')}/data/{path_segment(writer_id)}/{folder}"


def discard_output(output_dirs: list[str]) -> None:
    """Remove output of a batch that will not be published (nothing refers to it)."""
    for output in output_dirs:
        try:
            delete_folder(output)
        except OSError:
            pass

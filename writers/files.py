"""Where a batch's Parquet files go, and removing them when the batch is not published.

Every batch writes each table's files into a folder of its own (`batch_folder`), so files are
never overwritten and concurrent writers never share Spark's `_temporary` folder. An upsert
table's batch folder has two subfolders, `_ik_deleted=false/` for the rows of keys whose last
change keeps a row and `_ik_deleted=true/` for the deleted-keys files, laid out alike by both
engines (Spark names them after its partition column `DELETED`). Writing and listing Parquet is
shared with the reaper and the bookkeeper: `common/parquet_files.py` (Spark),
`common/arrow_parquet.py` (pyarrow).
"""

from __future__ import annotations

import uuid

from icekeeper.common.storage import delete_folder

DELETED = "_ik_deleted"
"""Upsert tables: true for a key whose last change in the batch deletes it; names the folders of
a batch's data files (`LIVE_FOLDER`) and deleted-keys files (`DELETED_FOLDER`)."""
LIVE_FOLDER = f"{DELETED}=false"
DELETED_FOLDER = f"{DELETED}=true"


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

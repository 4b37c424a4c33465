"""Which files an upsert compaction takes and how many files it writes per partition: plain
functions over the scan's files, no services (`reaper/upsert_compaction.py`)."""

from __future__ import annotations

from collections import Counter

from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import FileScanTask
from pyiceberg.typedef import Record

from icekeeper.common.locations import normalize_location
from icekeeper.reaper.upsert_compaction import MANY_DELETE_FILES, choose_files, plan_layout

MB = 1024 * 1024
TARGET = 8 * MB


def data_file(path: str, partition: int, size_bytes: int, records: int) -> DataFile:
    data = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=f"file:///t/data/{path}.parquet",
        file_format=FileFormat.PARQUET,
        partition=Record(partition),
        file_size_in_bytes=size_bytes,
        record_count=records,
    )
    data.spec_id = 0
    return data


def deleted_rows(rows_of_files: dict[DataFile, int]) -> Counter[str]:
    """Deleted rows per data file, keyed as `deleted_positions_per_file` keys them."""
    return Counter(
        {normalize_location(data.file_path): rows for data, rows in rows_of_files.items()}
    )


def delete_file(index: int) -> DataFile:
    return DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=f"file:///t/data/deletes-{index}.parquet",
        file_format=FileFormat.PARQUET,
        partition=Record(0),
        file_size_in_bytes=1000,
        record_count=1,
    )


def test_every_small_file_of_a_partition_is_taken_with_its_worn_ones() -> None:
    small = [data_file(f"small-{index}", 0, MB, 1000) for index in range(3)]
    full = data_file("full", 0, 7 * MB, 7000)  # 7/8 of the target, no deletes: stays
    worn = data_file("worn", 0, 7 * MB, 7000)  # a third of it deleted
    many_deletes = data_file("many-deletes", 0, 7 * MB, 7000)
    lonely = data_file("lonely", 1, MB, 1000)  # the only file of partition 1: nothing to merge
    pair = [data_file("pair-small", 2, MB, 1000), data_file("pair-worn", 2, 7 * MB, 7000)]
    tasks = [
        *(FileScanTask(data) for data in [*small, full, worn, lonely, pair[0]]),
        FileScanTask(many_deletes, {delete_file(index) for index in range(MANY_DELETE_FILES)}),
        FileScanTask(pair[1]),
    ]
    deleted = deleted_rows({worn: 2400, pair[1]: 2400})
    chosen = choose_files(tasks, deleted, TARGET, delete_ratio=0.3)
    assert {data.file_path for data in chosen} == {
        data.file_path for data in [*small, worn, many_deletes, *pair]
    }


def test_each_partition_gets_as_many_files_as_its_live_bytes_fill_targets() -> None:
    # Partition 0: 20 MB live in ten files -> 3 files. Partition 1: 4 MB in four files, half of
    # their rows deleted -> 2 MB live, 1 file. Partition 2: every row deleted -> no file.
    many = [data_file(f"p0-{index}", 0, 2 * MB, 2000) for index in range(10)]
    halved = [data_file(f"p1-{index}", 1, MB, 1000) for index in range(4)]
    dead = [data_file("p2", 2, MB, 1000)]
    deleted = deleted_rows({**dict.fromkeys(halved, 500), dead[0]: 1000})
    layout = plan_layout([*many, *halved, *dead], deleted, TARGET)

    assert layout.tasks == 3 + 1
    assert {layout.files[data.file_path] for data in many} == {3}
    assert {layout.files[data.file_path] for data in halved} == {1}
    assert dead[0].file_path not in layout.files
    # A partition's files share its tasks, and no two partitions share one.
    ranges = {
        (layout.first_task[data.file_path], layout.files[data.file_path])
        for data in [*many, *halved]
    }
    assert len(ranges) == 2
    tasks_of = [set(range(first, first + files)) for first, files in ranges]
    assert not tasks_of[0] & tasks_of[1] and set().union(*tasks_of) == set(range(layout.tasks))
    # Files are cut by record count only well past a task's share (20,000 rows / 3 files).
    assert layout.max_records_per_file > 20000 / 3 * 1.2

"""Batch folders: where the bookkeeper expects a moniker's deleted-keys files is where writers
put them."""

from __future__ import annotations

from icekeeper.bookkeeper.position_deletes import DELETES_FOLDER
from icekeeper.common.locations import (
    batch_folder_of,
    is_in_batch_folder,
    is_written_by_icekeeper,
)
from icekeeper.common.rewrites import output_folder
from icekeeper.writers.files import batch_folder

LOCATION = "abfss://lake@acct.dfs.core.windows.net/db/items"


def test_writers_batch_folders_are_the_ones_the_bookkeeper_expects() -> None:
    for writer_id in ("w1", "host:1234/x y", ".dot", "ünï"):
        folder = batch_folder(LOCATION, writer_id, 7)
        assert folder.startswith(batch_folder_of(LOCATION, writer_id, 7) + "-")
        assert is_in_batch_folder(f"{folder}/ik_deleted=true/k.parquet", LOCATION, writer_id, 7)


def test_a_file_of_another_batch_or_writer_or_outside_is_not_in_the_batch_folder() -> None:
    own = batch_folder(LOCATION, "w1", 7)
    assert is_in_batch_folder(f"{LOCATION}/data/w1/000000000007/k.parquet", LOCATION, "w1", 7)
    for path in (
        f"{batch_folder(LOCATION, 'w1', 6)}/k.parquet",  # an earlier batch
        f"{batch_folder(LOCATION, 'w2', 7)}/k.parquet",  # another writer's
        f"{LOCATION}/data/w1/0000000000070/k.parquet",  # another seq's folder, same prefix
        f"{LOCATION}/data/w1/000000000007",  # the folder itself
        f"{own}/../{batch_folder(LOCATION, 'w1', 6).rsplit('/', 1)[1]}/k.parquet",
        f"{LOCATION}/icekeeper/k.parquet",
    ):
        assert not is_in_batch_folder(path, LOCATION, "w1", 7), path


def test_the_files_icekeeper_writes_into_a_table_are_known_as_its_own() -> None:
    """What an Event Grid event for a file of icekeeper's own is checked against
    (`bookkeeper/event_grid_files.py`): the writers', the bookkeeper's and the reaper's folders."""
    own = [
        f"{batch_folder(LOCATION, 'host:1234/x y', 7)}/part-0.parquet",
        f"{batch_folder(LOCATION, 'w1', 7)}/_kfk_partition=3/part-0.parquet",
        f"{LOCATION}/data/w1/000000000007/f.parquet",
        f"{position_deletes_folder(LOCATION)}/d.parquet",
        f"{output_folder(LOCATION, 'r1')}/f.parquet",
    ]
    for path in own:
        assert is_written_by_icekeeper(path, LOCATION), path
    for path in (
        f"{LOCATION}/data/other-tool/f.parquet",
        f"{LOCATION}/data/00000-0-3b1e-00001.parquet",  # Iceberg's own writers' names
        f"{LOCATION}/data/day=2026-11-27/000000000007/f.parquet",  # ... in a partition folder
        f"{LOCATION}/data/w1/000000000007",
        "abfss://lake@acct.dfs.core.windows.net/db/other/data/w1/000000000007/f.parquet",
    ):
        assert not is_written_by_icekeeper(path, LOCATION), path


def position_deletes_folder(location: str) -> str:
    return f"{location}/data/{DELETES_FOLDER}"

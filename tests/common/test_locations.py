"""Batch folders: where the bookkeeper expects a moniker's deleted-keys files is where writers
put them."""

from __future__ import annotations

from icekeeper.common.locations import batch_folder_of, is_in_batch_folder
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

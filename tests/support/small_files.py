"""A table of many one-row files, each its own snapshot: what the reaper's tests give it to do."""

from __future__ import annotations

from pathlib import Path

from icekeeper.bench.reaper import append_snapshot_per_file
from icekeeper.common.catalog import DEFAULT_TABLE_PROPERTIES, open_catalog
from icekeeper.common.config import IcekeeperConfig
from tests.support.pipeline import register_catalog
from tests.support.shop_items import SCHEMA, write_file


def small_file_table(spark, config: IcekeeperConfig, files: int, offsets: list[int] | None = None):
    """`shop.items` with `files` one-row files, each its own snapshot (writer partition 9)."""
    offsets = offsets or list(range(files))
    catalog = open_catalog(config)
    catalog.create_namespace("shop")
    table = catalog.create_table("shop.items", schema=SCHEMA, properties=DEFAULT_TABLE_PROPERTIES)
    data = Path(table.location().removeprefix("file://")) / "data" / "history"
    entries = [
        write_file(
            data / f"{index:05d}.parquet",
            SCHEMA,
            [{"id": index, "amount": index, "_kfk_partition": 9, "_kfk_offset": offsets[index]}],
        )
        for index in range(files)
    ]
    register_catalog(spark, config)
    append_snapshot_per_file(spark, config.catalog.name, "shop.items", entries)
    return table.refresh()

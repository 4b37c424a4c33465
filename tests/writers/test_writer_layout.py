"""Where and how files land: partition layout, skew, and the Azure queue transport end to end."""

from __future__ import annotations

import collections
import datetime
import posixpath
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import IntegerType

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.in_flight import live_claimed_folders
from icekeeper.common.locations import normalize_location
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from icekeeper.writers.arrow_engine import task as arrow_task
from icekeeper.writers.job import WriterJob
from icekeeper.writers.spark_sql_engine import table_writer
from tests.support.pipeline import pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]
ORDERS = {
    "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
    "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
    "ICEKEEPER__TABLES__0__MODE": "changelog",
}


def test_files_are_laid_out_by_the_partition_spec_with_icebergs_values(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            **ORDERS,
            "ICEKEEPER__TABLES__0__PARTITION_BY": "['day(_kfk_timestamp)', 'bucket(4, id)']",
        },
    )
    produce_synthetic(
        config,
        SyntheticSpec(seed=4, keys=200, events=2000, schema_changes=0),
        topic=unique_topic,
        progress=lambda m: None,
    )
    WriterJob(config, spark=spark).run(until_idle=True)
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    table = bookkeeper.catalog.load_table("shop.orders")
    assert [f.name for f in table.spec().fields] == ["_kfk_timestamp_day", "id_bucket"]
    bucket = BucketTransform(4).transform(IntegerType())
    tasks = list(table.scan().plan_files())
    assert len({task.file.partition[1] for task in tasks}) == 4
    rows = 0
    for task in tasks:
        day, bucket_value = task.file.partition[0], task.file.partition[1]
        data = pq.read_table(
            task.file.file_path.removeprefix("file://"), columns=["id", "_kfk_timestamp"]
        ).to_pylist()
        rows += len(data)
        assert {bucket(r["id"]) for r in data} == {bucket_value}
        epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
        assert {(r["_kfk_timestamp"] - epoch).days for r in data} == {day}
        assert f"_ik_p1={bucket_value}" in task.file.file_path
    assert rows == 2000
    # A partition filter prunes by these values and still finds every matching row.
    assert table.scan(row_filter="id = 7").to_arrow().num_rows == sum(
        1
        for t in tasks
        for r in pq.read_table(t.file.file_path.removeprefix("file://"), columns=["id"])
        .column("id")
        .to_pylist()
        if r == 7
    )


def test_a_skewed_partition_is_spread_over_tasks_not_piled_onto_one(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    # Every row has the same `_src_db`: one partition value holds the whole batch.
    config = pipeline_config(
        tmp_path, unique_topic, {**ORDERS, "ICEKEEPER__TABLES__0__PARTITION_BY": "[_src_db]"}
    )
    produce_synthetic(
        config,
        SyntheticSpec(seed=9, keys=500, events=6000, schema_changes=0),
        topic=unique_topic,
        partitions=3,
        progress=lambda m: None,
    )
    job = WriterJob(config, spark=spark)
    job.run(until_idle=True)
    [moniker] = job.transport.pending()
    sizes = [entry.record_count for entry in moniker.files]
    assert {entry.partition["_src_db"] for entry in moniker.files} == {"shop"}
    assert len(sizes) >= 3 and max(sizes) <= 0.5 * sum(sizes)


def test_files_follow_the_tables_parquet_properties(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    properties = (
        "{write.parquet.compression-codec: snappy, write.parquet.dict-size-bytes: '1024', "
        "write.parquet.bloom-filter-enabled.column._kfk_offset: 'true'}"
    )
    # spark-sql's mapping to Parquet-mr, which writes a column whose dictionary outgrows the
    # limit all plain; pyarrow (the arrow engine, tests/writers/test_arrow_parquet_properties.py)
    # keeps the first pages' dictionary and writes the rest plain.
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            **ORDERS,
            "ICEKEEPER__TABLES__0__PROPERTIES": properties,
            "ICEKEEPER__WRITER__ENGINE": "spark-sql",
        },
    )
    produce_synthetic(
        config,
        SyntheticSpec(seed=5, keys=300, events=3000, schema_changes=0),
        topic=unique_topic,
        progress=lambda m: None,
    )
    job = WriterJob(config, spark=spark)
    job.run(until_idle=True)
    [moniker] = job.transport.pending()
    for entry in moniker.files:
        footer = pq.ParquetFile(entry.path.removeprefix("file://")).metadata
        chunks = {
            footer.row_group(0).column(i).path_in_schema: footer.row_group(0).column(i)
            for i in range(footer.num_columns)
        }
        assert {chunk.compression for chunk in chunks.values()} == {"SNAPPY"}
        # Unique offsets outgrow a 1 KB dictionary and are written plain; one database name fits.
        assert (
            not chunks["_kfk_offset"].has_dictionary_page and chunks["_src_db"].has_dictionary_page
        )
        assert (
            chunks["_kfk_offset"].bloom_filter_offset and not chunks["_src_db"].bloom_filter_offset
        )
    # The bookkeeper creates the table with the same properties, so Iceberg's own writers agree.
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    assert (
        bookkeeper.catalog.load_table("shop.orders").properties["write.parquet.compression-codec"]
        == "snappy"
    )


def test_monikers_travel_over_the_azure_queue(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    queue = f"monikers-{uuid.uuid4().hex[:8]}"
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            **ORDERS,
            "ICEKEEPER__TRANSPORT__KIND": "azure-queue",
            "ICEKEEPER__TRANSPORT__QUEUE_NAME": queue,
            "ICEKEEPER__TRANSPORT__CONNECTION_STRING": local_stack.service(
                "azurite-queue"
            ).connection_string(),
            "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": "1000",
        },
    )
    produce_synthetic(
        config,
        SyntheticSpec(seed=6, keys=100, events=2500, schema_changes=1),
        topic=unique_topic,
        progress=lambda m: None,
    )
    writer = WriterJob(config, spark=spark)
    writer.run(until_idle=True)
    assert writer.transport.queue.get_queue_properties().approximate_message_count == 3
    assert len(writer.transport.pending()) == 3  # the journal keeps a copy of each pending moniker
    bookkeeper = Bookkeeper(config)
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 3
    assert bookkeeper.transport.queue.get_queue_properties().approximate_message_count == 0
    assert bookkeeper.transport.pending() == []
    rows = bookkeeper.catalog.load_table("shop.orders").scan().to_arrow()
    positions = collections.Counter(
        zip(rows.column("_kfk_partition").to_pylist(), rows.column("_kfk_offset").to_pylist())
    )
    assert len(positions) == rows.num_rows == 2500


@pytest.mark.parametrize(
    ("engine", "module", "writes_files"),
    [
        ("spark-sql", table_writer, "write_parquet"),
        ("arrow", arrow_task, "write_files"),
    ],
)
def test_a_batch_folder_is_claimed_while_written_and_released_once_published(
    local_stack,
    spark,
    tmp_path: Path,
    unique_topic: str,
    monkeypatch: pytest.MonkeyPatch,
    engine: str,
    module: object,
    writes_files: str,
) -> None:
    """Orphan removal spares claimed folders, so a batch longer than the grace keeps its files."""
    config = pipeline_config(
        tmp_path, unique_topic, {**ORDERS, "ICEKEEPER__WRITER__ENGINE": engine}
    )
    produce_synthetic(
        config,
        SyntheticSpec(seed=5, keys=50, events=300, schema_changes=0),
        topic=unique_topic,
        progress=lambda m: None,
    )
    claimed_while_writing: list[set[str]] = []
    real_write = getattr(module, writes_files)

    def write_and_look(rows, output_uri: str, *args, **kwargs):
        location = output_uri.split("/data/")[0]
        claimed_while_writing.append(
            live_claimed_folders(location, config.group.orphan_grace, remove_stale=False)
        )
        return real_write(rows, output_uri, *args, **kwargs)

    # The arrow engine's small batch runs its tasks in this process, so the patch sees them.
    monkeypatch.setattr(module, writes_files, write_and_look)
    job = WriterJob(config, spark=spark)
    job.run(until_idle=True)
    [moniker] = job.transport.pending()
    folders = {normalize_location(posixpath.dirname(entry.path)) for entry in moniker.files}
    assert claimed_while_writing
    assert all(claimed == folders for claimed in claimed_while_writing)
    assert (
        live_claimed_folders(moniker.table_location, config.group.orphan_grace, remove_stale=False)
        == set()
    )

"""The `spark-sql` engine's files carry Iceberg's partition values and hold records: an empty
string partition is not taken for a null (Spark names both folders `__HIVE_DEFAULT_PARTITION__`),
and a write task with none of a table's rows leaves no file in its moniker."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient

from icekeeper.common.catalog import default_table_location
from icekeeper.readers import duckdb_connection
from icekeeper.samples.debezium import BinlogPosition, Column, TableShape, envelope
from icekeeper.samples.produce import ConfluentAvroFramer, ensure_topic
from icekeeper.writers.job import WriterJob
from tests.support.pipeline import commit_all, pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]

COLUMNS = (Column("id", "int", optional=False), Column("color", "string"))
COLORS = {1: "red", 2: "", 3: None, 4: "", 5: None, 6: "red"}
"""Items by id; the other table gets the same rows, in the topic's second partition only."""


def _produce(bootstrap_servers: str, registry_url: str, topic: str) -> None:
    """shop.items' changes in both of the topic's partitions; shop.other's in partition 1 only,
    so the first write task (partition 0) has none of shop.other's rows."""
    ensure_topic(bootstrap_servers, topic, 2)
    framer = ConfluentAvroFramer(SchemaRegistryClient({"url": registry_url}), topic)
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    for name, partitions in (("items", (0, 1)), ("other", (1,))):
        shape = TableShape(server="s", db="shop", table=name, columns=COLUMNS, key=("id",))
        schema_id = framer.schema_id(shape.value_schema(), is_key=False)
        for item, color in COLORS.items():
            at = BinlogPosition(ts_ms=1_767_225_600_000 + item, file="b.1", pos=item, gtid="g")
            row = {"id": item, "color": color}
            producer.produce(
                topic,
                key=f"{name}-{item}".encode(),
                value=framer.frame(schema_id, envelope(shape, "c", None, row, at, at.ts_ms)),
                partition=partitions[item % len(partitions)],
            )
    producer.flush()


def test_spark_sql_keeps_empty_string_partitions_and_writes_no_empty_files(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__WRITER__ENGINE": "spark-sql",
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.items",
            "ICEKEEPER__TABLES__0__SOURCE_TABLE": "items",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
            "ICEKEEPER__TABLES__0__PARTITION_BY": "[color, 'truncate(3, color)']",
            "ICEKEEPER__SOURCES__0__TABLE_TEMPLATE": "cdc.{db}_{table}",
        },
    )
    source = config.sources[0]
    _produce(source.bootstrap_servers, source.schema_registry_url, unique_topic)
    job = WriterJob(config, spark=spark)
    job.run(until_idle=True)
    listed: dict[str, set[str]] = {}
    for moniker in job.transport.pending():
        assert all(entry.record_count for entry in moniker.files)
        listed.setdefault(moniker.table, set()).update(
            entry.path.removeprefix("file://") for entry in moniker.files
        )
    assert set(listed) == {"shop.items", "cdc.shop_other"}
    for identifier, paths in listed.items():
        # No file is left in the batch folders but the ones listed, which hold every row.
        data = Path(default_table_location(config, identifier).removeprefix("file://")) / "data"
        on_disk = {str(path) for path in data.rglob("*.parquet")}
        assert on_disk == paths
        assert sum(pq.ParquetFile(path).metadata.num_rows for path in paths) == len(COLORS)

    bookkeeper = commit_all(config)
    items = bookkeeper.catalog.load_table("shop.items")
    assert all(items.inspect.files().column("record_count").to_pylist())

    def ids(row_filter: str) -> list[int]:
        """Ids matching `row_filter` through pyiceberg's scan, which prunes files by partition."""
        return sorted(items.scan(row_filter=row_filter).to_arrow().column("id").to_pylist())

    assert ids("color = ''") == [2, 4]
    assert ids("color IS NULL") == [3, 5]
    assert ids("color = 'red'") == [1, 6]
    connection = duckdb_connection()
    try:
        scan = f"iceberg_scan('{items.metadata_location}')"
        blank = connection.execute(f"SELECT id FROM {scan} WHERE color = '' ORDER BY id")
        assert [row[0] for row in blank.fetchall()] == [2, 4]
        null = connection.execute(f"SELECT id FROM {scan} WHERE color IS NULL ORDER BY id")
        assert [row[0] for row in null.fetchall()] == [3, 5]
    finally:
        connection.close()
    # The files' partitions are the values Iceberg computes (identity and truncate of strings).
    partitions = {
        (task.file.partition[0], task.file.partition[1]) for task in items.scan().plan_files()
    }
    assert partitions == {("red", "red"), ("", ""), (None, None)}

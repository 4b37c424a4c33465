"""Every engine reads the tables on S3 from `catalog.properties` alone (issue 28, item 1).

A user writes the storage properties once, in pyiceberg's names (`s3.endpoint`,
`s3.access-key-id`, ...); pyiceberg writes the table, and DuckDB (`duckdb_connection`: its S3
secret) and Spark (`spark_session`, as the writer and the reaper start it: Iceberg's S3FileIO with
the same properties under Iceberg's names, its bundle on the classpath) read it and append to it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.catalog import open_catalog
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.parquet_files import NoHadoopFileSystem, write_parquet
from icekeeper.common.storage import list_files, read_lines
from icekeeper.common.transports import open_transport
from icekeeper.readers import duckdb_connection, duckdb_rows
from tests.support.object_stores import azure_uri, azurite_blob_properties, new_container
from tests.support.shop_items import bookkeeper_config, make_moniker

SPARK_SCRIPT = """
import sys
from icekeeper.common.config import load_config
from icekeeper.common.spark import spark_session

config = load_config(sys.argv[1])
spark = spark_session(config, "engines-on-s3")
name = f"{config.catalog.name}.shop.items"
spark.sql(f"INSERT INTO {name} VALUES (4), (5)")
print("COUNT", spark.table(name).count())
spark.stop()
"""


@pytest.mark.integration
def test_pyiceberg_duckdb_and_spark_share_a_table_on_s3(tmp_path: Path, s3_storage) -> None:
    prefix = s3_storage.uri(f"engines-{uuid.uuid4().hex[:8]}")
    properties = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"{prefix}/warehouse",
        **s3_storage.pyiceberg_properties(),
    }
    config = bookkeeper_config(tmp_path, catalog__properties=json.dumps(properties))
    catalog = open_catalog(config)
    catalog.create_namespace_if_not_exists("shop")
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64())})
    table = catalog.create_table("shop.items", schema=rows.schema)
    table.append(rows)
    assert table.location().startswith("s3://")

    connection = duckdb_connection()  # the door's S3 secret, from the same properties
    scan = f"iceberg_scan('{table.metadata_location}')"
    assert connection.execute(f"SELECT count(*) FROM {scan}").fetchone()[0] == 3

    config_path = tmp_path / "icekeeper.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")), encoding="utf-8")
    spark = subprocess.run(
        [sys.executable, "-c", SPARK_SCRIPT, str(config_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert spark.returncode == 0, spark.stderr[-4000:]
    assert "COUNT 5" in spark.stdout

    table = catalog.load_table("shop.items")
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3, 4, 5]
    paths = table.inspect.files()["file_path"].to_pylist()
    assert len(paths) >= 2 and all(path.startswith(f"{prefix}/warehouse/") for path in paths)


def azure_config(tmp_path: Path, local_stack) -> tuple[IcekeeperConfig, str]:
    """Seed 003's storage: the warehouse, the monikers, the lease and the commit report all on
    Azure Blob (Azurite) in the one URI form `abfss://<container>@<account>.dfs...`; and the
    prefix they are under."""
    storage = azurite_blob_properties(local_stack.service("azurite-blob"))
    prefix = azure_uri(new_container(storage), "icekeeper").rstrip("/")
    properties = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"{prefix}/warehouse",
        **storage,
    }
    config = bookkeeper_config(
        tmp_path,
        catalog__properties=json.dumps(properties),
        group__lease_uri=f"{prefix}/leases",
        transport__uri=f"{prefix}/txlog",
        transport__dead_letter_uri=f"{prefix}/dead-letter",
        bookkeeper__commit_report_path=f"{prefix}/reports/commits.jsonl",
    )
    return config, prefix


def commit_on_azure(config: IcekeeperConfig) -> None:
    """Three monikers (30 rows) committed by one bookkeeper cycle, holding the lease."""
    open_catalog(config)  # configures this process's door, as the bookkeeper's
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    assert bookkeeper.take_lease(timeout_s=5) == 1
    for seq in (1, 2, 3):
        transport.publish(make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 10, seq * 10)))
    bookkeeper.run_cycle()
    assert transport.pending() == []


@pytest.mark.integration
def test_the_bookkeeper_commits_a_table_on_azure_blob(tmp_path: Path, local_stack) -> None:
    """pyiceberg's own IO cannot open the `abfss://<container>@<account>...` form; it goes through
    the door (`common/door_fileio.py`)."""
    config, prefix = azure_config(tmp_path, local_stack)
    commit_on_azure(config)
    table = open_catalog(config).load_table("shop.items")
    assert table.location().startswith(f"{prefix}/warehouse/")
    assert sorted(table.scan().to_arrow()["_kfk_offset"].to_pylist()) == list(range(30))
    assert [info.base_name for info in list_files(f"{prefix}/leases/{config.group.name}")] == [
        "lease-000000000001.json"
    ]
    assert len(read_lines(config.bookkeeper.commit_report_path)) >= 1


@pytest.mark.integration
def test_duckdb_reads_what_the_bookkeeper_committed_on_azure(tmp_path: Path, local_stack) -> None:
    """DuckDB, with the door's Azure secret (`duckdb_connection`), reads the table through the
    Blob endpoint (`az://`): its `iceberg_scan` follows the metadata's `abfss://` paths to the
    DFS endpoint, which Azurite does not serve (`readers.duckdb_source`)."""
    config, _ = azure_config(tmp_path, local_stack)
    commit_on_azure(config)
    table = open_catalog(config).load_table("shop.items")
    rows = duckdb_rows(table, "_kfk_offset", order_by="_kfk_offset")
    assert [row["_kfk_offset"] for row in rows] == list(range(30))


@pytest.mark.integration
def test_spark_reads_and_appends_what_the_bookkeeper_committed_on_azure(
    tmp_path: Path, local_stack
) -> None:
    """Spark, as the writer and the reaper start it, opens the same table through Iceberg's
    ADLSFileIO, mapped from the same `adls.*` properties (its bundle on the classpath)."""
    config, prefix = azure_config(tmp_path, local_stack)
    commit_on_azure(config)
    config_path = tmp_path / "icekeeper.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")), encoding="utf-8")
    spark = subprocess.run(
        [
            sys.executable,
            "-c",
            SPARK_SCRIPT.replace("VALUES (4), (5)", SPARK_ROWS),
            str(config_path),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert spark.returncode == 0, spark.stderr[-4000:]
    assert "COUNT 32" in spark.stdout
    table = open_catalog(config).load_table("shop.items")
    assert len(table.scan().to_arrow()) == 32
    paths = table.inspect.files()["file_path"].to_pylist()
    assert all(path.startswith(f"{prefix}/warehouse/") for path in paths)


SPARK_ROWS = "VALUES (1001, 1, 0, 1001), (1002, 2, 0, 1002)"


@pytest.mark.spark
def test_spark_s_own_parquet_writes_to_azure_name_the_driver_they_lack(spark) -> None:
    """The `spark-sql` engine and upsert compaction write with Spark's Parquet writer, through
    Hadoop's FileSystem, which has no `abfss` driver in PySpark: the error says what to add."""
    with pytest.raises(NoHadoopFileSystem, match="org.apache.hadoop:hadoop-azure:3.4.2"):
        write_parquet(spark.range(3), azure_uri("lake", "t/data/batch"), [], 1000)

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

from icekeeper.common.catalog import open_catalog
from icekeeper.readers import duckdb_connection
from tests.support.shop_items import bookkeeper_config

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

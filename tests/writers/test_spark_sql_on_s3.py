"""The `spark-sql` writer engine end to end with everything on S3 (issue 28, items 1-2): the
writer, run as a user runs it (`icekeeper writer`, its own Spark session with Hadoop's s3a and
Iceberg's S3FileIO from `catalog.properties`), writes the tables' Parquet and its monikers to the
stack's S3 server; the bookkeeper commits a changelog and an upsert table; a reaper pass removes
an orphan (listed through the storage door); Spark, DuckDB and pyiceberg read what the topic
holds."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from icekeeper.common.storage import file_exists, write_file
from icekeeper.readers import duckdb_rows
from icekeeper.reaper.service import Reaper
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec, expected_state
from tests.support.pipeline import commit_all, pipeline_config, register_catalog
from tests.support.shop_items import GRACE_S

pytestmark = [pytest.mark.integration, pytest.mark.spark]

MIRROR = "shop.orders"
CHANGES = "shop.order_changes"


def test_the_spark_sql_engine_writes_tables_on_s3(
    local_stack, s3_storage, spark, tmp_path: Path, unique_topic: str
) -> None:
    prefix = s3_storage.uri(f"sparksql-{uuid.uuid4().hex[:8]}").rstrip("/")
    properties = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"{prefix}/warehouse",
        **s3_storage.pyiceberg_properties(),
    }
    tables = [
        {"identifier": MIRROR, "topics": [unique_topic], "primary_key": ["id"], "mode": "upsert"},
        {
            "identifier": CHANGES,
            "topics": [unique_topic],
            "primary_key": ["id"],
            "mode": "changelog",
        },
    ]
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__CATALOG__PROPERTIES": json.dumps(properties),
            "ICEKEEPER__TABLES": json.dumps(tables),
            "ICEKEEPER__WRITER__ENGINE": "spark-sql",
            "ICEKEEPER__WRITER__CHECKPOINT_URI": f"{prefix}/writer-checkpoints",
            "ICEKEEPER__TRANSPORT__URI": f"{prefix}/txlog",
            "ICEKEEPER__TRANSPORT__DEAD_LETTER_URI": f"{prefix}/dead-letter/monikers",
            "ICEKEEPER__GROUP__LEASE_URI": f"{prefix}/leases",
            "ICEKEEPER__GROUP__ORPHAN_GRACE": str(GRACE_S),
            "ICEKEEPER__BOOKKEEPER__COMMIT_REPORT_PATH": f"{prefix}/reports/commits.jsonl",
            "ICEKEEPER__BOOKKEEPER__HTTP_PORT": "0",
            "ICEKEEPER__REAPER__REPORT_PATH": f"{prefix}/reports/reaper.jsonl",
            "ICEKEEPER__REAPER__HTTP_PORT": "0",
        },
    )
    spec = SyntheticSpec(seed=83, keys=60, events=900, schema_changes=0)
    produced = produce_synthetic(config, spec, topic=unique_topic, progress=lambda m: None)
    assert produced["records"] == spec.events

    config_path = tmp_path / "icekeeper.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")), encoding="utf-8")
    writer = subprocess.run(
        [sys.executable, "-m", "icekeeper.cli", "writer", "-c", str(config_path), "--until-idle"],
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert writer.returncode == 0, writer.stderr[-4000:]

    bookkeeper = commit_all(config)
    assert bookkeeper.transport.pending() == []
    catalog = bookkeeper.catalog
    changes = catalog.load_table(CHANGES)
    paths = changes.inspect.files()["file_path"].to_pylist()
    assert paths and all(
        path.startswith(f"{prefix}/warehouse/shop/order_changes/") for path in paths
    )
    arrow = changes.scan().to_arrow()
    positions = collections.Counter(
        zip(arrow["_kfk_partition"].to_pylist(), arrow["_kfk_offset"].to_pylist())
    )
    assert len(arrow) == len(positions) == spec.events
    expected = {key: row["amount"] for key, row in expected_state(spec).items() if row is not None}
    mirror = catalog.load_table(MIRROR).scan().to_arrow()
    assert dict(zip(mirror["id"].to_pylist(), mirror["amount"].to_pylist())) == expected

    orphan = f"{changes.location()}/data/crashed-writer/orphan.parquet"
    write_file(orphan, b"not referenced by any snapshot")
    time.sleep(GRACE_S + 1)
    name = register_catalog(spark, config)
    report = Reaper(config, spark=spark).run_pass()
    by_table = {table.table: table for table in report.tables}
    assert by_table[CHANGES].errors == [] and by_table[CHANGES].orphans_removed == 1
    assert not file_exists(orphan)

    assert spark.sql(f"SELECT count(*) FROM {name}.{CHANGES}").collect()[0][0] == spec.events
    spark_mirror = spark.sql(f"SELECT id, amount FROM {name}.{MIRROR}").collect()
    assert {row["id"]: row["amount"] for row in spark_mirror} == expected
    duck_mirror = duckdb_rows(catalog.load_table(MIRROR), "id, amount")
    assert {row["id"]: row["amount"] for row in duck_mirror} == expected
    assert len(catalog.load_table(CHANGES).scan().to_arrow()) == spec.events

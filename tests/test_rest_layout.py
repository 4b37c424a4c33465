"""Issue 28 item 6, S3 + REST catalog: the pipeline end to end on a production layout. Seed 000's
stream goes through Kafka to the writer (the shared SparkSession), whose files land on the
stack's S3 server; the bookkeeper commits an upsert table and a changelog table through the
Iceberg REST catalog server; a reaper pass compacts and removes orphans; Spark and DuckDB read
both tables through the same REST catalog."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from icekeeper.common.catalog import open_catalog
from icekeeper.common.spark import iceberg_catalog_conf
from icekeeper.common.storage import file_exists, write_file
from icekeeper.readers import duckdb_connection
from icekeeper.reaper.service import Reaper
from icekeeper.samples.produce import produce_seed_sample
from icekeeper.writers.job import WriterJob
from tests.support.pipeline import commit_all, pipeline_config, register_catalog
from tests.support.seed000 import ARTICLE_RESULT

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SEED_TABLE = "db_gb18030_test.tbl_test_1"
AUDIT_TABLE = "db_gb18030_test.tbl_test_1_audit"
GRACE_S = 5


def test_seed_000_through_kafka_s3_and_the_rest_catalog(
    local_stack, rest_catalog, spark, tmp_path: Path, unique_topic: str
) -> None:
    warehouse = f"{rest_catalog.warehouse()}/e2e_{uuid.uuid4().hex[:8]}"
    namespace_location = f"{warehouse}/db_gb18030_test"
    properties = {**rest_catalog.pyiceberg_properties(), "warehouse": warehouse}
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__CATALOG__PROPERTIES": json.dumps(properties),
            # Distinct per test (the REST server is shared): the tables' own locations.
            "ICEKEEPER__TABLES__0__IDENTIFIER": f"ns_{uuid.uuid4().hex[:8]}.tbl_test_1",
            "ICEKEEPER__TABLES__0__LOCATION": f"{namespace_location}/tbl_test_1",
            "ICEKEEPER__TABLES__1__IDENTIFIER": f"ns_{uuid.uuid4().hex[:8]}.tbl_test_1_audit",
            "ICEKEEPER__TABLES__1__TOPICS": f"[{unique_topic}]",
            "ICEKEEPER__TABLES__1__MODE": "changelog",
            "ICEKEEPER__TABLES__1__LOCATION": f"{namespace_location}/tbl_test_1_audit",
            "ICEKEEPER__REAPER__SNAPSHOT_EXPIRE_TIME": "0",
            "ICEKEEPER__REAPER__RETAIN_LAST": "1",
            "ICEKEEPER__GROUP__ORPHAN_GRACE": str(GRACE_S),
        },
    )
    upsert_table, audit_table = config.tables[0].identifier, config.tables[1].identifier
    produce_seed_sample(config, topic=unique_topic, progress=lambda m: None)
    job = WriterJob(config, spark=spark)
    assert sum(r.records_read for r in job.run(until_idle=True)) == 26
    for moniker in job.transport.pending():
        assert all(entry.path.startswith("s3://") for entry in moniker.files)
    bookkeeper = commit_all(config)
    assert job.transport.pending() == []

    catalog = open_catalog(config)
    table = catalog.load_table(audit_table)
    orphan = f"{table.location()}/data/lost/{uuid.uuid4().hex}.parquet"
    write_file(orphan, b"a file no snapshot names")
    time.sleep(GRACE_S + 1)
    register_catalog(spark, config)
    for key, value in iceberg_catalog_conf(config).items():
        if key.startswith("spark.hadoop."):  # the shared session runs already
            spark.conf.set(key.removeprefix("spark.hadoop."), value)
    report = Reaper(config, spark=spark).run_pass()
    assert all(not result.errors for result in report.tables), report
    assert sum(result.orphans_removed for result in report.tables) >= 1
    assert not file_exists(orphan)

    name = config.catalog.name
    upsert = spark.sql(f"SELECT ID1, C2 FROM {name}.{upsert_table} ORDER BY ID1").collect()
    assert [(row.ID1, row.C2) for row in upsert] == [
        (key, result[0][0]) for key, result in sorted(ARTICLE_RESULT.items())
    ]
    assert spark.sql(f"SELECT count(*) FROM {name}.{audit_table}").collect()[0][0] == 26
    connection = duckdb_connection()
    try:
        for statement in rest_catalog.duckdb_statements("rest"):
            connection.execute(statement)
        assert connection.execute(
            f"SELECT ID1, C2 FROM rest.{upsert_table} ORDER BY ID1"
        ).fetchall() == [(row.ID1, row.C2) for row in upsert]
        assert connection.execute(f"SELECT count(*) FROM rest.{audit_table}").fetchone() == (26,)
    finally:
        connection.close()
    bookkeeper.committer.close()


@pytest.mark.heavy
def test_quick_chaos_on_s3_and_the_rest_catalog(
    local_stack, rest_catalog, stack_config, tmp_path: Path
) -> None:
    """`icekeeper chaos` (kills, a paused bookkeeper fenced by a second one) with its tables in the
    REST catalog and their files on S3; the same checks as the quick run on the default layout."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    from icekeeper.chaos import CHANGELOG_TABLE, UPSERT_TABLE, run_chaos

    properties = {
        **rest_catalog.pyiceberg_properties(),
        "warehouse": f"{rest_catalog.warehouse()}/chaos_{uuid.uuid4().hex[:8]}",
    }
    catalog = load_catalog("chaos", **rest_catalog.pyiceberg_properties())
    for identifier in (CHANGELOG_TABLE, UPSERT_TABLE):  # a run's tables must be new
        try:
            catalog.drop_table(identifier)
        except NoSuchTableError:
            pass
    base = stack_config.model_copy(update={"state_dir": str(tmp_path)})
    result = run_chaos(
        base,
        records=2000,
        kills=3,
        seed=2,
        progress=print,
        timeout_s=900,
        reassignments=0,
        catalog_properties=properties,
    )
    summary = {
        key: value
        for key, value in result.items()
        if key not in ("upsert_by_engine", "changelog_by_engine")
    }
    print("chaos result:", summary)
    assert result["kills"] == 3 and result["fenced_exit_code"] == 3, summary
    assert result["duplicates"] == 0 and result["missing"] == 0, summary
    assert result["upsert_duplicate_keys"] == 0 and result["upsert_mismatched"] == 0, summary
    assert result["spark_rows"] == result["duckdb_rows"] == result["rows"], summary
    assert result["failures"] == [], result["failures"]
    table = catalog.load_table(CHANGELOG_TABLE)
    assert table.location().startswith(properties["warehouse"] + "/")

"""Issue 28 item 6, S3 + REST catalog: the pipeline end to end on a production layout, configured
as docs/deployment.md's `s3-rest` block says (item 7: that block works as written; only what a
user changes is changed, tests/support/deployment_docs.py). A synthetic change stream (two schema
changes) goes through Kafka to the writer (the shared SparkSession), whose files land on the
stack's S3 server; the bookkeeper commits the upsert table and the changelog table through the
Iceberg REST catalog server; a reaper pass compacts and removes orphans; Spark and DuckDB read
both tables through the same REST catalog."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from icekeeper.common.catalog import open_catalog
from icekeeper.common.spark import iceberg_catalog_conf
from icekeeper.common.storage import file_exists, write_file
from icekeeper.readers import duckdb_connection
from icekeeper.reaper.service import Reaper
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec, expected_state
from icekeeper.writers.job import WriterJob
from tests.support.deployment_docs import deployment_config, session_endpoints
from tests.support.pipeline import commit_all, register_catalog

pytestmark = [pytest.mark.integration, pytest.mark.spark]

GRACE_S = 5
SPEC = SyntheticSpec(seed=28, keys=40, events=400, schema_changes=2)


def test_the_s3_and_rest_catalog_layout_of_the_deployment_page(
    local_stack,
    rest_catalog,
    spark,
    tmp_path: Path,
    unique_topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = deployment_config(
        "s3-rest",
        tmp_path,
        unique_topic,
        monkeypatch,
        session_endpoints(s3=rest_catalog.storage.pyiceberg_properties()),
        catalog_uri=rest_catalog.address(),
        # The REST server is shared: the tables' and the roles' files in a folder of the test's own.
        store_root=f"{rest_catalog.warehouse()}/t{uuid.uuid4().hex[:10]}/",
        timings={
            ("reaper", "snapshot_expire_time"): 0,
            ("reaper", "retain_last"): 1,
            ("group", "orphan_grace"): GRACE_S,
        },
    )
    upsert_table = next(spec.identifier for spec in config.tables if spec.upsert)
    audit_table = next(spec.identifier for spec in config.tables if not spec.upsert)
    produced = produce_synthetic(config, SPEC, topic=unique_topic, progress=lambda m: None)
    job = WriterJob(config, spark=spark)
    assert sum(r.records_read for r in job.run(until_idle=True)) == produced["records"]
    assert produced["records"] == SPEC.events
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

    expected = sorted(
        (key, row["amount"]) for key, row in expected_state(SPEC).items() if row is not None
    )
    name = config.catalog.name
    upsert = spark.sql(f"SELECT id, amount FROM {name}.{upsert_table} ORDER BY id").collect()
    assert [(row.id, row.amount) for row in upsert] == expected
    assert spark.sql(f"SELECT count(*) FROM {name}.{audit_table}").collect()[0][0] == SPEC.events
    connection = duckdb_connection()
    try:
        for statement in rest_catalog.duckdb_statements("rest"):
            connection.execute(statement)
        assert (
            connection.execute(f"SELECT id, amount FROM rest.{upsert_table} ORDER BY id").fetchall()
            == expected
        )
        assert connection.execute(f"SELECT count(*) FROM rest.{audit_table}").fetchone() == (
            SPEC.events,
        )
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

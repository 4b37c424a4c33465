"""The pipeline on the shared catalogs users run on premises (issue 28, item 6): Hive Metastore
3.1.3 and a SQL catalog in PostgreSQL, the warehouse on the stack's S3 server, configured as
docs/deployment.md's `onprem-hive` and `onprem-postgresql` blocks say (item 7: those blocks work
as written; only what a user changes is changed, tests/support/deployment_docs.py). A writer's
batch from Kafka, the bookkeeper's commit of an upsert and a changelog table, a second batch, the
reaper's pass (compaction, expiry, orphan removal through Spark's Iceberg catalog on the same
metastore or database), then Spark and DuckDB read what was committed, through the same
catalog."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from icekeeper.common.catalog import open_catalog
from icekeeper.common.spark import iceberg_catalog_conf
from icekeeper.localstack.catalog_service import CatalogService
from icekeeper.readers import duckdb_rows
from icekeeper.reaper.service import Reaper
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec, expected_state
from icekeeper.writers.job import WriterJob
from tests.support.deployment_docs import deployment_config, session_endpoints
from tests.support.pipeline import commit_all, register_catalog

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SPEC = SyntheticSpec(seed=28, keys=30, events=60, schema_changes=0, poison_ratio=0)
LIVE_KEYS = sorted(key for key, row in expected_state(SPEC).items() if row is not None)
"""The upsert table's keys after the stream (and after the same stream again)."""


def records(table) -> int:
    """The table's rows, checked to hold each Kafka record once."""
    rows = table.scan().to_arrow()
    offsets = set(zip(rows["_kfk_partition"].to_pylist(), rows["_kfk_offset"].to_pylist()))
    assert len(offsets) == rows.num_rows
    return rows.num_rows


def live_keys(table) -> list[int]:
    """The upsert table's keys, checked to be there once each."""
    keys = table.scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
    assert len(keys) == len(set(keys))
    return sorted(keys)


@pytest.fixture(
    params=[
        # Its run took 2-5 minutes on a loaded 2-core machine (PostgreSQL's: about one).
        pytest.param(("onprem-hive", "hive_metastore"), marks=pytest.mark.heavy, id="onprem-hive"),
        pytest.param(("onprem-postgresql", "pg_catalog"), id="onprem-postgresql"),
    ]
)
def onprem_layout(request) -> tuple[str, CatalogService]:
    """A block of the deployment page, and the stack's catalog service it runs on."""
    name, fixture = request.param
    return name, request.getfixturevalue(fixture)


def test_a_writer_batch_a_commit_and_a_reaper_pass_then_spark_and_duckdb_read(
    onprem_layout: tuple[str, CatalogService],
    local_stack,
    spark,
    tmp_path: Path,
    unique_topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layout, service = onprem_layout
    config = deployment_config(
        layout,
        tmp_path,
        unique_topic,
        monkeypatch,
        session_endpoints(s3=service.storage.pyiceberg_properties()),
        catalog_uri=service.pyiceberg_properties()["uri"],
        store_root=f"{service.warehouse()}/t{uuid.uuid4().hex[:10]}/",
        timings={("reaper", "snapshot_expire_time"): 0, ("reaper", "retain_last"): 1},
    )
    mirror = next(spec.identifier for spec in config.tables if spec.upsert)
    changes = next(spec.identifier for spec in config.tables if not spec.upsert)
    produced = produce_synthetic(config, SPEC, unique_topic, progress=lambda message: None)
    name = register_catalog(spark, config)
    # The session runs already: Hadoop's s3a settings (the reaper's orphan listing) go in
    # without their `spark.hadoop.` prefix; a role's own session has them from its start.
    for key, value in iceberg_catalog_conf(config).items():
        if key.startswith("spark.hadoop."):
            spark.conf.set(key.removeprefix("spark.hadoop."), value)
    writer = WriterJob(config, spark=spark)
    first = writer.run_batch()
    assert first.records_read == produced["records"] == SPEC.events
    bookkeeper = commit_all(config)
    catalog = open_catalog(config)
    warehouse = config.catalog.properties["warehouse"]
    for identifier in (mirror, changes):
        assert catalog.load_table(identifier).location().startswith(warehouse + "/")
    assert records(catalog.load_table(changes)) == SPEC.events
    assert live_keys(catalog.load_table(mirror)) == LIVE_KEYS

    # A second batch (the same changes again), so that the reaper has files to compact and
    # snapshots to expire.
    produce_synthetic(config, SPEC, unique_topic, progress=lambda message: None)
    assert writer.run_batch().records_read == SPEC.events
    commit_all(config)
    before = open_catalog(config).load_table(changes)
    assert len(before.snapshots()) >= 2

    report = Reaper(config, spark=spark).run_pass()
    by_table = {table_report.table: table_report for table_report in report.tables}
    assert sorted(by_table) == sorted((mirror, changes))
    assert all(not table_report.errors for table_report in report.tables), report
    assert by_table[changes].snapshots_expired >= 1

    catalog = open_catalog(config)
    assert records(catalog.load_table(changes)) == 2 * SPEC.events
    assert live_keys(catalog.load_table(mirror)) == LIVE_KEYS
    for identifier, rows in ((changes, 2 * SPEC.events), (mirror, len(LIVE_KEYS))):
        spark.sql(f"REFRESH TABLE {name}.{identifier}")
        assert spark.table(f"{name}.{identifier}").count() == rows
        assert len(duckdb_rows(catalog.load_table(identifier), "id")) == rows
    assert bookkeeper.transport.pending() == []

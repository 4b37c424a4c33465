"""The pipeline on the shared catalogs users run (issue 28, item 6): Hive Metastore 3.1.3 and a
SQL catalog in PostgreSQL, the warehouse on the stack's S3 server. A writer's batch from Kafka,
the bookkeeper's commit, the reaper's pass (compaction, expiry, orphan removal through Spark's
Iceberg catalog on the same metastore or database), then Spark and DuckDB read what was
committed, through the same catalog."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from icekeeper.common.catalog import open_catalog
from icekeeper.common.spark import iceberg_catalog_conf
from icekeeper.readers import duckdb_rows
from icekeeper.reaper.service import Reaper
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from icekeeper.writers.job import WriterJob
from tests.support.hms_pg_layouts import LAYOUTS, CatalogLayout, catalog_layout_for
from tests.support.pipeline import commit_all, pipeline_config, register_catalog

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SPEC = SyntheticSpec(seed=28, keys=30, events=60, schema_changes=0, poison_ratio=0)


def records(table) -> int:
    """The table's rows, checked to hold each Kafka record once."""
    rows = table.scan().to_arrow()
    offsets = set(zip(rows["_kfk_partition"].to_pylist(), rows["_kfk_offset"].to_pylist()))
    assert len(offsets) == rows.num_rows
    return rows.num_rows


@pytest.fixture(
    params=[
        # Its run took 2-5 minutes on a loaded 2-core machine (PostgreSQL's: about one).
        pytest.param(LAYOUTS[0], marks=pytest.mark.heavy),
        LAYOUTS[1],
    ]
)
def catalog_layout(request) -> CatalogLayout:
    return catalog_layout_for(request.getfixturevalue(request.param))


def test_a_writer_batch_a_commit_and_a_reaper_pass_then_spark_and_duckdb_read(
    catalog_layout: CatalogLayout, local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    identifier = f"ns_{uuid.uuid4().hex[:8]}.orders"  # a metastore's namespaces are shared
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            **catalog_layout.environ(),
            "ICEKEEPER__TABLES__0__IDENTIFIER": identifier,
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
            "ICEKEEPER__REAPER__SNAPSHOT_EXPIRE_TIME": "0",
            "ICEKEEPER__REAPER__RETAIN_LAST": "1",
            "ICEKEEPER__REAPER__HTTP_PORT": "0",
            "ICEKEEPER__BOOKKEEPER__HTTP_PORT": "0",
        },
    )
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
    table = open_catalog(config).load_table(identifier)
    assert table.location().startswith(catalog_layout.warehouse + "/")
    assert records(table) == SPEC.events

    # A second batch, so that the reaper has files to compact and snapshots to expire.
    produce_synthetic(config, SPEC, unique_topic, progress=lambda message: None)
    assert writer.run_batch().records_read == SPEC.events
    commit_all(config)
    before = open_catalog(config).load_table(identifier)
    assert len(before.snapshots()) >= 2

    report = Reaper(config, spark=spark).run_pass()
    [table_report] = report.tables
    assert not table_report.errors, table_report.errors
    assert table_report.snapshots_expired >= 1

    table = open_catalog(config).load_table(identifier)
    assert records(table) == 2 * SPEC.events
    spark.sql(f"REFRESH TABLE {name}.{identifier}")
    assert spark.table(f"{name}.{identifier}").count() == 2 * SPEC.events
    assert len(duckdb_rows(table, "_kfk_offset")) == 2 * SPEC.events
    assert bookkeeper.transport.pending() == []

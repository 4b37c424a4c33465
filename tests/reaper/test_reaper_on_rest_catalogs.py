"""The reaper's pass on tables of the stack's Iceberg REST catalogs (the REST fixture server and
Nessie), the warehouse on its S3 server: compaction, expiry and orphan removal through Spark's
Iceberg actions on the same catalog (on Nessie's tables compaction only: `gc_disabled`), the
bookkeeper committing after it, and Spark and DuckDB (attached to the REST catalog) reading the
same rows."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.catalog import open_catalog
from icekeeper.common.committed_state import committed_state
from icekeeper.common.spark import iceberg_catalog_conf
from icekeeper.common.storage import file_exists, write_file
from icekeeper.common.transports import open_transport
from icekeeper.readers import duckdb_connection, spark_rows
from icekeeper.reaper.service import Reaper
from tests.support.catalog_layouts import S3Writer, layout_config, table_of
from tests.support.pipeline import register_catalog
from tests.support.shop_items import GRACE_S

pytestmark = [pytest.mark.integration, pytest.mark.spark]

COLUMNS = "_kfk_partition, _kfk_offset, amount"


@pytest.fixture(params=("rest_catalog", "nessie_catalog"))
def rest_service(request):
    return request.getfixturevalue(request.param)


def duckdb_rows_through(service, identifier: str) -> list[tuple]:
    """The table's rows as DuckDB reads them, attached to the REST catalog."""
    connection = duckdb_connection()
    try:
        for statement in service.duckdb_statements("rest"):
            connection.execute(statement)
        return connection.execute(
            f"SELECT {COLUMNS} FROM rest.{identifier} ORDER BY _kfk_offset"
        ).fetchall()
    finally:
        connection.close()


def test_a_reaper_pass_compacts_expires_and_removes_orphans_and_every_engine_reads_alike(
    spark, tmp_path: Path, rest_service
) -> None:
    config = layout_config(tmp_path, rest_service, reaper="1")
    identifier = table_of(config)
    transport, writer = open_transport(config), S3Writer(config)
    bookkeeper = Bookkeeper(config)
    for batch in range(12):  # twelve small files, twelve snapshots
        transport.publish(writer.batch([(key, batch * 100 + key) for key in range(10)]))
        assert bookkeeper.run_cycle().committed_monikers == 1
    table = open_catalog(config).load_table(identifier)
    orphan = f"{table.location()}/data/lost/{uuid.uuid4().hex}.parquet"
    write_file(orphan, b"a file no snapshot names")
    time.sleep(GRACE_S + 1)  # older than the grace (object stores keep their own times)

    # The shared session runs already: its Hadoop settings go in without `spark.hadoop.` (a
    # reaper's own session starts with them).
    register_catalog(spark, config)
    for key, value in iceberg_catalog_conf(config).items():
        if key.startswith("spark.hadoop."):
            spark.conf.set(key.removeprefix("spark.hadoop."), value)
    report = Reaper(config, spark=spark).run_pass()
    [result] = report.tables
    assert not result.errors, result.errors
    assert result.files_compacted == 12, result
    if "nessie" in rest_service.name:
        # Nessie's tables say gc.enabled=false (a file may be another branch's too): the pass
        # leaves expiry and orphans to Nessie's own GC instead of failing them every time.
        assert [line.split(":")[0] for line in result.skipped] == ["expiry", "orphans"]
        assert file_exists(orphan)
    else:
        assert result.orphans_removed >= 1 and not file_exists(orphan), result
        assert result.snapshots_expired >= 10, result
    table = open_catalog(config).load_table(identifier)
    assert len(list(table.scan().plan_files())) == 1

    # The bookkeeper goes on after the reaper's snapshots (its committed state is found).
    transport.publish(writer.batch([(key, 1200 + key) for key in range(10)]))
    assert bookkeeper.run_cycle().committed_monikers == 1
    assert transport.pending() == []
    table = open_catalog(config).load_table(identifier)
    assert committed_state(table).offsets == {("items", 0): 130}

    expected = [(0, offset, (offset // 10) * 100 + offset % 10) for offset in range(130)]
    rows = spark_rows(spark, config, identifier, COLUMNS, "_kfk_offset")
    assert [tuple(row.values()) for row in rows] == expected
    assert duckdb_rows_through(rest_service, identifier) == expected

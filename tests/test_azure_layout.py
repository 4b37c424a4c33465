"""Seed 003's Azure layout end to end, driven through icekeeper's own roles (issue 28, item 6),
configured as docs/deployment.md's `azure` block says (item 7: that block works as written; only
what a user changes is changed, tests/support/deployment_docs.py).

Writers read a Kafka topic and write the tables' Parquet files to Azure Blob (Azurite, the one
URI form `abfss://<container>@<account>.dfs.core.windows.net/...`); their monikers travel over
the Azure storage queue, and so do Event Grid's `BlobCreated` messages for a file another tool
dropped into a table (seed 003: Event Grid posts them to the same account's storage queue;
Azurite has no Event Grid, so the test posts what it would). The bookkeeper commits a changelog
and an upsert table into a SQL catalog in PostgreSQL (the stack's `pg-catalog`), with the
warehouse, leases, journal, dead letters and reports all on the blob store; a reaper pass expires
snapshots and removes an orphan; Spark reads through Iceberg's ADLSFileIO and pyiceberg through
the storage door. Every count is the topic's.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.storage import file_exists, list_files, open_filesystem, read_lines
from icekeeper.localstack.services import AZURITE_ACCOUNT
from icekeeper.readers import duckdb_rows
from icekeeper.reaper.service import Reaper
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec, expected_state
from icekeeper.writers.job import WriterJob
from tests.support.deployment_docs import deployment_config, session_endpoints
from tests.support.event_grid import event_grid
from tests.support.object_stores import azure_uri, new_container
from tests.support.pipeline import commit_all, register_catalog
from tests.support.shop_items import GRACE_S

pytestmark = [pytest.mark.integration, pytest.mark.spark]

MIRROR = "shop.orders"
"""The upsert table: one row per key, as in the source database."""
CHANGES = "shop.order_changes"
"""The changelog table of the same topic: every change."""


def azure_layout(
    tmp_path: Path, topic: str, local_stack, pg_catalog, monkeypatch: pytest.MonkeyPatch
) -> IcekeeperConfig:
    """The deployment page's `azure` block on the stack's Azurite (blob and queue, a container
    of the test's own) and its PostgreSQL catalog."""
    endpoints = session_endpoints(local_stack=local_stack)
    container = new_container({"adls.connection-string": endpoints.azure_connection_string})
    return deployment_config(
        "azure",
        tmp_path,
        topic,
        monkeypatch,
        endpoints,
        catalog_uri=pg_catalog.pyiceberg_properties()["uri"],
        store_root=azure_uri(container),
        timings={
            ("reaper", "snapshot_expire_time"): 0,
            ("reaper", "retain_last"): 2,
            ("group", "orphan_grace"): GRACE_S,
        },
    )


def blob_url(abfss: str) -> str:
    """The URL Event Grid puts in a `BlobCreated` event for a blob the `abfss://` URI names."""
    container, _, rest = abfss.removeprefix("abfss://").partition("@")
    path = rest.partition("/")[2]
    return f"https://{AZURITE_ACCOUNT}.blob.core.windows.net/{container}/{path}"


def drop_a_file_as_another_tool(table, name: str, partition: int) -> tuple[str, int, int]:
    """Copy the first rows of one of the table's data files (its field ids kept) to a new file in
    the table's data folder, with Kafka positions no topic has; returns (URI, size, rows)."""
    source = table.inspect.files()["file_path"][0].as_py()
    filesystem, path = open_filesystem(source)
    with filesystem.open_input_file(path) as handle:
        rows = pq.read_table(handle).slice(0, 3)
    column = rows.schema.get_field_index("_kfk_partition")
    field = rows.schema.field(column)
    rows = rows.set_column(column, field, pa.array([partition] * rows.num_rows, field.type))
    uri = f"{table.location()}/data/other-tool/{name}.parquet"
    filesystem, path = open_filesystem(uri)
    with filesystem.open_output_stream(path) as handle:
        pq.write_table(rows, handle, compression="zstd")
    return uri, filesystem.get_file_info(path).size, rows.num_rows


def run_azure_layout(spark, config: IcekeeperConfig, topic: str) -> None:
    """Seed 003's flow on `config` (the `azure` layout): every count is the topic's."""
    warehouse = config.catalog.properties["warehouse"]
    spec = SyntheticSpec(seed=71, keys=60, events=900, schema_changes=0)
    produced = produce_synthetic(config, spec, topic=topic, progress=lambda m: None)

    # Writers: the topic's records into Parquet on Azure Blob, monikers over the storage queue.
    writer = WriterJob(config, spark=spark)
    reports = writer.run(until_idle=True)
    assert sum(r.records_read for r in reports) == produced["records"] == spec.events
    pending = writer.transport.pending()
    assert pending and all(
        entry.path.startswith(f"{warehouse}/") for m in pending for entry in m.files
    )

    # Event Grid announces the writer's own files too (seed 003 filters on `/data/`): their
    # moniker brings them, the event none.
    own = next(m for m in pending if m.table == CHANGES).files[0]
    writer.transport.queue.send_message(
        event_grid(blob_url(own.path), "FlushWithClose", own.size_bytes)
    )

    # The bookkeeper's cycles commit both tables.
    bookkeeper = commit_all(config)
    catalog = bookkeeper.catalog
    changes = catalog.load_table(CHANGES)
    assert changes.location() == f"{warehouse}/shop/order_changes"
    assert len(changes.scan().to_arrow()) == spec.events

    # Event Grid's BlobCreated for a file another tool wrote into the changelog table.
    uri, size, dropped = drop_a_file_as_another_tool(changes, "f1", partition=99)
    queue = bookkeeper.transport.queue
    queue.send_message(event_grid(blob_url(uri), "CreateFile", 0))  # ADLS's empty create
    queue.send_message(event_grid(blob_url(uri), "FlushWithClose", size))
    report = bookkeeper.run_cycle()
    assert not report.dead_lettered, report.dead_lettered
    assert bookkeeper.transport.pending() == []
    assert queue.get_queue_properties().approximate_message_count == 0

    expected = {key: row["amount"] for key, row in expected_state(spec).items() if row is not None}
    mirror = catalog.load_table(MIRROR).scan().to_arrow()
    assert dict(zip(mirror["id"].to_pylist(), mirror["amount"].to_pylist())) == expected
    changes = catalog.load_table(CHANGES).refresh()
    arrow = changes.scan().to_arrow()
    positions = collections.Counter(
        zip(arrow["_kfk_partition"].to_pylist(), arrow["_kfk_offset"].to_pylist())
    )
    assert len(arrow) == len(positions) == spec.events + dropped
    assert sum(1 for p, _ in positions if p == 99) == dropped
    assert len(read_lines(config.bookkeeper.commit_report_path)) >= 2

    # A reaper pass: snapshots expired, an orphan removed once past its grace.
    orphan = f"{changes.location()}/data/crashed-writer/orphan.parquet"
    filesystem, path = open_filesystem(orphan)
    with filesystem.open_output_stream(path) as handle:
        handle.write(b"not referenced by any snapshot")
    time.sleep(GRACE_S + 1)
    name = register_catalog(spark, config)  # as the reaper's own session would have it
    reaper_report = Reaper(config, spark=spark).run_pass()
    by_table = {table.table: table for table in reaper_report.tables}
    assert by_table[CHANGES].errors == []
    assert by_table[CHANGES].files_compacted >= 2 and by_table[CHANGES].snapshots_expired >= 1
    assert by_table[CHANGES].orphans_removed == 1 and not file_exists(orphan)
    # The upsert table's compaction writes its files with Spark's own Parquet writer, through
    # Hadoop's abfs driver, which PySpark does not ship and Azurite could not serve (no DFS
    # endpoint): its only failed step (docs/operations.md, "Azure Blob, Event Grid and the
    # storage queue"). Its expiry and orphan removal ran.
    assert [error.split(":")[0] for error in by_table[MIRROR].errors] == ["compaction"]
    assert "org.apache.hadoop:hadoop-azure:3.4.2" in by_table[MIRROR].errors[0]
    assert list_files(config.reaper.report_path)

    # DuckDB through the Blob endpoint (readers.duckdb_source), Spark through ADLSFileIO,
    # pyiceberg through the door: the same counts.
    duck_mirror = duckdb_rows(catalog.load_table(MIRROR), "id, amount")
    assert {row["id"]: row["amount"] for row in duck_mirror} == expected
    assert duckdb_rows(catalog.load_table(CHANGES), "count(*) AS n")[0]["n"] == (
        spec.events + dropped
    )
    assert spark.sql(f"SELECT count(*) FROM {name}.{CHANGES}").collect()[0][0] == (
        spec.events + dropped
    )
    spark_mirror = spark.sql(f"SELECT id, amount FROM {name}.{MIRROR}").collect()
    assert {row["id"]: row["amount"] for row in spark_mirror} == expected
    changes = catalog.load_table(CHANGES)
    assert len(changes.scan().to_arrow()) == spec.events + dropped
    assert all(
        path.startswith(f"{warehouse}/")
        for path in changes.inspect.files()["file_path"].to_pylist()
    )


def test_the_azure_layout_of_the_deployment_page(
    local_stack,
    pg_catalog,
    spark,
    tmp_path: Path,
    unique_topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = azure_layout(tmp_path, unique_topic, local_stack, pg_catalog, monkeypatch)
    assert config.writer.engine == "arrow" and config.transport.kind == "azure-queue"
    run_azure_layout(spark, config, unique_topic)

"""`icekeeper demo`: the main job end to end on embedded defaults.

Starts the local stack in a state folder the demo owns (`<state_dir>/demo`, reset every run so
the result is always the same), produces seed 000's `tbl_test_1` stream through the registry,
runs a writer and the bookkeeper until everything produced is committed, then one reaper pass
while the bookkeeper runs as a service (as deployed: it commits the pass's compaction of the
upsert table, which the reaper hands to it), and shows the table with its metadata columns, the
snapshots with their watermarks, and the same table read by Spark SQL and by DuckDB.
"""

from __future__ import annotations

import contextlib
import datetime
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from icekeeper.bookkeeper.service import Bookkeeper, CycleReport
from icekeeper.common.committed_state import KEY_WATERMARK
from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.localstack.stack import LocalStack, started_optional_services
from icekeeper.readers import duckdb_rows, render_grid, spark_rows
from icekeeper.samples import seed000
from icekeeper.samples.produce import produce_seed_sample
from icekeeper.seed_defaults import SEED_TABLE, with_seed_defaults

Progress = Callable[[str], None]
SHOWN_COLUMNS = [
    "_src_name",
    "_src_db",
    "_src_table",
    "_src_ts_ms",
    "_src_server_id",
    "_src_file",
    "_src_pos",
    "_src_op",
    "_src_ts_ms_r",
    "_tsc_id",
    "_tsc_total_order",
    "_tsc_data_collection_order",
    "_kfk_topic",
    "_kfk_partition",
    "_kfk_offset",
    "_kfk_timestamp",
]


def demo_config(config: IcekeeperConfig) -> IcekeeperConfig:
    """The demo's config: seed 000's table (`SEED_TABLE`) on the first source, reading seed 000's
    topic, the state folder moved to `<state_dir>/demo` with the group's leases in it, and no
    bookkeeper HTTP port; connections, catalog and every other setting kept from `config`.

    The demo names its table itself rather than taking the config's: it produces seed 000's
    stream, so that is the table it shows, with a config of one's own (`icekeeper demo -c`, for
    its connections) as with none (then on seed 000's source: icekeeper/seed_defaults.py).
    """
    config = with_seed_defaults(config)
    demo_state = str(Path(config.state_dir) / "demo")
    dumped = _replace_prefix(config.model_dump(mode="python"), config.state_dir, demo_state)
    first = {**dumped["sources"][0], "topics": [seed000.TOPIC], "topic_pattern": None}
    dumped["sources"] = [first, *dumped["sources"][1:]]
    dumped["tables"] = [{**SEED_TABLE.model_dump(mode="python"), "source": first["name"]}]
    # The demo's bookkeeper is a thread of the demo, over when it ends: no metrics port, which a
    # bookkeeper running on this machine may hold; and its leases (and its reaper's) in the
    # demo's folder, since with a config of one's own the group's real bookkeeper may hold the
    # group's lease (the demo would stand by for it).
    dumped["bookkeeper"] = {**dumped["bookkeeper"], "http_port": 0}
    dumped["group"] = {**dumped["group"], "lease_uri": f"{demo_state}/bookkeeper-leases"}
    return IcekeeperConfig.model_validate(dumped).with_development(config.development)


def _replace_prefix(node: Any, old: str, new: str) -> Any:
    if isinstance(node, str):
        return node.replace(old, new, 1) if old in node else node
    if isinstance(node, dict):
        return {key: _replace_prefix(value, old, new) for key, value in node.items()}
    if isinstance(node, list):
        return [_replace_prefix(value, old, new) for value in node]
    return node


def fresh_stack(
    config: IcekeeperConfig, with_services: list[str] | None = None, progress: Progress = print
) -> LocalStack:
    """The demo's stack started from nothing, so every run shows the same result.

    Whatever an earlier demo left running in the demo's folder
    (`--keep-stack`, with or without `--with` services) is stopped and the
    folder removed first; a stack that fails to come up is stopped again.

    Args:
        config: a `demo_config`.
        with_services: optional services to add (`stack up --with`).
    """
    LocalStack(config, with_services=started_optional_services(config)).down(
        progress=lambda message: None
    )
    shutil.rmtree(config.state_dir, ignore_errors=True)
    stack = LocalStack(config, with_services=with_services)
    try:
        report = stack.up(progress)
    except BaseException:
        stack.down(progress=lambda message: None)
        raise
    progress(f"local stack up in {report.seconds:.1f}s")
    return stack


def run_demo(
    config: IcekeeperConfig, keep_stack: bool = False, progress: Progress = print
) -> dict[str, Any]:
    """Run the demo; returns the figures `icekeeper demo --json` prints."""
    started = time.monotonic()
    config = demo_config(config)
    stack = fresh_stack(config, progress=progress)
    spark = None
    try:
        produced = produce_seed_sample(config, progress=progress)
        from icekeeper.common.spark import spark_session
        from icekeeper.writers.job import WriterJob

        progress("starting Spark (local) for the writer")
        spark = spark_session(config, "icekeeper-demo", master="local[2]")
        writer = WriterJob(config, spark=spark)
        bookkeeper = Bookkeeper(config)
        bookkeeper.take_lease()  # the group's bookkeeper, as the reaper will see it
        read = dead_lettered = 0
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            batches = writer.run(until_idle=True)
            for batch in batches:
                read += batch.records_read
                dead_lettered += batch.dead_lettered + batch.tombstones_skipped
                progress(
                    f"writer: batch {batch.seq}: {batch.records_read} records -> "
                    f"{batch.rows_written} rows in {batch.files} files"
                )
            cycle = bookkeeper.run_cycle()
            _show_cycle(cycle, progress)
            if (
                read >= produced["records"]
                and not batches
                and not cycle.pending
                and not cycle.committed_monikers
            ):
                break
        from icekeeper.reaper.service import Reaper

        progress("reaper: one maintenance pass, the bookkeeper running as a service meanwhile")
        with _running_as_a_service(bookkeeper, progress):
            maintenance = Reaper(config, spark=spark).run_pass()
        totals = maintenance.totals()
        progress(
            f"reaper: compacted {totals['files_compacted']} files into {totals['files_added']}, "
            f"expired {totals['snapshots_expired']} snapshots, deleted {totals['files_deleted']} "
            f"files in {maintenance.seconds:.1f}s"
        )
        for table_report in maintenance.tables:
            if table_report.compaction_pending:
                progress(f"reaper: {table_report.table}: {table_report.compaction_pending}")
        identifier = config.tables[0].identifier
        table = bookkeeper.catalog.load_table(identifier)
        rows = table.scan().to_arrow().to_pylist()
        rows.sort(key=lambda r: tuple(r[k] for k in config.tables[0].primary_key))
        data_columns = [c for c in rows[0] if c not in SHOWN_COLUMNS] if rows else []
        print(
            f"\n# {identifier}: {len(rows)} rows, one per primary key, as seed 000's result table "
            "shows it (an upsert table: read with pyiceberg as it is, no read-time deduplication)"
        )
        print(render_grid(rows, ["_src_op", "_kfk_partition", "_kfk_offset", *data_columns]))
        print("\n# the same rows' metadata columns")
        print(render_grid(rows, SHOWN_COLUMNS, max_width=24))
        snapshots = _snapshot_lines(table)
        print(f"\n# snapshots of {identifier}")
        for line in snapshots:
            print(line)
        spark_result = spark_rows(
            spark,
            config,
            identifier,
            "count(*) AS rows, sum(C2) AS sum_c2, max(UPDATE_TIME) AS last_update",
        )
        print(
            f"\n# Spark SQL (iceberg-spark-runtime) on catalog {config.catalog.name}: "
            f"{spark_result[0]}"
        )
        duck_result = duckdb_rows(
            table, "count(*) AS rows, sum(C2) AS sum_c2, max(UPDATE_TIME) AS last_update"
        )
        print(f"# DuckDB iceberg_scan: {duck_result[0]}\n")
        return {
            "records_produced": produced["records"],
            "records_read": read,
            "rows_committed": len(rows),
            "dead_lettered": dead_lettered,
            "snapshots": len(snapshots),
            "spark_rows": int(spark_result[0]["rows"]),
            "duckdb_rows": int(duck_result[0]["rows"]),
            "reaper_files_compacted": totals["files_compacted"],
            "reaper_seconds": round(maintenance.seconds, 1),
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        if spark is not None:
            spark.stop()
        if not keep_stack:
            stack.down(progress)


def _show_cycle(cycle: CycleReport, progress: Progress) -> None:
    for table in cycle.tables:
        if not table.snapshot_id:
            continue
        if table.committed:
            progress(
                f"bookkeeper: committed {table.records} rows of {table.table} as snapshot "
                f"{table.snapshot_id}"
                + (f", replacing {table.rows_replaced} earlier rows" if table.rows_replaced else "")
            )
        elif table.files:  # files and no moniker: the reaper's compaction
            progress(
                f"bookkeeper: committed the reaper's compaction of {table.table} as snapshot "
                f"{table.snapshot_id}: {table.records} live rows in {table.files} files"
            )


@contextlib.contextmanager
def _running_as_a_service(bookkeeper: Bookkeeper, progress: Progress) -> Iterator[None]:
    """`bookkeeper` cycling in a thread (`Bookkeeper.run`, as `icekeeper bookkeeper` runs it)
    while the block runs: the reaper hands an upsert table's compaction to the group's running
    bookkeeper and waits for its commit. Stopped after its current cycle when the block ends."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            bookkeeper.run(on_cycle=lambda cycle: _show_cycle(cycle, progress))
        except BaseException as error:  # noqa: BLE001 - raised again in the demo's thread
            failure.append(error)

    service = threading.Thread(target=run, name="icekeeper-demo-bookkeeper")
    service.start()
    try:
        yield
    finally:
        bookkeeper.stop.set()
        service.join()
    if failure:
        raise failure[0]


def _snapshot_lines(table) -> list[str]:  # noqa: ANN001 - pyiceberg Table
    lines = []
    for snapshot in table.snapshots():
        summary = snapshot.summary.additional_properties if snapshot.summary else {}
        when = datetime.datetime.fromtimestamp(snapshot.timestamp_ms / 1000, datetime.UTC).strftime(
            "%Y-%m-%d %H:%M:%S"
        )
        watermark = summary.get(KEY_WATERMARK)
        watermark_text = (
            datetime.datetime.fromtimestamp(int(watermark) / 1000, datetime.UTC).isoformat()
            if watermark
            else "-"
        )
        lines.append(
            f"  {snapshot.snapshot_id}  {when}Z "
            f" {snapshot.summary.operation.value if snapshot.summary else '?':<8} "
            f"added-records={summary.get('added-records', '0'):<6} "
            f"total-records={summary.get('total-records', '?'):<6} watermark={watermark_text}"
        )
    return lines

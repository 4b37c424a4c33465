"""`icekeeper bench reaper`: one maintenance pass over a table of many small files and snapshots.

The table is what a streaming sink leaves behind: `files` seed-000-like files of 100 rows, each
committed as its own snapshot. Building it through pyiceberg would take longer than the pass
itself (each commit rewrites the growing metadata; 200 snapshots in one pyiceberg transaction
took 52 s here), so the snapshots are appended through Iceberg's Java API in one transaction
(about 80 ms per snapshot for 1,000). A few orphan files (older than the grace period) are left
in the data folder, like a writer that died before publishing its moniker.

Reported: `pass_s` (the reaper pass: compaction, expiry, orphan removal), `files_before` and
`files_after` (every file under the table location), `bytes_freed`, `snapshots_before` and
`snapshots_after`, and `rows_equal` (the table's row count is unchanged).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icekeeper.bench.bookkeeper import seed_schema, write_seed_file
from icekeeper.bench.work import fresh_work_folder
from icekeeper.common.catalog import open_catalog
from icekeeper.common.config import IcekeeperConfig, load_config
from icekeeper.common.internals import java_spark_session, spark_jvm
from icekeeper.common.moniker import FileEntry

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Progress = Callable[[str], None]
TABLE = "bench.small_files"


def append_snapshot_per_file(
    spark: SparkSession, catalog_name: str, identifier: str, entries: Sequence[FileEntry]
) -> None:
    """One snapshot per file, in one Iceberg (Java) transaction: a fast way to a long history."""
    jvm = spark_jvm(spark)  # Iceberg's Java API has no Python binding
    table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
        java_spark_session(spark), f"{catalog_name}.{identifier}"
    )
    transaction = table.newTransaction()
    spec = table.spec()
    metrics_config = jvm.org.apache.iceberg.MetricsConfig.forTable(table)
    for entry in entries:
        # Column metrics from the footer, as the bookkeeper commits them (filters prune by them).
        metrics = jvm.org.apache.iceberg.parquet.ParquetUtil.fileMetrics(
            table.io().newInputFile(entry.path), metrics_config
        )
        data_file = (
            jvm.org.apache.iceberg.DataFiles.builder(spec)
            .withPath(entry.path)
            .withFileSizeInBytes(entry.size_bytes)
            .withMetrics(metrics)
            .withFormat("parquet")
            .build()
        )
        transaction.newFastAppend().appendFile(data_file).commit()
    transaction.commitTransaction()


def files_under(location: str) -> dict[str, int]:
    """Every visible file under a local table location,
    with its size (hidden `.crc` files aside)."""
    root = Path(location.removeprefix("file://"))
    return {
        str(path): path.stat().st_size
        for path in root.rglob("*")
        if path.is_file() and not path.name.startswith(".")
    }


def age_files(paths: Sequence[str], seconds: float) -> None:
    """Backdate files, as if written `seconds` ago."""
    moment = time.time() - seconds
    for path in paths:
        os.utime(path.removeprefix("file://"), (moment, moment))


def bench_config(state_dir: Path) -> IcekeeperConfig:
    return load_config(
        None,
        environ={
            "ICEKEEPER__STATE_DIR": str(state_dir),
            "ICEKEEPER__TABLES": f"[{{identifier: {TABLE}, topics: [bench]}}]",
            "ICEKEEPER__SOURCES__0__TOPICS": "[bench]",
            "ICEKEEPER__REAPER__SNAPSHOT_EXPIRE_TIME": "0",
            "ICEKEEPER__REAPER__RETAIN_LAST": "1",
            "ICEKEEPER__GROUP__ORPHAN_GRACE": "3600",
            "ICEKEEPER__REAPER__COMPACT_TARGET_FILE_SIZE_BYTES": str(64 * 1024 * 1024),
        },
    )


def run_reaper_bench(
    state_dir: str, files: int = 1000, cores: int | None = None, progress: Progress = print
) -> dict[str, Any]:
    from icekeeper.common.spark import spark_session
    from icekeeper.reaper.service import Reaper

    work = fresh_work_folder(state_dir, "bench-reaper")
    config = bench_config(work)
    catalog = open_catalog(config)
    catalog.create_namespace("bench")
    schema = seed_schema(config)
    table = catalog.create_table(TABLE, schema=schema, properties={"format-version": "2"})
    data = Path(table.location().removeprefix("file://")) / "data"
    entries = [
        write_seed_file(data / f"{index:06d}-{uuid.uuid4().hex[:8]}.parquet", schema, index * 100)
        for index in range(files)
    ]
    orphans = [
        write_seed_file(data / "orphans" / f"{index}.parquet", schema, 0).path
        for index in range(10)
    ]
    age_files(orphans, 2 * 3600)
    spark = spark_session(
        config, "icekeeper-bench-reaper", master=f"local[{cores or os.cpu_count() or 2}]"
    )
    try:
        progress(f"building {files:,} snapshots of one file each")
        started = time.monotonic()
        append_snapshot_per_file(spark, config.catalog.name, TABLE, entries)
        build_s = time.monotonic() - started
        table = table.refresh()
        rows_before = len(table.scan().to_arrow())
        snapshots_before = len(table.snapshots())
        before = files_under(table.location())
        progress(
            f"built in {build_s:.1f}s: {len(before):,} files, {snapshots_before:,} snapshots; "
            "running one reaper pass"
        )
        reaper = Reaper(config, spark=spark)
        started = time.monotonic()
        report = reaper.run_pass()
        pass_s = time.monotonic() - started
        table = table.refresh()
        after = files_under(table.location())
        rows_after = len(table.scan().to_arrow())
    finally:
        spark.stop()
    totals = report.totals()
    result = {
        "pass_s": round(pass_s, 2),
        "files_before": len(before),
        "files_after": len(after),
        "bytes_freed": sum(before.values()) - sum(after.values()),
        "snapshots_before": snapshots_before,
        "snapshots_after": len(table.snapshots()),
        "files_compacted": totals["files_compacted"],
        "snapshots_expired": totals["snapshots_expired"],
        "files_deleted": totals["files_deleted"],
        "rows_equal": rows_before == rows_after,
        "step_seconds": report.tables[0].step_seconds,
        "build_s": round(build_s, 1),
        "data_files": files,
    }
    shutil.rmtree(work, ignore_errors=True)
    return result

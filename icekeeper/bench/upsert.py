"""`icekeeper bench upsert`: an upsert table against Spark's `foreachBatch` + `MERGE INTO`, same
data, same cores.

The topic is preloaded with `changes` Debezium Avro changes over `keys` keys (about 70% updates,
10% deletes, 20% inserts; `upsert_data.py`) in `partitions` Kafka partitions. Then, in one
SparkSession and on the same cores, each side mirrors the whole topic into a table of its own:

- ours: our writer (the config's `writer.engine`, as `writer_engine` reports; batches of
  `batch_records` until idle) while the bookkeeper, in its own process as deployed, commits (key
  index, position deletes; a cycle every `RUN_COMMIT_INTERVAL_S`); timed from the writer's start
  to the commit that covers the last offset;
- changelog: the same, with `mode: changelog` (every change a row): what upsert costs over it;
- baseline: a Structured Streaming query whose `foreachBatch` keeps each key's last change and
  runs `MERGE INTO` a merge-on-read format-v2 table (`upsert_merge.py`), batches of the same size.

All three run once on a small warm-up topic first (neither pays for JIT compilation), and with
`repeat` > 1 they take turns in alternating order; figures are medians. Every table must end in the
same state: the rows the plan's final state holds (`equal_final_state`: same row count, one row per
key, same checksum of the source columns, and of all columns between the three tables; for the
changelog, of each key's last change).

Then, on our table: DuckDB full scans (`scan_s`) before and after a reaper pass
(`scan_compacted_s`), both also as a ratio to the same rows rewritten into a fresh table without
deletes (`scan_rewritten_s`), and the baseline's table as it ended (`baseline_scan_s`); freshness
at `rate` changes/s on an upsert table (`e2e.py`); and the key index on its own at `index_keys`
keys (`key_index.py`). `stages_s` shows where a batch's time goes (`upsert_stages.py`). The last
stdout line is one JSON object.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from icekeeper.bench.upsert_data import (
    ROW_COLUMNS,
    ChangePlan,
    final_state_frame,
    plan_changes,
    preload,
)
from icekeeper.bench.upsert_merge import create_merge_table, run_merge_baseline
from icekeeper.bench.upsert_stages import measure_upsert_stages
from icekeeper.bench.upsert_table_rows import start_with, write_template
from icekeeper.bench.work import fresh_work_folder
from icekeeper.common.catalog import DEFAULT_TABLE_PROPERTIES, load_table_or_none, open_catalog
from icekeeper.common.committed_state import committed_state
from icekeeper.common.config import IcekeeperConfig, load_config
from icekeeper.common.config.model import TableSpec
from icekeeper.common.schema import op_column

Progress = Callable[[str], None]
KEY_COLUMNS = ["id"]
SIDES = ("ours", "changelog", "baseline")
RUN_COMMIT_INTERVAL_S = 0.25
"""The bookkeeper's `commit_interval` in the timed runs of ours and changelog. The baseline's
`foreachBatch` commits each batch the moment it is written; with the default second between
cycles, a batch written just after a cycle started waited up to a second for its snapshot
(writer 4.0 s, last commit 1.0 s later, in one run), which times the setting, not the work. A
quarter second commits each ~0.8 s batch on its own as it lands, as the baseline does (six
snapshots for six batches). Freshness is measured with the configured interval."""


def upsert_bench_config(
    base: IcekeeperConfig, work: Path, topic: str, batch_records: int, cores: int
) -> IcekeeperConfig:
    """The stack's addresses and the writer's engine (ours and changelog) from `base`; a fresh
    state folder and catalog; writer batches of `batch_records`, one after the other; a commit
    cycle every second (the timed runs: `RUN_COMMIT_INTERVAL_S`)."""
    source = base.sources[0]
    return load_config(
        None,
        environ={
            "ICEKEEPER__STATE_DIR": str(work),
            "ICEKEEPER__CACHE_DIR": str(base.cache_dir),
            # Spark keeps a catalog per name for the session's life
            "ICEKEEPER__CATALOG__NAME": f"bench_{uuid.uuid4().hex[:8]}",
            "ICEKEEPER__SOURCES__0__BOOTSTRAP_SERVERS": source.bootstrap_servers,
            "ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_URL": source.schema_registry_url or "",
            "ICEKEEPER__SOURCES__0__TOPICS": f"[{topic}]",
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": topic + ".dlq",
            "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": str(batch_records),
            # each run its own: run_config
            "ICEKEEPER__TABLES": "[{identifier: bench.placeholder, "
            f"topics: [{topic}], primary_key: [id]}}]",
            "ICEKEEPER__SPARK__MASTER": f"local[{cores}]",
            "ICEKEEPER__WRITER__TRIGGER_INTERVAL": "0",
            "ICEKEEPER__WRITER__ENGINE": base.writer.engine,
            "ICEKEEPER__BOOKKEEPER__COMMIT_INTERVAL": "1",
            "ICEKEEPER__BOOKKEEPER__HTTP_PORT": "0",
        },
    )


def run_config(
    config: IcekeeperConfig, topic: str, identifier: str, mode: str, folder: Path
) -> IcekeeperConfig:
    """One side's run: its table, and a transport, checkpoints, lease and commit report of its
    own; cycles every `RUN_COMMIT_INTERVAL_S`."""
    source = config.sources[0].model_copy(
        update={"topics": [topic], "dead_letter_topic": topic + ".dlq"}
    )
    return config.model_copy(
        update={
            "sources": [source],
            "tables": [
                TableSpec(identifier=identifier, topics=[topic], primary_key=KEY_COLUMNS, mode=mode)
            ],
            "transport": config.transport.model_copy(update={"uri": str(folder / "txlog")}),
            "writer": config.writer.model_copy(
                update={"checkpoint_uri": str(folder / "checkpoints"), "writer_id": "bench-writer"}
            ),
            "bookkeeper": config.bookkeeper.model_copy(
                update={
                    "commit_report_path": str(folder / "commits.jsonl"),
                    "commit_interval": RUN_COMMIT_INTERVAL_S,
                }
            ),
            "group": config.group.model_copy(
                update={"lease_uri": str(folder / "leases"), "name": folder.name}
            ),
        }
    )


def committed_changes(config: IcekeeperConfig, identifier: str) -> int:
    """Records of the table's topics its snapshots cover (the topic's offsets start at 0)."""
    table = load_table_or_none(open_catalog(config), identifier)
    return sum(committed_state(table).offsets.values()) if table is not None else 0


@contextlib.contextmanager
def bookkeeper_running(config: IcekeeperConfig) -> Iterator[multiprocessing.Process]:
    """The bookkeeper of `config` in a process of its own, as deployed (in this one it would queue
    on the GIL with the writer's driver); stopped after its current cycle on exit."""
    from icekeeper.bench.e2e import bookkeeper_process

    context = multiprocessing.get_context("spawn")
    stop, ready = context.Event(), context.Event()
    bookkeeper = context.Process(
        target=bookkeeper_process, args=(config, stop, ready), name="bookkeeper"
    )
    bookkeeper.start()
    try:
        if not ready.wait(120):
            raise TimeoutError("the bookkeeper process did not start")
        yield bookkeeper
    finally:
        stop.set()
        bookkeeper.join(timeout=120)
        if bookkeeper.is_alive():
            bookkeeper.kill()


def run_pipeline(
    spark: SparkSession, config: IcekeeperConfig, changes: int, timeout_s: float = 3600.0
) -> dict[str, Any]:
    """Our writer over the whole topic while the bookkeeper commits, until the table covers every
    change.

    Returns:
        `seconds` from the writer's start to the commit of the last change (the commit report's
        time), `writer_s` (the writer alone, until idle), `batches` and each one's `batch_s`,
        `snapshots` and `commit_s` (the bookkeeper's commit time summed over its snapshots).
    """
    from icekeeper.writers.job import WriterJob

    identifier = config.tables[0].identifier
    with bookkeeper_running(config) as bookkeeper:
        job = WriterJob(config, spark=spark)
        started_at = time.time()
        reports = job.run(until_idle=True)
        writer_s = time.time() - started_at
        deadline = time.monotonic() + timeout_s
        while (done := committed_changes(config, identifier)) < changes:
            if time.monotonic() > deadline or not bookkeeper.is_alive():
                raise TimeoutError(f"{identifier}: {done:,} of {changes:,} changes committed")
            time.sleep(0.25)
    commits = [
        json.loads(line)
        for line in Path(config.bookkeeper.commit_report_path).read_text().splitlines()
    ]
    return {
        "seconds": max(c["committed_at_ms"] for c in commits) / 1000 - started_at,
        "writer_s": writer_s,
        "batches": sum(1 for report in reports if report.records_read),
        "batch_s": [round(r.seconds, 2) for r in reports if r.records_read],
        "snapshots": len(commits),
        "commit_s": sum(c["latency_ms"] for c in commits) / 1000,
    }


def changelog_mirror(frame: DataFrame, op: str) -> DataFrame:
    """A changelog's mirror: each key's last change (by Kafka offset), deleted keys left out."""
    latest = Window.partitionBy(*KEY_COLUMNS).orderBy(
        F.col("_kfk_offset").desc(), F.col("_kfk_partition").desc()
    )
    return (
        frame.withColumn("_last", F.row_number().over(latest))
        .where("_last = 1")
        .drop("_last")
        .where(F.col(op) != "d")
    )


def state_digest(frame: DataFrame, columns: list[str]) -> dict[str, Any]:
    """Row count, distinct keys and an order-free checksum of the rows' `columns` (sum of row
    hashes)."""
    row = frame.agg(
        F.count(F.lit(1)).alias("rows"),
        F.countDistinct(*KEY_COLUMNS).alias("keys"),
        F.sum(F.xxhash64(*[F.col(name) for name in columns]).cast("decimal(38,0)")).alias("digest"),
    ).first()
    return {"rows": row["rows"], "keys": row["keys"], "digest": str(row["digest"])}


def final_states(
    spark: SparkSession,
    config: IcekeeperConfig,
    tables: dict[str, str],
    plan: ChangePlan,
    folder: Path,
    table_rows: int = 0,
) -> dict[str, Any]:
    """Each table's state (as Spark reads it, deletes applied) against the plan's final state (and
    the `table_rows` starting rows): source columns against the plan, all columns between the
    tables."""
    op = op_column(config.metadata_columns)
    frames = {}
    for side, identifier in tables.items():
        frame = spark.table(f"{config.catalog.name}.{identifier}")
        frames[side] = changelog_mirror(frame, op) if side.startswith("changelog") else frame
    all_columns = sorted(spark.table(f"{config.catalog.name}.{tables['ours']}").columns)
    expected = state_digest(final_state_frame(spark, plan, folder, table_rows), ROW_COLUMNS)
    states = {
        side: {
            "source_columns": state_digest(frame, ROW_COLUMNS),
            "all_columns": state_digest(frame, all_columns),
        }
        for side, frame in frames.items()
    }
    equal = all(
        state["source_columns"] == expected
        and state["all_columns"] == states["ours"]["all_columns"]
        for state in states.values()
    )
    return {"equal_final_state": equal, "expected": expected, "states": states}


def duckdb_scan(metadata_location: str, repeat: int = 9) -> tuple[float, int]:
    """Median seconds of a DuckDB full scan (every column of every live row, into Arrow), and the
    rows it read."""
    from icekeeper.readers import duckdb_connection

    connection = duckdb_connection()
    try:
        seconds = []
        for _ in range(
            repeat + 1
        ):  # the first one warms the page cache and DuckDB's metadata reads
            started = time.perf_counter()
            rows = (
                connection.execute(f"SELECT * FROM iceberg_scan('{metadata_location}')")
                .to_arrow_table()
                .num_rows
            )
            seconds.append(time.perf_counter() - started)
        return statistics.median(seconds[1:]), rows
    finally:
        connection.close()


def table_files(table: Table) -> dict[str, int]:
    """Files and position deletes of the table's current snapshot."""
    summary = table.current_snapshot().summary.additional_properties
    return {
        name: int(summary.get(key, 0))
        for name, key in (
            ("data_files", "total-data-files"),
            ("delete_files", "total-delete-files"),
            ("position_deletes", "total-position-deletes"),
        )
    }


def measure_scans(
    spark: SparkSession,
    config: IcekeeperConfig,
    identifier: str,
    progress: Progress,
    baseline_identifier: str | None = None,
) -> dict[str, Any]:
    """DuckDB full scans of our table after the changes, after a reaper pass, and of its rows
    rewritten into a fresh table (one append, no deletes): what compaction could at best reach.
    The bookkeeper runs during the pass, as deployed (an upsert table's compaction may need it).
    Also the baseline's `MERGE INTO` table after the same changes (`baseline_identifier`): what a
    reader of the other merge-on-read table pays for the same deleted rows."""
    from icekeeper.reaper.service import Reaper

    catalog = open_catalog(config)
    table = catalog.load_table(identifier)
    before = table_files(table)
    scan_s, scan_rows = duckdb_scan(table.metadata_location)
    baseline: dict[str, Any] = {}
    if baseline_identifier is not None:
        merged = catalog.load_table(baseline_identifier)
        baseline = {
            "baseline_scan_s": round(duckdb_scan(merged.metadata_location)[0], 4),
            "baseline_files": table_files(merged),
        }
    progress(f"DuckDB scan of {identifier}: {scan_s:.3f}s ({before}), {baseline}; reaper pass")
    started = time.monotonic()
    with bookkeeper_running(config):
        report = Reaper(config, spark=spark).run_pass()
    reaper_s = time.monotonic() - started
    errors = [error for table_report in report.tables for error in table_report.errors]
    table = catalog.load_table(identifier)
    after = table_files(table)
    scan_compacted_s, scan_compacted_rows = duckdb_scan(table.metadata_location)
    rows = table.scan().to_arrow()
    rewritten = catalog.create_table(
        identifier + "_rewritten", schema=table.schema(), properties=table.properties
    )
    rewritten.append(rows)
    scan_rewritten_s, _ = duckdb_scan(rewritten.metadata_location)
    progress(
        f"after the reaper pass ({reaper_s:.1f}s): {scan_compacted_s:.3f}s ({after}); rewritten: "
        f"{scan_rewritten_s:.3f}s"
    )
    return {
        "scan_s": round(scan_s, 4),
        "scan_compacted_s": round(scan_compacted_s, 4),
        "scan_rewritten_s": round(scan_rewritten_s, 4),
        "scan_vs_rewritten": round(scan_s / scan_rewritten_s, 2),
        **baseline,
        **(
            {"baseline_scan_vs_rewritten": round(baseline["baseline_scan_s"] / scan_rewritten_s, 2)}
            if baseline
            else {}
        ),
        "scan_compacted_vs_rewritten": round(scan_compacted_s / scan_rewritten_s, 2),
        "files_before_reaper": before,
        "files_after_reaper": after,
        "reaper_s": round(reaper_s, 2),
        "reaper_errors": errors,
        "scan_rows": scan_rows,
        "scan_compacted_rows": scan_compacted_rows,
    }


@dataclass
class StartingRows:
    """The rows every timed run's table starts with (`upsert_table_rows.py`): the template's data
    files, and each side's schema (the one its warm-up run's table got)."""

    rows: int
    files: list[DataFile]
    schemas: dict[str, Schema]


@dataclass
class Sides:
    """Runs one side (ours, changelog or baseline) over a preloaded topic into a new table."""

    spark: SparkSession
    config: IcekeeperConfig
    work: Path
    batch_records: int
    progress: Progress
    starting: StartingRows | None = None

    def run(self, side: str, name: str, loaded: dict[str, Any]) -> dict[str, Any]:
        """`loaded`: what `preload` reported; returns the run's figures, its table and (ours,
        changelog) its config."""
        identifier = f"bench.{side}_{name}"
        folder = self.work / f"{side}-{name}"
        if self.starting is not None and name != "warm":
            self._start_table(side, identifier)
        if side == "baseline":
            result = run_merge_baseline(
                self.spark,
                self.config,
                loaded["topic"],
                loaded["value_schema"],
                loaded["value_schema_id"],
                identifier,
                KEY_COLUMNS,
                self.batch_records,
                folder / "checkpoint",
            )
            self.progress(f"{side} {name}: {result['seconds']:.1f}s, {result['batches']} batches")
        else:
            config = run_config(
                self.config,
                loaded["topic"],
                identifier,
                "upsert" if side == "ours" else "changelog",
                folder,
            )
            result = {**run_pipeline(self.spark, config, loaded["changes"]), "config": config}
            self.progress(
                f"{side} {name}: {result['seconds']:.1f}s (writer {result['writer_s']:.1f}s, "
                f"{result['batches']} batches; {result['snapshots']} snapshots, "
                f"{result['commit_s']:.1f}s committing)"
            )
        return {
            **result,
            "identifier": identifier,
            "files": table_files(open_catalog(self.config).load_table(identifier)),
        }

    def _start_table(self, side: str, identifier: str) -> None:
        """The run's table, made before its clock starts, holding the starting rows."""
        assert self.starting is not None
        schema = self.starting.schemas[side]
        if side == "baseline":
            table = create_merge_table(self.config, identifier, schema)
        else:  # as the bookkeeper makes a table (moniker_append.py `create_table`)
            table = open_catalog(self.config).create_table(
                identifier, schema=schema, properties=dict(DEFAULT_TABLE_PROPERTIES)
            )
        start_with(table, self.starting.files)

    def take_turns(
        self,
        loaded: dict[str, Any],
        warm: dict[str, Any],
        repeat: int,
        plan: ChangePlan,
        table_rows: int,
    ) -> dict[str, list[dict[str, Any]]]:
        """Each side once over the warm-up topic, then (after writing the starting rows, if any)
        `repeat` turns over the topic, in alternating order."""
        self.progress(f"warming up: each side once over {warm['changes']:,} changes")
        for side in SIDES:
            self.run(side, "warm", warm)
        if table_rows:
            self.starting = self._starting_rows(loaded, plan, table_rows)
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        for turn in range(1, repeat + 1):
            for side in SIDES if turn % 2 else tuple(reversed(SIDES)):
                runs[side].append(self.run(side, f"r{turn}", loaded))
            self.progress(
                f"turn {turn}/{repeat}: "
                + ", ".join(f"{side} {runs[side][-1]['seconds']:.1f}s" for side in SIDES)
            )
        return runs

    def _starting_rows(
        self, loaded: dict[str, Any], plan: ChangePlan, table_rows: int
    ) -> StartingRows:
        catalog = open_catalog(self.config)
        schemas = {side: catalog.load_table(f"bench.{side}_warm").schema() for side in SIDES}
        field_ids = {
            side: [(field.name, field.field_id) for field in schema.fields]
            for side, schema in schemas.items()
        }
        if len({tuple(ids) for ids in field_ids.values()}) != 1:
            raise ValueError(
                "the sides' tables number their columns differently, so they cannot share data "
                f"files: {field_ids}"
            )
        started = time.monotonic()
        files = write_template(
            self.spark,
            self.config,
            loaded,
            plan,
            table_rows,
            len(loaded["partition_records"]),
            schemas["ours"],
            "bench.starting_rows",
        )
        self.progress(
            f"{table_rows:,} starting rows written in {time.monotonic() - started:.1f}s "
            f"({len(files)} files)"
        )
        return StartingRows(table_rows, files, schemas)


def delete_topics(config: IcekeeperConfig, topics: list[str], progress: Progress) -> None:
    """The bench's topics go when it is done (a million changes are ~300 MB of the local broker's
    disk)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(
        {"bootstrap.servers": config.sources[0].bootstrap_servers}
    )  # alive until the futures are done
    futures = admin.delete_topics(topics, operation_timeout=30)
    for topic, future in futures.items():
        try:
            future.result(timeout=60)
        except Exception as error:  # noqa: BLE001 - never created (the bench failed early) or the broker is gone: nothing to free
            progress(f"topic {topic} not deleted: {error}")


def run_upsert_bench(
    base: IcekeeperConfig,
    changes: int = 1_000_000,
    keys: int = 100_000,
    partitions: int = 4,
    batch_records: int = 200_000,
    cores: int | None = None,
    repeat: int = 1,
    warmup_changes: int = 100_000,
    index_keys: int = 10_000_000,
    freshness_s: float = 60.0,
    rate_per_s: float = 2000.0,
    freshness_warmup_s: float = 10.0,
    table_rows: int = 0,
    spark: SparkSession | None = None,
    progress: Progress = print,
) -> dict[str, Any]:
    """Preload, time ours, our changelog path and the `MERGE INTO` baseline (`repeat` turns, in
    alternating order), check their final states, then scans, freshness and the key index.

    Args:
        base: the stack's addresses (Kafka, registry) and the state folder the bench works under.
        batch_records: records per batch on every side (our writer's `max_offsets_per_trigger`,
            the baseline's `maxOffsetsPerTrigger`).
        spark: a session to use (and leave running); default: one of `cores` local cores, stopped
            at the end.
        freshness_s: seconds of production at `rate_per_s` for the freshness figures (0: skip them).
        table_rows: rows every timed run's table starts with, keys the changes never touch
            (`upsert_table_rows.py`): a source table larger than the keys it changes.
    """
    from icekeeper.bench.e2e import run_e2e_bench
    from icekeeper.bench.key_index import run_key_index_bench
    from icekeeper.common.spark import iceberg_catalog_conf, spark_session

    cores = cores or os.cpu_count() or 2
    work = fresh_work_folder(base.state_dir, "bench-upsert")
    topic = f"bench.upsert.{uuid.uuid4().hex[:8]}"
    config = upsert_bench_config(base, work, topic, batch_records, cores)
    owns_spark = spark is None
    if spark is None:
        spark = spark_session(
            config,
            "icekeeper-bench-upsert",
            master=f"local[{cores}]",
            extra_conf={"spark.sql.shuffle.partitions": str(cores), "spark.driver.memory": "4g"},
        )
    for key, value in iceberg_catalog_conf(config).items():
        spark.conf.set(key, value)
    open_catalog(config).create_namespace("bench")
    topics = [topic, topic + ".warmup"]
    try:
        plan = plan_changes(changes, keys)
        progress(
            f"preloading {changes:,} changes over {keys:,} keys ({plan.op_counts()}) into {topic} "
            f"({partitions} partitions)"
        )
        loaded = preload(spark, config, topic, plan, partitions, work / "plan")
        warm = preload(
            spark,
            config,
            topics[1],
            plan_changes(warmup_changes, max(10, warmup_changes // 10), seed=7),
            partitions,
            work / "warm",
        )
        progress(f"preloaded in {loaded['preload_s']}s")
        runs = Sides(spark, config, work, batch_records, progress).take_turns(
            loaded, warm, repeat, plan, table_rows
        )
        progress("checking the final states")
        states = [
            final_states(
                spark,
                config,
                {side: runs[side][turn]["identifier"] for side in SIDES},
                plan,
                work / "plan",
                table_rows,
            )
            for turn in range(repeat)
        ]
        if not all(state["equal_final_state"] for state in states):
            progress(f"FINAL STATES DIFFER: {states}")
        stages = measure_upsert_stages(
            spark, config, loaded, batch_records, KEY_COLUMNS, work / "stages"
        )
        progress(f"one batch through the bare pipeline, seconds: {stages}")
        scans = measure_scans(
            spark,
            runs["ours"][-1]["config"],
            runs["ours"][-1]["identifier"],
            progress,
            baseline_identifier=runs["baseline"][-1]["identifier"],
        )
        freshness: dict[str, Any] = {}
        if freshness_s > 0:
            progress(f"freshness: an upsert table under {rate_per_s:,.0f} changes/s")
            freshness = run_e2e_bench(
                config,
                seconds=freshness_s,
                rate_per_s=rate_per_s,
                cores=cores,
                warmup_s=freshness_warmup_s,
                progress=progress,
                mode="upsert",
                sweep_rates=(),
            )
    finally:
        if owns_spark:
            spark.stop()
        delete_topics(config, topics, progress)
    progress(f"key index at {index_keys:,} keys")
    index = run_key_index_bench(keys=index_keys, progress=progress)
    shutil.rmtree(work, ignore_errors=True)
    return summarize(
        plan, runs, states, scans, freshness, index, batch_records, partitions, cores
    ) | {
        "stages_s": stages,
        "preload_s": loaded["preload_s"],
        "table_rows": table_rows,
        "writer_engine": config.writer.engine,
    }


def summarize(
    plan: ChangePlan,
    runs: dict[str, list[dict[str, Any]]],
    states: list[dict[str, Any]],
    scans: dict[str, Any],
    freshness: dict[str, Any],
    index: dict[str, Any],
    batch_records: int,
    partitions: int,
    cores: int,
) -> dict[str, Any]:
    """The bench's figures: the issue's names first (medians over the runs), then what explains
    them.

    `*_best_s` and `ratio_*_best` come from each side's fastest run: on a shared machine other
    jobs only ever add time, so the fastest run is the least disturbed one.
    """
    median_run = {
        side: sorted(runs[side], key=lambda run: run["seconds"])[(len(runs[side]) - 1) // 2]
        for side in SIDES
    }
    best_run = {side: min(runs[side], key=lambda run: run["seconds"]) for side in SIDES}
    rate = {side: plan.changes / median_run[side]["seconds"] for side in SIDES}
    best = {side: best_run[side]["seconds"] for side in SIDES}
    final_rows = states[-1]["expected"]["rows"]

    def details(run: dict[str, Any]) -> dict[str, Any]:
        keep = ("seconds", "writer_s", "commit_s", "batch_s", "snapshots", "batches", "files")
        return {
            name: round(run[name], 2) if isinstance(run[name], float) else run[name]
            for name in keep
            if name in run
        }

    return {
        "changes": plan.changes,
        "keys": plan.keys,
        **plan.op_counts(),
        "partitions": partitions,
        "batch_records": batch_records,
        "commit_interval_s": RUN_COMMIT_INTERVAL_S,
        "cores": cores,
        "ours_changes_per_s": round(rate["ours"]),
        "baseline_changes_per_s": round(rate["baseline"]),
        "ratio_vs_baseline": round(rate["ours"] / rate["baseline"], 2),
        "changelog_changes_per_s": round(rate["changelog"]),
        "ratio_vs_changelog": round(rate["ours"] / rate["changelog"], 2),
        "equal_final_state": all(state["equal_final_state"] for state in states),
        "final_rows": final_rows,
        "final_digest": states[-1]["expected"]["digest"],
        "index_ops_per_s": index["index_ops_per_s"],
        "index_bytes_per_key": index["index_bytes_per_key"],
        "index_recovery_s": index["index_recovery_s"],
        "index_keys": index["keys"],
        **{
            name: scans[name]
            for name in (
                "scan_s",
                "scan_compacted_s",
                "scan_rewritten_s",
                "scan_vs_rewritten",
                "scan_compacted_vs_rewritten",
                "baseline_scan_s",
                "baseline_scan_vs_rewritten",
            )
            if name in scans
        },
        "scan_rows_equal": scans["scan_rows"] == scans["scan_compacted_rows"] == final_rows,
        "freshness_p50_s": freshness.get("freshness_p50_s"),
        "freshness_p99_s": freshness.get("freshness_p99_s"),
        "freshness_changes_per_s": freshness.get("records_per_s"),
        **{f"{side}_s": round(median_run[side]["seconds"], 2) for side in SIDES},
        **{f"{side}_best_s": round(best[side], 2) for side in SIDES},
        "ratio_vs_baseline_best": round(best["baseline"] / best["ours"], 2),
        "ratio_vs_changelog_best": round(best["changelog"] / best["ours"], 2),
        "runs": {side: [details(run) for run in runs[side]] for side in SIDES},
        "scans": scans,
        "freshness": freshness,
        "index": index,
        "final_states": states,
    }

"""`icekeeper bench e2e`: freshness, from a record's Kafka timestamp to a committed snapshot.

A producer sends synthetic Debezium Avro records at a fixed rate for `seconds` (Kafka timestamps
are the send time), while a writer (trigger every `writer.trigger_interval`) and the bookkeeper
(a commit cycle every second) run, all on this machine with the local stack. Producer, writer
and bookkeeper are separate processes, as deployed (in one process they would queue on one GIL).
When everything is committed, each record's freshness is the commit time of the snapshot that
added its file (the bookkeeper's commit report) minus its Kafka timestamp (`_kfk_timestamp`).

The clock starts after `warmup_s` of the same load went through: the first batches of a fresh
JVM run at a fraction of steady-state speed while the JIT compiles the Kafka reader, decoder
and Parquet writer, and `freshness_*` describes the pipeline as it runs, not its start.

Reported: `freshness_p50_s`, `freshness_p99_s`, `freshness_max_s`, `written_p50_s` and
`written_p99_s` (Kafka timestamp to the Parquet file written: the writer's share), `records_per_s` sustained
(records committed over the production window), `records`, `snapshots`.

With `mode="upsert"` the table mirrors its source (70% updates, 10% deletes, 20% inserts, as in
`bench upsert`), and a change may leave no row to time: a later change of its key in the same
batch replaces it, a delete leaves a position delete. There, a change's freshness is the commit
time of the first snapshot whose committed offsets cover it (offsets from each snapshot's summary,
read as the commit reports come in, since the bookkeeper expires old snapshots) minus its Kafka
timestamp, for every change; `written_*` still times the rows the data files keep.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFileContent
from pyiceberg.table import Table

from common.catalog import load_table_or_none, open_catalog
from common.committed_state import CommittedState
from common.config import IcekeeperConfig, load_config
from common.logs import configure_logging
from icekeeper.bench.committed_offsets import CommittedOffsets
from icekeeper.bench.work import fresh_work_folder
from icekeeper.samples.produce import produce_at_rate
from icekeeper.samples.synthetic import SyntheticSpec

Progress = Callable[[str], None]
TABLE = "bench.freshness"


def e2e_config(
    base: IcekeeperConfig, work: Path, topic: str, cores: int | None, mode: str = "changelog"
) -> IcekeeperConfig:
    """The stack's addresses from `base`; a fresh state folder, one topic, one table (`mode`: changelog or upsert)."""
    source = base.sources[0]
    return load_config(
        None,
        environ={
            "ICEKEEPER__STATE_DIR": str(work),
            "ICEKEEPER__CACHE_DIR": str(base.cache_dir),
            "ICEKEEPER__SOURCES__0__BOOTSTRAP_SERVERS": source.bootstrap_servers,
            "ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_URL": source.schema_registry_url or "",
            "ICEKEEPER__SOURCES__0__TOPICS": f"[{topic}]",
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": topic + ".dlq",
            "ICEKEEPER__TABLES": f"[{{identifier: {TABLE}, topics: [{topic}], primary_key: [id], mode: {mode}}}]",
            "ICEKEEPER__WRITER__SPARK_MASTER": f"local[{cores or os.cpu_count() or 2}]",
            "ICEKEEPER__BOOKKEEPER__COMMIT_INTERVAL": "1",
            "ICEKEEPER__BOOKKEEPER__HTTP_PORT": "0",
        },
    )


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def record_freshness(config: IcekeeperConfig, since_ms: int) -> tuple[list[float], list[float]]:
    """Seconds from Kafka timestamp to commit, and to the file being written (its modification
    time, so the two shares of the delay show: writer, then bookkeeper), for every row produced
    at or after `since_ms`."""
    commits = {}
    for line in Path(config.bookkeeper.commit_report_path).read_text().splitlines():
        report = json.loads(line)
        commits[report["snapshot_id"]] = report["committed_at_ms"]
    table = open_catalog(config).load_table(TABLE)
    committed: list[float] = []
    written: list[float] = []
    for manifest in table.current_snapshot().manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.content != DataFileContent.DATA:
                continue  # an upsert table's position deletes
            committed_ms = commits[entry.snapshot_id]
            path = entry.data_file.file_path.removeprefix("file://")
            written_ms = os.stat(path).st_mtime * 1000
            column = pq.read_table(path, columns=["_kfk_timestamp"]).column(0)
            kafka_ms = [
                ms for ms in pc.divide(column.cast("int64"), 1000).to_pylist() if ms >= since_ms
            ]  # from microseconds
            committed.extend((committed_ms - ms) / 1000 for ms in kafka_ms)
            written.extend((written_ms - ms) / 1000 for ms in kafka_ms)
    return committed, written


def _committed_records(table: Table | None, by_offsets: bool) -> int:
    """Records the table holds: its rows, or (`by_offsets`, upsert tables) the records its offsets cover."""
    snapshot = table.current_snapshot() if table is not None else None
    if snapshot is None:
        return 0
    if by_offsets:
        return sum(
            CommittedState.from_summary(snapshot.summary.additional_properties).offsets.values()
        )
    return int(snapshot.summary.additional_properties.get("total-records", 0))


def _wait_for_rows(
    config: IcekeeperConfig, rows: int, deadline: float, by_offsets: bool = False
) -> None:
    catalog = open_catalog(config)
    while time.monotonic() < deadline:
        if _committed_records(load_table_or_none(catalog, TABLE), by_offsets) >= rows:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{TABLE} did not reach {rows} rows in time")


def bookkeeper_process(config: IcekeeperConfig, stop: Any, ready: Any) -> None:
    """The bookkeeper as its own process, stopped (after its current commit) when `stop` is set."""
    from bookkeeper.service import Bookkeeper

    configure_logging()
    bookkeeper = Bookkeeper(config)
    threading.Thread(target=lambda: (stop.wait(), bookkeeper.stop.set()), daemon=True).start()
    bookkeeper.warm_key_indexes()  # ready once a table it starts with is indexed, as a long-running bookkeeper's is
    ready.set()
    bookkeeper.run()


def run_e2e_bench(
    base: IcekeeperConfig,
    seconds: float = 60.0,
    rate_per_s: float = 2000.0,
    cores: int | None = None,
    warmup_s: float = 10.0,
    progress: Progress = print,
    mode: str = "changelog",
    spark: Any = None,
) -> dict[str, Any]:
    """Args:
    mode: the table's mode, `changelog` or `upsert` (see the module docstring).
    spark: a SparkSession for the writer, left running; default: a new one, stopped at the end.
    """
    from common.spark import spark_session
    from writers.job import WriterJob

    upsert = mode == "upsert"
    topic = f"bench.freshness.{uuid.uuid4().hex[:8]}"
    work = fresh_work_folder(base.state_dir, "bench-e2e")
    config = e2e_config(base, work, topic, cores, mode)
    shape = {
        "keys": 20_000,
        "schema_changes": 0,
        "server": "bench",
        "db": "freshness",
        "table": "rows",
    }
    if upsert:
        shape.update(update_ratio=0.7, delete_ratio=0.1)
    spec = SyntheticSpec(seed=7, events=int(seconds * rate_per_s), **shape)
    warm_up = SyntheticSpec(seed=1, events=max(10, int(warmup_s * rate_per_s)), **shape)
    owns_spark = spark is None
    spark = spark or spark_session(config, "icekeeper-bench-e2e")
    writer = WriterJob(config, spark=spark)
    writer_thread = threading.Thread(target=writer.run, name="writer")
    context = multiprocessing.get_context("spawn")
    stop_bookkeeper, bookkeeper_ready = context.Event(), context.Event()
    bookkeeper = context.Process(
        target=bookkeeper_process,
        args=(config, stop_bookkeeper, bookkeeper_ready),
        name="bookkeeper",
    )
    produced: dict[str, Any] = {}
    committed_offsets = CommittedOffsets(config, TABLE).start() if upsert else None
    try:
        with ProcessPoolExecutor(
            max_workers=1, mp_context=context, initializer=configure_logging
        ) as producer:
            bookkeeper.start()
            writer_thread.start()
            if not bookkeeper_ready.wait(120):
                raise TimeoutError("the bookkeeper process did not start")
            progress(f"warming up: {warm_up.events:,} records at {rate_per_s:,.0f}/s")
            warmed = producer.submit(produce_at_rate, config, warm_up, rate_per_s, topic).result()
            _wait_for_rows(
                config, warmed["records"], deadline=time.monotonic() + 180, by_offsets=upsert
            )
            progress(
                f"producing {spec.events:,} records at {rate_per_s:,.0f}/s for {seconds:.0f}s to {topic}"
            )
            since_ms = int(time.time() * 1000)
            produced = producer.submit(produce_at_rate, config, spec, rate_per_s, topic).result()
        ended = time.monotonic()
        _wait_for_rows(
            config,
            produced["records"] + warmed["records"],
            deadline=time.monotonic() + 120,
            by_offsets=upsert,
        )
        drain_s = time.monotonic() - ended
    finally:
        writer.stop.set()
        stop_bookkeeper.set()
        if writer_thread.is_alive():
            writer_thread.join(timeout=60)
        if bookkeeper.pid is not None:
            bookkeeper.join(timeout=60)
            if bookkeeper.is_alive():
                bookkeeper.kill()
        if committed_offsets is not None:
            committed_offsets.stop()
        if owns_spark:
            spark.stop()
    delays, written = record_freshness(config, since_ms)
    if committed_offsets is not None:
        delays = committed_offsets.freshness(topic, since_ms)
    commits = len(Path(config.bookkeeper.commit_report_path).read_text().splitlines())
    result = {
        "freshness_p50_s": round(statistics.median(delays), 3),
        "freshness_p99_s": round(percentile(delays, 0.99), 3),
        "freshness_max_s": round(max(delays), 3),
        "written_p50_s": round(statistics.median(written), 3),
        "written_p99_s": round(percentile(written, 0.99), 3),
        "records_per_s": produced.get("rate_per_s"),
        "records": len(delays),
        "produced": produced.get("records"),
        "seconds": produced.get("seconds"),
        "drain_s": round(drain_s, 2),
        "snapshots": commits,
        "writer_trigger_s": config.writer.trigger_interval,
        "commit_interval_s": config.bookkeeper.commit_interval,
        "warmup_s": warmup_s,
    }
    shutil.rmtree(work, ignore_errors=True)
    return result

"""`icekeeper bench e2e`: freshness as a reader sees it, from a record's Kafka timestamp.

A producer sends synthetic Debezium Avro records at a fixed rate for `seconds` (Kafka timestamps are
the send time), while a writer (the config's `writer.engine`, a batch every `FRESHNESS_TRIGGER_S`)
and the bookkeeper (the config's `bookkeeper.commit_interval`) run, all on this machine with the
local stack. Producer, writer, bookkeeper and the observer are separate processes, as deployed (in
one process they would queue on one GIL). The observer (`snapshot_observer.py`) polls the catalog
every 50 ms and notes when each snapshot first becomes visible; a record's freshness is that moment
for the first snapshot whose committed offsets cover it, minus its Kafka timestamp, for every record
(`committed_offsets.py`). The same holds for upsert tables, where a change may leave no row.

The clock starts after `warmup_s` of the same load went through: the first batches of a fresh
JVM run at a fraction of steady-state speed while the JIT compiles the Kafka reader, decoder
and Parquet writer, and `freshness_*` describes the pipeline as it runs, not its start.

Reported: `freshness_p50_s`, `freshness_p99_s`, `freshness_max_s`; `written_p50_s` and
`written_p99_s` (Kafka timestamp to the Parquet file written: the writer's share, for the rows
the data files keep); `records_per_s`, the committed throughput (records of the window over the
time from its start until the last of them was visible), beside `produced_per_s`.

Then, unless `sweep_rates` is empty, the same pipeline takes windows of `sweep_seconds`
at each higher rate, one after the other (each drained before the next), until a
window's p99 exceeds `SUSTAINED_P99_S` or its committed throughput falls below 90% of
the rate: `max_sustained_rate_per_s` is the highest committed throughput of a window
that held (`sweep` has every window's figures; `sweep_limited_by` says when the single
producer process, not the pipeline, fell short).
"""

from __future__ import annotations

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

from icekeeper.bench.committed_offsets import record_delays
from icekeeper.bench.snapshot_observer import observe_snapshots, read_seen_snapshots
from icekeeper.bench.work import fresh_work_folder
from icekeeper.common.catalog import load_table_or_none, open_catalog
from icekeeper.common.committed_state import committed_state
from icekeeper.common.config import IcekeeperConfig, load_config
from icekeeper.common.logs import configure_logging
from icekeeper.samples.produce import produce_at_rate
from icekeeper.samples.synthetic import SyntheticSpec

Progress = Callable[[str], None]
TABLE = "bench.freshness"
SUSTAINED_P99_S = 5.0
"""A sweep window holds when its p99 freshness is at most this (and its throughput keeps up)."""
SWEEP_RATES = (4000.0, 8000.0, 16000.0, 32000.0)
FRESHNESS_TRIGGER_S = 0.25
"""The writer's `trigger_interval` here: a low-latency deployment's setting. The default (1 s)
writes a quarter of the files a quarter-second trigger writes, and a record waits half a trigger
on average before its batch starts."""


def e2e_config(
    base: IcekeeperConfig,
    work: Path,
    topic: str,
    cores: int | None,
    mode: str = "changelog",
    extra: dict[str, str] | None = None,
) -> IcekeeperConfig:
    """The stack's addresses, the writer's engine and the commit interval from `base`; a fresh
    state folder, one topic, one table (`mode`: changelog or upsert). `extra`: more settings, as
    `ICEKEEPER__...` environment variables."""
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
            "ICEKEEPER__TABLES": (
                f"[{{identifier: {TABLE}, topics: [{topic}], primary_key: [id], mode: {mode}}}]"
            ),
            "ICEKEEPER__SPARK__MASTER": f"local[{cores or os.cpu_count() or 2}]",
            "ICEKEEPER__BOOKKEEPER__COMMIT_INTERVAL": str(base.bookkeeper.commit_interval),
            "ICEKEEPER__WRITER__ENGINE": base.writer.engine,
            "ICEKEEPER__WRITER__TRIGGER_INTERVAL": str(FRESHNESS_TRIGGER_S),
            "ICEKEEPER__BOOKKEEPER__HTTP_PORT": "0",
            "ICEKEEPER__REAPER__HTTP_PORT": "0",  # soak's reaper: no port to collide on
            "ICEKEEPER__WRITER__HTTP_PORT": "0",
            **(extra or {}),
        },
    )


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def written_delays(config: IcekeeperConfig, since_ms: int) -> list[float]:
    """Seconds from Kafka timestamp to the data file being written (its
    modification time: the writer's share of the delay), for every row
    the table's data files keep, produced at or after `since_ms`."""
    table = open_catalog(config).load_table(TABLE)
    written: list[float] = []
    for manifest in table.current_snapshot().manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.content != DataFileContent.DATA:
                continue  # an upsert table's position deletes
            path = entry.data_file.file_path.removeprefix("file://")
            written_ms = os.stat(path).st_mtime * 1000
            column = pq.read_table(path, columns=["_kfk_timestamp"]).column(0)
            kafka_ms = pc.divide(column.cast("int64"), 1000).to_pylist()  # from microseconds
            written.extend((written_ms - ms) / 1000 for ms in kafka_ms if ms >= since_ms)
    return written


def _committed_records(table: Table | None) -> int:
    """Records of the topic the table's current snapshot covers (its committed offsets)."""
    if table is None or table.current_snapshot() is None:
        return 0
    return sum(committed_state(table).offsets.values())


def _wait_for_records(
    config: IcekeeperConfig,
    records: int,
    timeout_s: float,
    dead: Callable[[], list[str]] = list,
) -> None:
    """Until the table covers `records` records; `dead` names pipeline processes that ended (a
    writer out of memory, say), which stops the wait at once instead of at the timeout."""
    catalog = open_catalog(config)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _committed_records(load_table_or_none(catalog, TABLE)) >= records:
            return
        if ended := dead():
            raise RuntimeError(f"the {', '.join(ended)} process ended before the records were in")
        time.sleep(0.5)
    raise TimeoutError(f"{TABLE} did not cover {records:,} records in {timeout_s:.0f} s")


def wait_for_observed(seen_path: Path, records: int, timeout_s: float) -> None:
    """Until the observer has seen a snapshot covering `records` records of the topic."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = read_seen_snapshots(seen_path) if seen_path.exists() else []
        if seen and sum(seen[-1].offsets.values()) >= records:
            return
        time.sleep(0.05)
    raise TimeoutError(f"the snapshot observer did not see {records:,} records committed")


def bookkeeper_process(config: IcekeeperConfig, stop: Any, ready: Any) -> None:
    """The bookkeeper as its own process, stopped (after its current commit) when `stop` is set."""
    from icekeeper.bookkeeper.service import Bookkeeper

    configure_logging()
    bookkeeper = Bookkeeper(config)
    threading.Thread(target=lambda: (stop.wait(), bookkeeper.stop.set()), daemon=True).start()
    # Ready once it holds the group's lease (a reaper pass waits only on a bookkeeper that does)
    # and a table it starts with is indexed, as a long-running bookkeeper's is.
    bookkeeper.take_lease()
    bookkeeper.warm_key_indexes()
    ready.set()
    bookkeeper.run()


def writer_process(config: IcekeeperConfig, stop: Any, ready: Any) -> None:
    """The writer as its own process with its own SparkSession, stopped after its current batch."""
    from icekeeper.common.spark import spark_session
    from icekeeper.writers.job import WriterJob

    configure_logging()
    spark = spark_session(config, "icekeeper-bench-e2e-writer")
    try:
        writer = WriterJob(config, spark=spark)
        threading.Thread(target=lambda: (stop.wait(), writer.stop.set()), daemon=True).start()
        ready.set()
        writer.run()
    finally:
        spark.stop()


def window_figures(
    delays: list[tuple[int, float]], rate_per_s: float, produced: dict[str, Any]
) -> dict[str, Any]:
    """One window's freshness and committed throughput from its records' (Kafka ms, delay s)."""
    if not delays:
        raise RuntimeError("no record of the window was seen in a snapshot")
    seconds = [delay for _, delay in delays]
    started_ms = min(kafka_ms for kafka_ms, _ in delays)
    last_visible_ms = max(kafka_ms + delay * 1000 for kafka_ms, delay in delays)
    committed_rate = len(delays) / max(1e-3, (last_visible_ms - started_ms) / 1000)
    return {
        "rate_per_s": rate_per_s,
        "produced_per_s": produced["rate_per_s"],
        "records_per_s": round(committed_rate, 1),
        "records": len(delays),
        "freshness_p50_s": round(statistics.median(seconds), 3),
        "freshness_p99_s": round(percentile(seconds, 0.99), 3),
        "freshness_max_s": round(max(seconds), 3),
    }


def holds(window: dict[str, Any]) -> bool:
    """A sweep window holds: p99 within `SUSTAINED_P99_S` and committed throughput keeping up."""
    return (
        window["freshness_p99_s"] <= SUSTAINED_P99_S
        and window["records_per_s"] >= 0.9 * window["produced_per_s"]
    )


class _Pipeline:
    """Writer, bookkeeper and snapshot observer processes over one topic and table."""

    def __init__(self, config: IcekeeperConfig, work: Path) -> None:
        context = multiprocessing.get_context("spawn")
        self.stop = context.Event()
        self.seen_path = work / "seen-snapshots.jsonl"
        self.readies = {name: context.Event() for name in ("writer", "bookkeeper", "observer")}
        self.processes = [
            context.Process(
                target=writer_process, args=(config, self.stop, self.readies["writer"])
            ),
            context.Process(
                target=bookkeeper_process, args=(config, self.stop, self.readies["bookkeeper"])
            ),
            context.Process(
                target=observe_snapshots,
                args=(config, TABLE, str(self.seen_path), self.stop, self.readies["observer"]),
            ),
        ]

    def start(self) -> None:
        for process in self.processes:
            process.start()
        for name, ready in self.readies.items():
            if not ready.wait(180):
                raise TimeoutError(f"the {name} process did not start")

    def dead(self) -> list[str]:
        """Names of the pipeline's processes that have ended."""
        names = ("writer", "bookkeeper", "observer")
        return [
            name
            for name, process in zip(names, self.processes, strict=True)
            if process.pid is not None and not process.is_alive()
        ]

    def close(self) -> None:
        self.stop.set()
        for process in self.processes:
            if process.pid is not None:
                process.join(timeout=90)
                if process.is_alive():
                    process.kill()


def run_e2e_bench(
    base: IcekeeperConfig,
    seconds: float = 60.0,
    rate_per_s: float = 2000.0,
    cores: int | None = None,
    warmup_s: float = 10.0,
    progress: Progress = print,
    mode: str = "changelog",
    sweep_rates: tuple[float, ...] = SWEEP_RATES,
    sweep_seconds: float = 30.0,
) -> dict[str, Any]:
    """Args:
    mode: the table's mode, `changelog` or `upsert` (see the module docstring).
    sweep_rates: the higher rates tried after the main window, in order; empty for none.
    """
    upsert = mode == "upsert"
    topic = f"bench.freshness.{uuid.uuid4().hex[:8]}"
    work = fresh_work_folder(base.state_dir, "bench-e2e")
    config = e2e_config(base, work, topic, cores, mode)
    shape: dict[str, Any] = {
        "keys": 20_000,
        "schema_changes": 0,
        "server": "bench",
        "db": "freshness",
        "table": "rows",
    }
    if upsert:
        shape.update(update_ratio=0.7, delete_ratio=0.1)
    pipeline = _Pipeline(config, work)
    context = multiprocessing.get_context("spawn")
    windows: list[tuple[float, int, dict[str, Any]]] = []
    """(rate, since_ms, what the producer reports) per timed window."""
    produced_total = 0

    def produce(producer: ProcessPoolExecutor, rate: float, window_s: float, seed: int) -> dict:
        nonlocal produced_total
        spec = SyntheticSpec(seed=seed, events=max(10, int(window_s * rate)), **shape)
        produced = producer.submit(produce_at_rate, config, spec, rate, topic).result()
        produced_total += produced["records"]
        # Drained before the next window: windows do not share the pipeline's backlog.
        _wait_for_records(config, produced_total, 180 + window_s, pipeline.dead)
        # The observer polls on its own: a window's last snapshot may not be in its file yet.
        wait_for_observed(pipeline.seen_path, produced_total, timeout_s=10)
        return produced

    try:
        with ProcessPoolExecutor(
            max_workers=1, mp_context=context, initializer=configure_logging
        ) as producer:
            progress("starting the writer, bookkeeper and snapshot observer processes")
            pipeline.start()
            progress(f"warming up: {warmup_s:.0f} s at {rate_per_s:,.0f}/s")
            produce(producer, rate_per_s, warmup_s, seed=1)
            progress(f"producing at {rate_per_s:,.0f}/s for {seconds:.0f} s to {topic}")
            since_ms = int(time.time() * 1000)
            windows.append((rate_per_s, since_ms, produce(producer, rate_per_s, seconds, 7)))
            main = window_figures(
                record_delays(config, read_seen_snapshots(pipeline.seen_path), topic, since_ms),
                rate_per_s,
                windows[0][2],
            )
            progress(f"freshness at {rate_per_s:,.0f}/s: {main}")
            sweep: list[dict[str, Any]] = []
            for seed, rate in enumerate(sweep_rates, start=100):
                window_since = int(time.time() * 1000)
                try:
                    produced = produce(producer, rate, sweep_seconds, seed)
                except (TimeoutError, RuntimeError) as error:
                    sweep.append({"rate_per_s": rate, "error": str(error)})
                    break
                seen = read_seen_snapshots(pipeline.seen_path)
                figures = window_figures(
                    record_delays(config, seen, topic, window_since), rate, produced
                )
                sweep.append(figures | {"holds": holds(figures)})
                progress(f"sweep at {rate:,.0f}/s: {sweep[-1]}")
                if not sweep[-1]["holds"]:
                    break
    finally:
        pipeline.close()
    written = written_delays(config, since_ms)
    held = [window for window in sweep if window.get("holds")]
    short = [
        w for w in sweep if "produced_per_s" in w and w["produced_per_s"] < 0.95 * w["rate_per_s"]
    ]
    result = {
        **{key: main[key] for key in ("freshness_p50_s", "freshness_p99_s", "freshness_max_s")},
        "written_p50_s": round(statistics.median(written), 3) if written else None,
        "written_p99_s": round(percentile(written, 0.99), 3) if written else None,
        "records_per_s": main["records_per_s"],
        "produced_per_s": main["produced_per_s"],
        "rate_per_s": rate_per_s,
        "records": main["records"],
        "snapshots": len(read_seen_snapshots(pipeline.seen_path)),
        "writer_engine": config.writer.engine,
        "writer_trigger_s": config.writer.trigger_interval,
        "commit_interval_s": config.bookkeeper.commit_interval,
        "observer_poll_s": 0.05,
        "warmup_s": warmup_s,
        # What was committed, not offered: a producer that fell short offered less than its rate.
        "max_sustained_rate_per_s": max((w["records_per_s"] for w in held), default=None),
        "sweep": sweep,
        "sweep_limited_by": "producer" if short else None,
        "mode": mode,
    }
    shutil.rmtree(work, ignore_errors=True)
    return result

"""`icekeeper bench soak`: does a long run level off? Memory and commit latency over time.

The pipeline of `bench e2e` (a producer at a fixed rate, the writer, the bookkeeper) plus the
reaper on its schedule (`reaper_every_s`), each its own process as deployed, runs for `minutes`.
Every `report_every_s` one JSON line reports, for the interval just ended:

- `rss_mb`: resident memory of each role's process (`writer`, `bookkeeper`, `reaper`, `producer`)
  and of the processes they started (`writer_jvm`, `reaper_jvm`: Spark's JVMs;
  `bookkeeper_workers`: its footer readers, summed), read from `/proc` (Linux);
- `commit_p50_ms`, `commit_p99_ms`, `commits`: the bookkeeper's commit latency (its commit
  reports' `latency_ms`) and the number of commits in the interval;
- `bookkeeper_rss_kinds_mb`: the bookkeeper's resident memory by kind (`anon`: its heaps;
  `file`: mapped files), to tell a heap that grows from libraries loaded late;
- `live_data_files`: the table's live data files (its current snapshot's `total-data-files`),
  which grow between the reaper's compactions whatever the kept history;
- `snapshots`, `metadata_kb`: the table's kept history (snapshots listed) and the size of its
  current metadata file, which grow until `keep_snapshots_for` has passed and then stay;
- `load_1m`: the machine's load average, since other work on the machine slows commits down.

A bookkeeper whose memory follows the kept history grows while the history grows (the first
`keep_snapshots_for`) and levels off after: the last intervals' `rss_mb.bookkeeper` should be
flat. `keep_snapshots_for` defaults to the config's (an hour), so a 90-minute soak spends half an
hour with a full history.
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
from pathlib import Path
from typing import Any

from icekeeper.bench.e2e import TABLE, bookkeeper_process, e2e_config, percentile, writer_process
from icekeeper.bench.heap_census import start_census, status_mb
from icekeeper.bench.server_cpu import child_pids
from icekeeper.bench.work import fresh_work_folder
from icekeeper.common.catalog import load_table_or_none, open_catalog
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.logs import configure_logging
from icekeeper.samples.produce import produce_at_rate
from icekeeper.samples.synthetic import SyntheticSpec

Progress = Callable[[str], None]
PRODUCE_SLICE_S = 60.0
"""The producer sends in slices of this many seconds (a fresh synthetic stream each), so a long
soak never plans all its events at once."""


def producer_process(config: IcekeeperConfig, topic: str, rate_per_s: float, stop: Any) -> None:
    """Synthetic Debezium records at `rate_per_s` until `stop` is set."""
    configure_logging()
    stopping = threading.Event()
    threading.Thread(target=lambda: (stop.wait(), stopping.set()), daemon=True).start()
    seed = 1
    while not stopping.is_set():
        spec = SyntheticSpec(
            seed=seed,
            events=int(PRODUCE_SLICE_S * rate_per_s),
            keys=20_000,
            schema_changes=0,
            server="bench",
            db="soak",
            table="rows",
        )
        produce_at_rate(config, spec, rate_per_s, topic, stop=stopping)
        seed += 1


def reaper_process(config: IcekeeperConfig, every_s: float, stop: Any) -> None:
    """The reaper as its own process, a pass every `every_s` (the first at once)."""
    from icekeeper.reaper.service import Reaper

    configure_logging()
    reaper = Reaper(config)
    threading.Thread(target=lambda: (stop.wait(), reaper.stop.set()), daemon=True).start()
    try:
        reaper.run(every_s)
    finally:
        reaper.close()


CENSUS_EVERY = 5
"""The type census walks every object under the GIL: one sample in five is enough to name a type."""


def bookkeeper_with_census(
    config: IcekeeperConfig, stop: Any, ready: Any, census_path: str | None, every_s: float
) -> None:
    """`bookkeeper_process`, sampling its own memory layers to `census_path` when given."""
    if census_path:
        start_census(Path(census_path), every_s, CENSUS_EVERY, threading.Event())
    bookkeeper_process(config, stop, ready)


def resident_mb(pid: int) -> float | None:
    """A process's resident memory (VmRSS) in MB, or None once it is gone."""
    return status_mb(pid, ("VmRSS",)).get("VmRSS")


def resident_kinds_mb(pid: int) -> dict[str, float]:
    """A process's resident memory by kind (`RssAnon`: its heaps; `RssFile`: mapped files, the
    shared libraries it loaded), in MB; empty once it is gone. A creep in `anon` is memory the
    process allocated; one in `file` is code and data it mapped."""
    kinds = status_mb(pid, ("RssAnon", "RssFile", "RssShmem"))
    return {name.removeprefix("Rss").lower(): mb for name, mb in kinds.items()}


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def role_memory(roles: dict[str, int]) -> dict[str, float | None]:
    """Resident MB of each role's process, of the JVMs the writer and reaper started (Spark),
    and of the bookkeeper's footer reader processes (summed)."""
    memory: dict[str, float | None] = {name: resident_mb(pid) for name, pid in roles.items()}
    for name, pid in roles.items():
        descendants, queue = [], child_pids(pid)
        while queue:
            child = queue.pop()
            descendants.append(child)
            queue.extend(child_pids(child))
        jvms = [child for child in descendants if "java" in _command(child).split(" ", 1)[0]]
        others = [child for child in descendants if child not in jvms]
        if jvms:
            memory[f"{name}_jvm"] = round(sum(resident_mb(jvm) or 0.0 for jvm in jvms), 1)
        if name == "bookkeeper" and others:
            memory["bookkeeper_workers"] = round(
                sum(resident_mb(child) or 0.0 for child in others), 1
            )
    return memory


class CommitReports:
    """The bookkeeper's commit report lines, read on from where the last read stopped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._position = 0

    def new_latencies_ms(self) -> list[float]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as reports:
            reports.seek(self._position)
            chunk = reports.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._position += len(complete)
        return [
            float(json.loads(line)["latency_ms"])
            for line in complete.splitlines()
            if line.strip() and json.loads(line).get("files")
        ]


def table_history(config: IcekeeperConfig) -> tuple[int, float, int | None]:
    """Snapshots the table keeps, its current metadata file's size in KB, and its live data files
    (the current snapshot's `total-data-files`: what a commit's manifests cover grows with it)."""
    table = load_table_or_none(open_catalog(config), TABLE)
    if table is None:
        return 0, 0.0, None
    location = table.metadata_location.removeprefix("file://")
    size = os.path.getsize(location) if os.path.exists(location) else 0
    current = table.current_snapshot()
    files = current.summary.get("total-data-files") if current and current.summary else None
    return len(table.metadata.snapshots), round(size / 1024, 1), int(files) if files else None


def run_soak(
    base: IcekeeperConfig,
    minutes: float = 90.0,
    report_every_s: float = 600.0,
    rate_per_s: float = 2000.0,
    cores: int | None = None,
    reaper_every_s: float = 600.0,
    keep_snapshots_for_s: float | None = None,
    heap_census_path: Path | None = None,
    heap_census_every_s: float = 60.0,
    progress: Progress = print,
    emit: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the pipeline for `minutes`; `emit` gets each interval's figures as they come (see the
    module docstring). `heap_census_path`: where the bookkeeper appends, every
    `heap_census_every_s`, what its memory is made of (`bench.heap_census`). Returns every
    interval and the run's settings."""
    topic = f"bench.soak.{uuid.uuid4().hex[:8]}"
    work = fresh_work_folder(base.state_dir, "bench-soak")
    extra = {"ICEKEEPER__REAPER__EXECUTE_INTERVAL": str(reaper_every_s)}
    if keep_snapshots_for_s is not None:
        extra["ICEKEEPER__BOOKKEEPER__KEEP_SNAPSHOTS_FOR"] = str(keep_snapshots_for_s)
    config = e2e_config(base, work, topic, cores, extra=extra)
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    writer_ready, bookkeeper_ready = context.Event(), context.Event()
    processes = {
        "bookkeeper": context.Process(
            target=bookkeeper_with_census,
            args=(
                config,
                stop,
                bookkeeper_ready,
                str(heap_census_path) if heap_census_path else None,
                heap_census_every_s,
            ),
        ),
        "writer": context.Process(target=writer_process, args=(config, stop, writer_ready)),
        "producer": context.Process(
            target=producer_process, args=(config, topic, rate_per_s, stop)
        ),
        "reaper": context.Process(target=reaper_process, args=(config, reaper_every_s, stop)),
    }
    reports = CommitReports(Path(config.bookkeeper.commit_report_path))
    intervals: list[dict[str, Any]] = []
    try:
        progress("starting the bookkeeper and writer processes")
        for name in ("bookkeeper", "writer"):
            processes[name].start()
        for name, ready in (("bookkeeper", bookkeeper_ready), ("writer", writer_ready)):
            if not ready.wait(180):
                raise TimeoutError(f"the {name} process did not start")
        progress(f"producing {rate_per_s:,.0f}/s to {topic}; the reaper every {reaper_every_s} s")
        processes["producer"].start()
        processes["reaper"].start()
        started = time.monotonic()
        deadline = started + minutes * 60
        while time.monotonic() < deadline:
            stop.wait(min(report_every_s, max(0.0, deadline - time.monotonic())))
            if ended := [n for n, p in processes.items() if not p.is_alive()]:
                raise RuntimeError(f"the {', '.join(ended)} process ended during the soak")
            latencies = reports.new_latencies_ms()
            snapshots, metadata_kb, live_files = table_history(config)
            figures = {
                "minute": round((time.monotonic() - started) / 60, 1),
                "rss_mb": role_memory({n: p.pid for n, p in processes.items() if p.pid}),
                "bookkeeper_rss_kinds_mb": resident_kinds_mb(processes["bookkeeper"].pid or 0),
                "commits": len(latencies),
                "commit_p50_ms": round(statistics.median(latencies), 1) if latencies else None,
                "commit_p99_ms": round(percentile(latencies, 0.99), 1) if latencies else None,
                "snapshots": snapshots,
                "metadata_kb": metadata_kb,
                "live_data_files": live_files,
                # The machine's load: other work on it slows commits (and the writer) down.
                "load_1m": round(os.getloadavg()[0], 1),
            }
            intervals.append(figures)
            if emit is not None:
                emit(figures)
    finally:
        stop.set()
        for process in processes.values():
            if process.pid is not None:
                process.join(timeout=120)
                if process.is_alive():
                    process.kill()
    shutil.rmtree(work, ignore_errors=True)
    return {
        "minutes": minutes,
        "report_every_s": report_every_s,
        "rate_per_s": rate_per_s,
        "reaper_every_s": reaper_every_s,
        "keep_snapshots_for_s": config.bookkeeper.keep_snapshots_for,
        "commit_interval_s": config.bookkeeper.commit_interval,
        "writer_engine": config.writer.engine,
        "intervals": intervals,
    }

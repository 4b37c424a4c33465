"""The bookkeeper's resident memory and commit latency over thousands of commits, in minutes
(issue 26, item 7).

`python -m icekeeper.bench.bookkeeper_memory [--commits 2000] [--every 200]
[--keep-snapshots-for 40] [--lease] [--trace-from N] [--json]`

Commits single-moniker snapshots (`--monikers-per-commit` for more; seed-like files of 100 rows,
as `icekeeper bench bookkeeper`, written before the first commit so that writing them is not
measured) one a cycle on a local SQLite catalog, with `bookkeeper.keep_snapshots_for` short enough
for the kept history to fill within the run (40 s: a few hundred snapshots here; the default hour
needs `bench soak`). Every `--every` commits one JSON line: `rss_mb` (this process's resident
memory), `snapshots` kept, glibc's main heap, `heap_mb` = `in_use_mb` + `free_mb` (free chunks the
heap cannot give back: fragmentation), Python's small-object arenas (`pymalloc_arenas_mb`, of
which `pymalloc_used_mb` in blocks in use: arenas held beyond the blocks in use are
fragmentation, which tracemalloc does not see), pyarrow's memory pool (`arrow_mb`),
`commit_p50_ms` (the commits of the interval) and `objects` (Python objects the garbage collector
tracks), all read before any collection, as the service would be; then `cyclic_garbage`, the
objects a full collection finds unreachable (what commits left to the cyclic collector: a
reference cycle through a table keeps every metadata version alive until a full collection), and
`rss_after_collect_mb` (`--no-collect`: neither). Once the history is full, `rss_mb`,
`pymalloc_arenas_mb`, `objects` and `commit_p50_ms` should stay flat.

`--lease`: hold the group's lease, as the service does (each cycle renews it, each table's commit
checks it). `--trace-from N`: trace allocations (tracemalloc) from commit N on, and at the end
print what grew most between commit N and the last commit (by traceback) and the object types
whose count grew: what a commit leaves behind. `--profile-from A,B`: profile the 100 commits from
commit A and from commit B (cProfile, by own time): what makes later commits slower.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import gc
import io
import json
import os
import pstats
import shutil
import statistics
import time
import tracemalloc
from typing import Any

import pyarrow as pa

from icekeeper.bench.bookkeeper import TABLE, bench_config, bench_monikers, seed_schema
from icekeeper.bench.heap_census import glibc_heap_mb, pymalloc_stats
from icekeeper.bench.soak import resident_mb
from icekeeper.bench.work import fresh_work_folder
from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.transports import open_transport

PROFILED_COMMITS = 100
"""Commits profiled from each `--profile-from` commit on (a whole merge-append cycle)."""


def heap_layers_mb() -> dict[str, float]:
    """glibc's heaps and pymalloc's arenas in MB, under the names this bench has always printed
    (read by `heap_census`, the soak's census, so both benches read the same counters)."""
    figures: dict[str, float] = {}
    if glibc := glibc_heap_mb():
        figures |= {
            "heap_mb": glibc["arena"],
            "in_use_mb": glibc["in_use"],
            "free_mb": glibc["free"],
        }
    pymalloc = pymalloc_stats()
    for name, ours in (
        ("bytes_in_arenas", "pymalloc_arenas_mb"),
        ("bytes_in_allocated_blocks", "pymalloc_used_mb"),
    ):
        if name in pymalloc:
            figures[ours] = round(pymalloc[name] / 2**20, 1)
    return figures


def object_counts() -> collections.Counter[str]:
    """Objects the garbage collector tracks, by type name."""
    return collections.Counter(type(item).__name__ for item in gc.get_objects())


def run_memory_bench(
    state_dir: str,
    commits: int,
    every: int,
    keep_snapshots_for_s: float,
    emit: Any = print,
    lease: bool = False,
    trace_from: int | None = None,
    monikers_per_commit: int = 1,
    profile_from: tuple[int, ...] = (),
    collect: bool = True,
) -> list[dict[str, Any]]:
    work = fresh_work_folder(state_dir, "bench-bookkeeper-memory")
    config = bench_config(work)
    config.bookkeeper.keep_snapshots_for = keep_snapshots_for_s
    monikers = bench_monikers(config, seed_schema(config), commits * monikers_per_commit)
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    if lease:
        bookkeeper.take_lease()
    lines = []
    latencies_ms: list[float] = []
    traced: tuple[tracemalloc.Snapshot, collections.Counter[str]] | None = None
    started = time.monotonic()
    try:
        profiler: cProfile.Profile | None = None
        for seq in range(1, commits + 1):
            if trace_from is not None and seq == trace_from:
                tracemalloc.start(25)
            if seq in profile_from:
                profiler = cProfile.Profile()
                profiler.enable()
            for moniker in monikers[(seq - 1) * monikers_per_commit : seq * monikers_per_commit]:
                transport.publish(moniker)
            report = bookkeeper.run_cycle()
            assert report.committed_monikers == monikers_per_commit
            latencies_ms.append(report.tables[0].seconds * 1000)
            if profiler is not None and seq - PROFILED_COMMITS + 1 in profile_from:
                profiler.disable()
                emit(f"profile of commits {seq - PROFILED_COMMITS + 1}-{seq}, by own time:")
                printed = io.StringIO()
                pstats.Stats(profiler, stream=printed).sort_stats("tottime").print_stats(25)
                emit(printed.getvalue())
                profiler = None
            if seq % every == 0 or seq == trace_from:
                line = {
                    "commits": seq,
                    "rss_mb": resident_mb(os.getpid()),
                    "snapshots": len(bookkeeper.catalog.load_table(TABLE).metadata.snapshots),
                    **heap_layers_mb(),
                    "arrow_mb": round(pa.total_allocated_bytes() / 2**20, 1),
                    "objects": len(gc.get_objects()),
                    "commit_p50_ms": round(statistics.median(latencies_ms), 1),
                    "seconds": round(time.monotonic() - started),
                }
                if collect:
                    # Measured first, as the service runs (garbage waits for the collector's
                    # own schedule); then what a full collection finds unreachable: cyclic
                    # garbage the commits left (none, once commits break their cycles).
                    line["cyclic_garbage"] = gc.collect()
                    line["rss_after_collect_mb"] = resident_mb(os.getpid())
                if tracemalloc.is_tracing():
                    line["traced_mb"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 2)
                if seq == trace_from:
                    traced = (tracemalloc.take_snapshot(), object_counts())
                latencies_ms.clear()
                lines.append(line)
                emit(json.dumps(line))
        if traced is not None:
            gc.collect()
            _print_growth(traced, commits - (trace_from or 0), emit)
    finally:
        tracemalloc.stop()
        bookkeeper.committer.close(save_key_indexes=False)
        if bookkeeper.lease is not None:
            bookkeeper.lease.release()
        shutil.rmtree(work, ignore_errors=True)
    return lines


def _print_growth(
    first: tuple[tracemalloc.Snapshot, collections.Counter[str]], commits: int, emit: Any
) -> None:
    """What grew between the first traced point and now: memory by traceback, objects by type."""
    before, counts = first
    grown = tracemalloc.take_snapshot().compare_to(before, "traceback")
    total = sum(stat.size_diff for stat in grown)
    emit(f"traced memory grown over {commits} commits: {total:,} B ({total / commits:,.0f} B each)")
    for stat in grown[:8]:
        emit(f"{stat.size_diff:+,} B in {stat.count_diff:+,} blocks, allocated at:")
        for line in stat.traceback.format(limit=8, most_recent_first=True):
            emit("    " + line)
    more = object_counts() - counts
    emit("object types grown: " + json.dumps(dict(more.most_common(12))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--every", type=int, default=200)
    parser.add_argument("--keep-snapshots-for", type=float, default=40.0)
    parser.add_argument("--monikers-per-commit", type=int, default=1)
    parser.add_argument("--lease", action="store_true", help="hold the lease, as the service")
    parser.add_argument("--trace-from", type=int, help="trace allocations from this commit on")
    parser.add_argument(
        "--profile-from",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=(),
        help=f"profile the {PROFILED_COMMITS} commits from each of these (comma-separated)",
    )
    parser.add_argument(
        "--no-collect",
        action="store_true",
        help="no full garbage collection after each line's figures (`cyclic_garbage` not "
        "counted; garbage in cycles waits for the collector's own schedule throughout)",
    )
    parser.add_argument("--state-dir", default=".icekeeper")
    parser.add_argument("--json", action="store_true", help="only the JSON lines")
    args = parser.parse_args()
    lines = run_memory_bench(
        args.state_dir,
        args.commits,
        args.every,
        args.keep_snapshots_for,
        emit=print,
        lease=args.lease,
        trace_from=args.trace_from,
        monikers_per_commit=args.monikers_per_commit,
        profile_from=args.profile_from,
        collect=not args.no_collect,
    )
    if not args.json:
        first, last = lines[len(lines) // 2], lines[-1]
        print(
            f"rss over the second half: {first['rss_mb']} -> {last['rss_mb']} MB, commit p50 "
            f"{first['commit_p50_ms']} -> {last['commit_p50_ms']} ms "
            f"({first['commits']} -> {last['commits']} commits)"
        )


if __name__ == "__main__":
    main()

"""Commit latency as a table's history grows to an hour of snapshots (issue 14, item 7).

`python -m icekeeper.bench.snapshot_history [--commits 3700] [--plain] [--json]`

The bookkeeper keeps snapshots for `bookkeeper.keep_snapshots_for` (1 hour by default) so that
streaming readers may lag; at one commit a second that is 3,600 snapshots in the table metadata.
This commits single-moniker snapshots (seed-like files of 100 rows, as `icekeeper bench bookkeeper`)
at default settings on a local SQLite catalog and reports, over windows of 100 commits:

- `commit_ms_at_100` / `commit_ms_at_N`: median commit latency of commits 100-199 and of the last
  100 (the table then holds N-100 to N snapshots), their p90 and the cycle's CPU time;
- `expiry_commit_ms`: the commit that expires the snapshots past the hour (the clock moved an
  hour on), and the median of the 100 commits around it;
- `metadata_bytes`: the metadata file at the end.

`--plain` runs pyiceberg's own metadata path (no `bookkeeper.table_metadata` shortcuts), for
comparison; its commits slow down with every snapshot, so give it fewer (`--commits 1100`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from collections.abc import Callable
from typing import Any

from icekeeper.bench.bookkeeper import TABLE, bench_config, bench_monikers, seed_schema
from icekeeper.bench.work import fresh_work_folder
from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.catalog import open_catalog
from icekeeper.common.transports import open_transport

Progress = Callable[[str], None]
WINDOW = 100


def _window(latencies: list[float], cpu: list[float], window: slice) -> dict[str, float]:
    picked, picked_cpu = latencies[window], cpu[window]
    return {
        "median_ms": round(statistics.median(picked) * 1000, 1),
        "p90_ms": round(statistics.quantiles(picked, n=10)[-1] * 1000, 1),
        "cpu_ms": round(statistics.median(picked_cpu) * 1000, 1),
    }


def run_snapshot_history_bench(
    state_dir: str, commits: int = 3700, plain: bool = False, progress: Progress = print
) -> dict[str, Any]:
    """Commit `commits` single-moniker snapshots, then 100
    more an hour later; figures as described above."""
    work = fresh_work_folder(state_dir, "bench-snapshot-history")
    config = bench_config(work)
    schema = seed_schema(config)
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config, catalog=open_catalog(config) if plain else None)
    latencies: list[float] = []
    cpu: list[float] = []

    def commit(seq: int) -> None:
        transport.publish(bench_monikers(config, schema, 1, start_seq=seq)[0])
        cpu_started = time.process_time()
        report = bookkeeper.run_cycle()
        cpu.append(time.process_time() - cpu_started)
        latencies.append(report.tables[0].seconds)

    for seq in range(1, commits + 1):
        commit(seq)
        if seq % 500 == 0:
            progress(
                f"  {seq:,} commits, latest median "
                f"{statistics.median(latencies[-WINDOW:]) * 1000:.0f} ms"
            )
    table = bookkeeper.catalog.load_table(TABLE)
    kept_before = len(table.snapshots())
    # An hour and a minute after the first snapshot: the next commit expires the first minute's.
    first_ms = min(snapshot.timestamp_ms for snapshot in table.snapshots())
    shift_ms = first_ms + 3_660_000 - int(time.time() * 1000)
    bookkeeper.committer.commit_path.now_ms = lambda: int(time.time() * 1000) + shift_ms
    for seq in range(commits + 1, commits + WINDOW + 1):
        commit(seq)
    bookkeeper.committer.close()
    table = bookkeeper.catalog.load_table(TABLE)
    metadata_bytes = os.path.getsize(table.metadata_location.removeprefix("file://"))
    late = slice(commits - WINDOW, commits)
    result = {
        "path": "pyiceberg" if plain else "icekeeper",
        "commits": commits,
        "snapshots_kept": kept_before,
        "commit_ms_at_100": _window(latencies, cpu, slice(WINDOW, 2 * WINDOW)),
        f"commit_ms_at_{commits}": _window(latencies, cpu, late),
        "expiry_commit_ms": round(latencies[commits] * 1000, 1),
        "expiry_commit_cpu_ms": round(cpu[commits] * 1000, 1),
        "after_expiry": _window(latencies, cpu, slice(commits, None)),
        "snapshots_after_expiry": len(table.snapshots()),
        "metadata_bytes": metadata_bytes,
    }
    result["growth_ratio"] = round(
        result[f"commit_ms_at_{commits}"]["median_ms"] / result["commit_ms_at_100"]["median_ms"], 2
    )
    shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--commits", type=int, default=3700, help="single-moniker commits before the hour passes"
    )
    parser.add_argument(
        "--plain", action="store_true", help="pyiceberg's own metadata path, for comparison"
    )
    parser.add_argument(
        "--state-dir",
        default=".icekeeper",
        help="folder for the bench's catalog and files (removed after)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args()
    result = run_snapshot_history_bench(
        args.state_dir, args.commits, args.plain, progress=lambda line: print(line, flush=True)
    )
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

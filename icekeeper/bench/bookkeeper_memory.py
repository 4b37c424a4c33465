"""The bookkeeper's resident memory over thousands of commits, in minutes (issue 26, item 7).

`python -m icekeeper.bench.bookkeeper_memory [--commits 2000] [--every 200]
[--keep-snapshots-for 40] [--json]`

Commits single-moniker snapshots (seed-like files of 100 rows, as `icekeeper bench bookkeeper`,
written before the first commit so that writing them is not measured) one a cycle on a local
SQLite catalog, with `bookkeeper.keep_snapshots_for` short enough for the kept history to fill
within the run (40 s: a few hundred snapshots here; the default hour needs `bench soak`). Every
`--every` commits one JSON line: `rss_mb` (this process's resident memory), `snapshots` kept,
and glibc's main heap, `heap_mb` = `in_use_mb` + `free_mb` (free chunks the heap cannot give
back: fragmentation). Once the history is full, `rss_mb` and `heap_mb` should stay flat.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import shutil
import time
from typing import Any

from icekeeper.bench.bookkeeper import TABLE, bench_config, bench_monikers, seed_schema
from icekeeper.bench.soak import resident_mb
from icekeeper.bench.work import fresh_work_folder
from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.transports import open_transport


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
        )
    ]


def glibc_heap_mb() -> dict[str, float]:
    """glibc's main heap (`mallinfo2`): its size, what is in use, and what is free; empty where
    the C library is not glibc 2.33+."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {
        "heap_mb": round(info.arena / 2**20, 1),
        "in_use_mb": round(info.uordblks / 2**20, 1),
        "free_mb": round(info.fordblks / 2**20, 1),
    }


def run_memory_bench(
    state_dir: str, commits: int, every: int, keep_snapshots_for_s: float, emit: Any = print
) -> list[dict[str, Any]]:
    work = fresh_work_folder(state_dir, "bench-bookkeeper-memory")
    config = bench_config(work)
    config.bookkeeper.keep_snapshots_for = keep_snapshots_for_s
    monikers = bench_monikers(config, seed_schema(config), commits)
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    lines = []
    started = time.monotonic()
    try:
        for seq, moniker in enumerate(monikers, start=1):
            transport.publish(moniker)
            assert bookkeeper.run_cycle().committed_monikers == 1
            if seq % every == 0:
                gc.collect()
                table = bookkeeper.catalog.load_table(TABLE)
                line = {
                    "commits": seq,
                    "rss_mb": resident_mb(os.getpid()),
                    "snapshots": len(table.metadata.snapshots),
                    **glibc_heap_mb(),
                    "seconds": round(time.monotonic() - started),
                }
                lines.append(line)
                emit(json.dumps(line))
    finally:
        bookkeeper.committer.close(save_key_indexes=False)
        shutil.rmtree(work, ignore_errors=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--every", type=int, default=200)
    parser.add_argument("--keep-snapshots-for", type=float, default=40.0)
    parser.add_argument("--state-dir", default=".icekeeper")
    parser.add_argument("--json", action="store_true", help="only the JSON lines")
    args = parser.parse_args()
    lines = run_memory_bench(args.state_dir, args.commits, args.every, args.keep_snapshots_for)
    if not args.json:
        first, last = lines[len(lines) // 2], lines[-1]
        print(
            f"rss over the second half: {first['rss_mb']} -> {last['rss_mb']} MB "
            f"({first['commits']} -> {last['commits']} commits)"
        )


if __name__ == "__main__":
    main()

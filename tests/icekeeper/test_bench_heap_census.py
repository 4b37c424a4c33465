"""The soak's heap census: each layer it reports moves when that layer holds more memory."""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from pathlib import Path

import pytest

from icekeeper.bench.heap_census import glibc_heap_mb, pymalloc_stats, sample, start_census


class _Held:
    """A type no library defines, so its count in the census is this test's own."""


def test_a_growing_set_of_objects_shows_in_blocks_arenas_and_the_type_census() -> None:
    # The collector off between the samples: the collections 200,000 new objects set off freed
    # other tests' garbage too (CI: the blocks in use grew 4.3 MB, not the objects' 6.4).
    gc.collect()
    gc.disable()
    try:
        before = sample(census=True)
        held = [_Held() for _ in range(200_000)]
        after = sample(census=True)
    finally:
        gc.enable()
    assert after["types"].get("_Held", 0) >= 200_000 > before["types"].get("_Held", 0)
    assert after["python_blocks"] - before["python_blocks"] >= 200_000
    # The blocks in use grew by the objects' bytes (at least 32 each), and the arenas (1 MiB each
    # since Python 3.10) hold them. Whether the arenas' count grows depends on the free room a
    # long test process already has in them, so it is not asserted.
    grown = (
        after["pymalloc"]["bytes_in_allocated_blocks"]
        - before["pymalloc"]["bytes_in_allocated_blocks"]
    )
    assert grown >= 200_000 * 32
    arenas = after["pymalloc"]["arenas_allocated_current"]
    assert arenas * 2**20 >= after["pymalloc"]["bytes_in_allocated_blocks"]
    del held


def test_glibc_heap_counts_a_block_malloc_holds() -> None:
    before = glibc_heap_mb()
    if before is None:
        pytest.skip("not glibc")
    block = bytearray(64 * 1024 * 1024)  # above the mmap threshold: counted as mmapped
    after = glibc_heap_mb()
    assert after is not None and after["mmapped"] - before["mmapped"] >= 63
    del block


def test_pymalloc_stats_leave_stderr_working(capfd) -> None:  # type: ignore[no-untyped-def]
    assert pymalloc_stats()["arenas_allocated_current"] > 0
    os.write(2, b"after\n")
    assert capfd.readouterr().err.endswith("after\n")


def test_the_census_thread_appends_samples_until_stopped(tmp_path: Path) -> None:
    path = tmp_path / "census.jsonl"
    stop = threading.Event()
    start_census(path, every_s=0.05, census_every=3, stop=stop)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        not path.exists() or len(path.read_text().splitlines()) < 4
    ):
        time.sleep(0.05)
    stop.set()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) >= 4
    assert "types" in lines[0] and "types" not in lines[1] and "types" in lines[3]
    assert all(line["rss_mb"]["VmRSS"] > 0 for line in lines)

"""glibc's allocator as the bookkeeper sets it: multi-megabyte texts freed every cycle leave no
free chunks behind in the heap (common/process_memory.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from icekeeper.common import process_memory

_CHURN = """
import ctypes, json, sys
from icekeeper.common.process_memory import keep_large_blocks_off_the_heap

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    )]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
tuned = sys.argv[1] == "tuned" and keep_large_blocks_off_the_heap()
kept = []
for index in range(300):  # a commit a second: a metadata file's text, a bit larger each time
    text = "x" * (3_400_000 + index * 1000)
    data = text.encode()
    kept.append(bytearray(2000))  # and what stays: small objects allocated meanwhile
    del text, data
info = libc.mallinfo2()
print(json.dumps({"tuned": tuned, "heap": info.arena, "free": info.fordblks}))
"""


def _churn(side: str) -> dict:
    run = subprocess.run(
        [sys.executable, "-c", _CHURN, side],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
        check=True,
    )
    return json.loads(run.stdout)


@pytest.mark.skipif(process_memory._glibc() is None, reason="the C library is not glibc")
def test_large_blocks_freed_every_cycle_leave_no_free_chunks_in_the_heap() -> None:
    """Without the setting glibc raises its mmap threshold after the first large free, and the
    next texts are carved from the heap, leaving free chunks it cannot give back (the soak's
    creep); with it, they are mapped and returned whole."""
    default, tuned = _churn("default"), _churn("tuned")
    assert tuned["tuned"] and not default["tuned"]
    assert tuned["free"] < 2**20, tuned  # under a megabyte of free chunks
    assert tuned["heap"] < default["heap"], (tuned, default)


def test_free_memory_is_released_at_most_once_per_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trims: list[int] = []

    class FakeLibc:
        def malloc_trim(self, pad: int) -> int:
            trims.append(pad)
            return 1

    monkeypatch.setattr(process_memory, "_glibc", lambda: FakeLibc())
    clock = iter([0.0, 10.0, 59.0, 61.0, 62.0, 122.0])
    monkeypatch.setattr(process_memory.time, "monotonic", lambda: next(clock))
    releaser = process_memory.FreeMemoryReleaser(interval_s=60)  # made at 0
    assert [releaser.maybe_release() for _ in range(5)] == [False, False, True, False, True]
    assert trims == [0, 0]

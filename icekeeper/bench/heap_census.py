"""What a long-running process's memory is made of, sampled from inside it, for the soak.

The soak sees the bookkeeper's resident memory from outside (/proc). When that memory creeps,
the question is which layer holds it: live Python objects (a leak: counts grow, and the type
census says which), pymalloc's arenas (fragmentation: arenas grow while blocks in use stay
flat), glibc's heaps (mallinfo2: `arena` grows while `uordblks` stays flat), Arrow's pool, or
threads. Each sample answers that with numbers. It is not free: a census (one sample in
`census_every`) lists every tracked object once, a list that size allocated and freed, and holds
the GIL for the walk (tens to hundreds of milliseconds): a bench-only tool.

Python has no API for pymalloc's arena count; `sys._debugmallocstats` prints it to the C
stderr, so the census reads it by pointing file descriptor 2 at a temporary file for the call.
Structured log lines other threads write in that instant land in the same file and are copied
back; anything else written to stderr then is lost, and a process started in that instant
inherits the temporary file as its stderr.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _glibc_mallinfo2() -> Any:
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    function = getattr(ctypes.CDLL(path), "mallinfo2", None)  # glibc >= 2.33
    if function is not None:
        function.restype = _Mallinfo2
    return function


_MALLINFO2 = _glibc_mallinfo2()
_MB = 1024 * 1024


def glibc_heap_mb() -> dict[str, float] | None:
    """glibc's heaps, all arenas summed: `arena` held from the system by sbrk/heaps, `mmapped`
    big blocks, `in_use` and `free` inside the arenas. None off glibc."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return {
        "arena": round(info.arena / _MB, 1),
        "mmapped": round(info.hblkhd / _MB, 1),
        "in_use": round(info.uordblks / _MB, 1),
        "free": round(info.fordblks / _MB, 1),
        "free_chunks": int(info.ordblks),
    }


_PYMALLOC_FIGURES = {
    "arenas_allocated_current": re.compile(r"# arenas allocated current\s*=\s*([\d,]+)"),
    "arenas_highwater": re.compile(r"# arenas highwater mark\s*=\s*([\d,]+)"),
    "bytes_in_allocated_blocks": re.compile(r"# bytes in allocated blocks\s*=\s*([\d,]+)"),
    "bytes_in_available_blocks": re.compile(r"# bytes in available blocks\s*=\s*([\d,]+)"),
    "arenas_reclaimed": re.compile(r"# arenas reclaimed\s*=\s*([\d,]+)"),
    "bytes_in_arenas": re.compile(r"arenas \* \d+ bytes/arena\s*=\s*([\d,]+)"),
}


def pymalloc_stats() -> dict[str, int]:
    """pymalloc's arenas and blocks, parsed from `sys._debugmallocstats` (see the module
    docstring for why file descriptor 2 is redirected around the call)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile("w+b") as captured:
        try:
            os.dup2(captured.fileno(), 2)
            sys._debugmallocstats()  # noqa: SLF001 - the only way to read arena counts
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        text = captured.read().decode(errors="replace")
    figures, others = {}, []
    for name, pattern in _PYMALLOC_FIGURES.items():
        if found := pattern.search(text):
            figures[name] = int(found.group(1).replace(",", ""))
    # Other threads' log lines written during the call: give them back to stderr.
    for line in text.splitlines():
        if line.startswith("{"):
            others.append(line)
    if others:
        os.write(2, ("\n".join(others) + "\n").encode())
    return figures


def status_mb(pid: int | str, fields: tuple[str, ...]) -> dict[str, float]:
    """The `fields` of a process's /proc status (kB figures) in MB (`pid` "self": this one);
    empty once it is gone."""
    figures: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                name, _, value = line.partition(":")
                if name in fields:
                    figures[name] = round(int(value.split()[0]) / 1024, 1)
    except (FileNotFoundError, ProcessLookupError):
        return {}
    return figures


def sample(census: bool) -> dict[str, Any]:
    """One sample of every layer; `census` adds the costly parts (a walk over every tracked
    object and pymalloc's statistics, tens to hundreds of milliseconds under the GIL)."""
    figures: dict[str, Any] = {
        "time": round(time.time(), 1),
        "rss_mb": status_mb("self", ("VmRSS", "RssAnon", "RssFile")),
        "python_blocks": sys.getallocatedblocks(),
        "gc_counts": list(gc.get_count()),
        "threads": threading.active_count(),
        "glibc_mb": glibc_heap_mb(),
    }
    if "pyarrow" in sys.modules:
        figures["arrow_mb"] = round(sys.modules["pyarrow"].total_allocated_bytes() / _MB, 1)
    if census:
        tracked = gc.get_objects()
        figures["gc_objects"] = len(tracked)
        figures["types"] = dict(
            Counter(type(item).__qualname__ for item in tracked).most_common(20)
        )
        del tracked
        figures["pymalloc"] = pymalloc_stats()
    return figures


def start_census(path: Path, every_s: float, census_every: int, stop: threading.Event) -> None:
    """Append a sample to `path` (JSON lines) every `every_s` seconds, with the costly census
    every `census_every`th sample, until `stop` is set; runs in a daemon thread."""

    def loop() -> None:
        count = 0
        while not stop.wait(every_s if count else 0):
            try:
                line = json.dumps(sample(census=count % census_every == 0))
            except Exception as error:  # noqa: BLE001 - a failed sample is a line, not the end
                line = json.dumps({"time": round(time.time(), 1), "error": repr(error)})
            with open(path, "a") as out:
                out.write(line + "\n")
            count += 1

    threading.Thread(target=loop, name="heap-census", daemon=True).start()


class CollectorPauses:
    """The cyclic garbage collector's pauses in this process while installed (`gc.callbacks`):
    each collection's generation and milliseconds, any thread's. A commit's latency includes the
    collections its own allocations (or another thread's) set off: with a few hundred thousand
    objects tracked, a full one takes a hundred milliseconds or more."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._started = 0.0

    def __enter__(self) -> CollectorPauses:
        gc.callbacks.append(self._observe)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self._observe)

    def _observe(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((info["generation"], (time.perf_counter() - self._started) * 1000))

    def since(self, count: int) -> dict[str, float | int]:
        """The pauses after the first `count`: total milliseconds, collections, full ones."""
        newer = self.pauses[count:]
        return {
            "gc_ms": round(sum(ms for _, ms in newer), 1),
            "collections": len(newer),
            "full_collections": sum(1 for generation, _ in newer if generation == 2),
        }

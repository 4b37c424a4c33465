"""glibc's allocator, set for a process that parses and writes multi-megabyte texts every second.

The bookkeeper rewrites a table's metadata file each commit: with the default hour of history, a
text of ~3.4 MB, decoded, encoded and parsed once a second. glibc serves such blocks with `mmap`
only until the first one is freed: it then raises its threshold above that size (its "dynamic
mmap threshold"), and every later block of that size comes from the heap, between the small
objects allocated meanwhile; freed, it leaves holes the heap cannot hand back. The 90-minute soak
showed it: once the history was full (the metadata file no longer growing), the bookkeeper's
resident memory still grew ~0.9 MB a minute, while what Python held stayed flat.

`keep_large_blocks_off_the_heap` pins the threshold (which also turns off its dynamic raise), so
blocks of `LARGE_BLOCK_BYTES` or more are mapped and given back whole when freed;
`FreeMemoryReleaser` asks glibc (`malloc_trim`) now and then to give the pages of free chunks
back, wherever they are in the heap. Both are no-ops where the C library is not glibc (musl,
macOS): the calls are looked up, not assumed. No library does this for Python (its allocator
settings are environment variables read at process start, `MALLOC_MMAP_THRESHOLD_`, which a
process cannot set for itself), hence ctypes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import time
from typing import Any

log = logging.getLogger(__name__)

LARGE_BLOCK_BYTES = 512 * 1024
"""Blocks from this size are mapped, not carved from the heap: well below a metadata file of a
busy table (hundreds of KB to MBs), above the 64 KiB footer reads."""

_M_MMAP_THRESHOLD = -3
"""glibc's `mallopt` parameter number (malloc.h)."""


@functools.cache
def _glibc() -> Any | None:
    """The C library when it is glibc (it has `mallopt` and `malloc_trim`), else None."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.malloc_trim.argtypes = (ctypes.c_size_t,)
    except (OSError, AttributeError):
        return None
    return libc


def keep_large_blocks_off_the_heap(threshold_bytes: int = LARGE_BLOCK_BYTES) -> bool:
    """Map blocks of `threshold_bytes` or more for the rest of this process's life (see the
    module docstring); False where that cannot be set."""
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, threshold_bytes) == 1)


class FreeMemoryReleaser:
    """Gives free heap pages back to the system at most once per `interval_s` (a trim walks the
    heap: about a millisecond for the bookkeeper's)."""

    def __init__(self, interval_s: float = 60.0) -> None:
        self.interval_s = interval_s
        self._last = time.monotonic()

    def maybe_release(self) -> bool:
        """Release now if `interval_s` passed since the last time; True if it did."""
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return False
        self._last = now
        libc = _glibc()
        if libc is None:
            return False
        libc.malloc_trim(0)
        return True

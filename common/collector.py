"""Python's cyclic garbage collector paused while a burst of short-lived objects is made: an
arrow-engine task's body (writers), a REST catalog's answer being parsed (bookkeeper).

A task makes a Python object per Kafka record (confluent-kafka's `Message`, tracked by the
collector) and keeps tens of thousands alive at once, so the collector's generation counts fill
every few hundred records and it walks them again and again: under `perf`, 13-15% of a process
reading 960k seed-like records was `gc_collect_main` and its visits, and reading them took 15-20%
less CPU with the collector off (1.70-1.96 s -> 1.39-1.54 s, four alternating rounds). Nothing a
task makes needs the collector: its objects are freed by reference counting when it returns, and
the collector runs again once the last paused body ends.

A REST catalog's answer to a commit is the table's whole metadata: at 3,600 snapshots some
100,000 lists and dicts, none in a reference cycle, freed by reference counting once the parse
ends. Parsed with the collector on, each answer set off ~50 collections, and now and then a full
one (a walk of every tracked object: ~115 ms at 167,000 objects) inside the commit.

Tasks may run in several threads of one process (small batches run in the writer's own threads),
and `gc.disable` is process-wide: the pause is counted, and the collector comes back when the last
body leaves, as it was before the first one came.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_bodies = 0
_was_enabled = True


@contextmanager
def gc_paused() -> Iterator[None]:
    """Run the block with the cyclic collector off (see the module docstring)."""
    global _bodies, _was_enabled
    with _lock:
        if _bodies == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _bodies += 1
    try:
        yield
    finally:
        with _lock:
            _bodies -= 1
            if _bodies == 0 and _was_enabled:
                gc.enable()

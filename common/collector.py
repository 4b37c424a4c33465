"""Python's cyclic garbage collector, kept out of the bookkeeper's hot allocations.

The collector runs a generation every ~700 net container allocations, and a full collection,
which walks every tracked object (a few hundred thousand in a bookkeeper with an hour of
history), once enough objects have survived into the oldest generation. Parsing a REST catalog's
answer (3,600 snapshots: ~100,000 lists and dicts, none in a reference cycle, nearly all freed
by reference counting as soon as the parse ends) set off some 30 collections each time, and now
and then a full one of 150-220 ms, inside a commit. Paused for the parse, the same objects are
freed as before and the collector finds nothing of theirs when it next runs."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off for the block (any thread's allocations: keep it short), unless
    it was off already (then left off)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()

"""Thread pools a process keeps for its life, one per purpose, made on first use.

The bookkeeper fetches footers and manifests from object stores in threads (their requests wait
with the GIL released). A pool per call would start and stop threads every cycle; one pool per
purpose, made when first needed, keeps a process that never reads an object store free of them.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

_pools: dict[str, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def shared_thread_pool(name: str, threads: int) -> ThreadPoolExecutor:
    """The process's pool for `name` (its threads are named after it), made with `threads`
    threads the first time it is asked for."""
    with _lock:
        pool = _pools.get(name)
        if pool is None:
            pool = _pools[name] = ThreadPoolExecutor(threads, thread_name_prefix=name)
        return pool

"""How long storage has said a file does not exist: the clock of `bookkeeper.missing_file_timeout`.

A file a moniker or a rewrite request names may not be visible yet (an eventually consistent
listing, a writer's upload still in flight), or storage may fail to serve it (throttling, a
network error). Only the first, and only once it lasts past the timeout, makes a moniker
quarantined or a request set aside; an outage never does. The count is this bookkeeper's own,
from when it first found the file missing: a bookkeeper that takes over starts it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class MissingSince:
    """Per key (a file path, a request id), when storage first said it does not exist."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since: dict[str, float] = {}

    def missing_for(self, key: str) -> float:
        """Seconds since `key` was first found missing (0 now, the first time)."""
        now = self._clock()
        return now - self._since.setdefault(key, now)

    def forget(self, key: str) -> None:
        """`key` was served, or failed for another reason than missing, or is done with: its
        count starts again if it goes missing later."""
        self._since.pop(key, None)

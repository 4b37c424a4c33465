"""How a chaos run spreads its records over its steps, however long each step takes here.

The producer sends at a steady rate planned from the number of kills and reassignments, but a
step can take far longer than planned on a busy host (a writer's Spark start takes a minute at a
load of 10 on 2 cores). Records sent ahead of the steps would all be read before the last ones,
and a reassignment needs records arriving, a few at a time, while it waits for writers to publish
batch after batch (`chaos_reassign.py`). So the producer is gated: it may send one share of the
records per step done, and a trickle while a step waits on records.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator


class RecordGate:
    """What `produce_at_rate` asks before each record (`gate`): whether it may send it now."""

    def __init__(self, records: int, steps: int) -> None:
        self.share = math.ceil(records / max(1, steps))
        self.allowance = self.share
        self.sent = 0
        self._trickle: tuple[float, float] | None = None  # (since, records a second)
        self._trickle_from = 0
        self._all = False

    def __call__(self, sent: int) -> bool:
        self.sent = sent
        return self._all or sent < self._allowed()

    def _allowed(self) -> float:
        if self._trickle is None:
            return self.allowance
        since, per_s = self._trickle
        return self._trickle_from + per_s * (time.monotonic() - since)

    def step_done(self) -> None:
        """One more share may go (a step of the run is over)."""
        self.allowance = max(self.allowance, self.sent) + self.share

    @contextlib.contextmanager
    def trickling(self, per_s: float) -> Iterator[None]:
        """While the block runs, `per_s` records a second go and no more, whatever the allowance,
        so that each batch of a writer has a few (what the block took is spent: later steps get
        fewer)."""
        self._trickle_from = self.sent
        self._trickle = (time.monotonic(), per_s)
        try:
            yield
        finally:
            self.allowance = max(self.allowance, self.sent)
            self._trickle = None

    def release_all(self) -> None:
        """The rest go (the chaos is over)."""
        self._all = True

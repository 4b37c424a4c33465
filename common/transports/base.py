"""The one interface every moniker transport implements: publish, receive, acknowledge.

Writers `publish`; the bookkeeper `receive`s deliveries and `acknowledge`s each one only after
the commit that contains it is durable, or `dead_letter`s it with a reason. `pending` lists what
is published and not yet acknowledged, for writers resuming after a restart and for the reaper,
which must never delete a file a pending moniker names. `quarantined` lists what was
dead-lettered, which the reaper spares as well (its records are nowhere else until replayed),
and `replay` publishes a quarantined moniker again. Adding a transport means adding one
module that implements this class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from icekeeper.common.file_events import FileEvent
from icekeeper.common.moniker import Moniker

if TYPE_CHECKING:
    from icekeeper.common.transports.folder import DeadLetterFolder


@dataclass
class Delivery:
    """A received moniker, an Event Grid file event,
    or the raw bytes and why they could not be read.

    A delivery with neither a moniker, a file event nor an error is an event to acknowledge and
    ignore (say, an ADLS `CreateFile` before its `FlushWithClose`).
    """

    moniker: Moniker | None
    source: str
    """Where it came from: a file path, or a queue message id."""
    error: str | None = None
    raw: bytes = b""
    attempts: int = 1
    handle: Any = field(default=None, repr=False)
    """Transport-specific receipt needed to acknowledge it."""
    file_event: FileEvent | None = None

    @property
    def ignorable(self) -> bool:
        return self.moniker is None and self.file_event is None and self.error is None


@dataclass(frozen=True)
class Quarantined:
    """A delivery set aside in the dead-letter place: why, and the moniker when it was readable."""

    name: str
    """Its name in the dead-letter place (what `icekeeper dead-letters replay --id` takes)."""
    reason: str
    source: str
    """Where it was received from (a moniker file, a queue message id)."""
    moniker: Moniker | None
    raw: bytes = field(default=b"", repr=False)
    quarantined_ms: int | None = None


class MonikerTransport(ABC):
    """Carries monikers from writers to the bookkeeper. Every transport
    keeps what it dead-letters whole in a dead-letter folder
    (`dead_letters`), so listing and replaying it is the same for all."""

    dead_letters: DeadLetterFolder

    @abstractmethod
    def publish(self, moniker: Moniker) -> None:
        """Make `moniker` visible to the bookkeeper; call only after all its files are durable."""

    def resume(self, writer_id: str) -> int:
        """Called when writer `writer_id` starts: finish what a writer killed mid-publish left
        half done; returns how many monikers were sent again. Nothing for a one-step publish."""
        return 0

    @abstractmethod
    def receive(self, max_count: int = 1000) -> list[Delivery]:
        """Monikers waiting to be committed, including unreadable ones (with `error` set)."""

    @abstractmethod
    def acknowledge(self, delivery: Delivery) -> None:
        """Forget a delivery for good; only after its commit is durable (or it was a duplicate)."""

    def acknowledge_all(self, deliveries: Sequence[Delivery]) -> None:
        """`acknowledge` each delivery (a transport may do them together: a folder on an object
        store deletes its files several at a time). Each is independent of the others: one that
        fails raises, and a delivery not forgotten is received again, found committed, and
        acknowledged then."""
        for delivery in deliveries:
            self.acknowledge(delivery)

    def acknowledge_copy(self, delivery: Delivery) -> None:
        """Forget one delivery of a moniker that another delivery of the same receive still
        carries (a re-sent message): never what that other delivery needs. A transport whose
        deliveries are the stored moniker itself (one file per moniker) has nothing to drop."""
        return None

    def release(self, deliveries: list[Delivery]) -> None:
        """Deliveries that wait (not acknowledged) and could commit next cycle: make them visible
        to the next `receive` at once. A queue hides a received message for its visibility
        timeout; a folder lists every file each time, so it has nothing to do."""
        return None

    @abstractmethod
    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Move a delivery aside with the reason, so it is neither lost nor retried forever."""

    @abstractmethod
    def pending(self, table: str | None = None, writer_id: str | None = None) -> list[Moniker]:
        """Published, readable, not yet acknowledged monikers (optionally of one table / writer)."""

    def dead_letter_count(self) -> int:
        """How many deliveries sit in the dead-letter place."""
        return self.dead_letters.count()

    def quarantined(self) -> list[Quarantined]:
        """What sits in the dead-letter place, oldest first."""
        return self.dead_letters.list()

    def replay(self, item: Quarantined) -> None:
        """Publish a quarantined moniker again, then take it out of the dead-letter place (a crash
        between the two publishes it twice: the bookkeeper commits a replay once, by moniker id)."""
        if item.moniker is None:
            raise ValueError(f"{item.name}: not a readable moniker; nothing to replay")
        self.publish(item.moniker)
        self.dead_letters.remove(item.name)

    def has_pending(self) -> bool:
        """Whether anything waits to be received; transports override it with a cheaper check."""
        return bool(self.pending())

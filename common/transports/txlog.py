"""Monikers as files in a transaction-log folder (seed 001's design, on any pyarrow filesystem)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from icekeeper.common.config.model import TxLogTransport
from icekeeper.common.moniker import Moniker
from icekeeper.common.transports.base import Delivery, MonikerTransport
from icekeeper.common.transports.folder import DeadLetterFolder, MonikerFolder

log = logging.getLogger(__name__)


class TxLogMonikerTransport(MonikerTransport):
    """Publish = atomic file create; acknowledge =
    delete; dead letter = move aside with a reason."""

    def __init__(self, settings: TxLogTransport) -> None:
        self.folder = MonikerFolder(settings.uri)
        self.dead_letters = DeadLetterFolder(settings.dead_letter_uri)
        self._attempts: dict[str, int] = {}

    def publish(self, moniker: Moniker) -> None:
        self.folder.write(moniker)

    def receive(self, max_count: int = 1000) -> list[Delivery]:
        deliveries = []
        paths = self.folder.list_paths()[:max_count]
        for path, stored in zip(paths, self.folder.read_all(paths)):
            if isinstance(stored, OSError):
                # An outage, not bad input: left pending (its attempts not counted), the others
                # go on; the next cycle reads it again.
                log.warning(
                    "moniker file not readable now; left pending",
                    extra={"source": path, "error": str(stored)},
                )
                continue
            self._attempts[path] = self._attempts.get(path, 0) + 1
            raw = b"" if stored.moniker is not None else _read_quietly(self.folder, path)
            deliveries.append(
                Delivery(stored.moniker, path, stored.error, raw, self._attempts[path], handle=path)
            )
        return deliveries

    def acknowledge(self, delivery: Delivery) -> None:
        self.folder.delete(delivery.handle)
        self._attempts.pop(delivery.handle, None)

    def acknowledge_all(self, deliveries: Sequence[Delivery]) -> None:
        """The files deleted several at a time on an object store (`MonikerFolder.delete_all`)."""
        try:
            self.folder.delete_all([delivery.handle for delivery in deliveries])
        finally:  # a file left by a failure is read again, as a first attempt
            for delivery in deliveries:
                self._attempts.pop(delivery.handle, None)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        raw = delivery.raw or _read_quietly(self.folder, delivery.handle)
        self.dead_letters.put(delivery.source, raw, reason)
        self.acknowledge(delivery)

    def has_pending(self) -> bool:
        return bool(self.folder.list_paths())

    def pending(self, table: str | None = None, writer_id: str | None = None) -> list[Moniker]:
        return [
            stored.moniker
            for stored in self.folder.list(table, writer_id)
            if stored.moniker is not None and writer_id in (None, stored.moniker.writer_id)
        ]


def _read_quietly(folder: MonikerFolder, path: str) -> bytes:
    """The file's bytes, none when it is gone; an outage is raised, so that nothing is
    dead-lettered without its bytes and then deleted."""
    try:
        return folder.read_bytes(path)
    except FileNotFoundError:
        return b""

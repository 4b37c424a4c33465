"""Monikers as Azure Storage Queue messages (seed 003), with a journal folder beside the queue.

The message carries the moniker inline, so the bookkeeper never lists storage; a moniker over
the queue's 64 KiB message limit travels as a pointer to its journal copy. The journal keeps
a copy of every pending moniker because a queue cannot be listed (peek returns at most 32
messages): writers resuming after a restart, and the reaper sparing pending files, read it.
Publish writes the journal copy first, so a crash between the two steps loses nothing: the
writer sends every copy of its own again when it starts (`resend_journal`; the bookkeeper
drops the duplicates), or its table would wait forever for that moniker. A dead-lettered
moniker is kept whole in the dead-letter folder (its journal copy goes, and a queue message
cannot be listed or taken out by name); the dead-letter queue gets a message too, for alerts.
"""

from __future__ import annotations

import json

import pyarrow.fs as pafs
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.storage.queue import QueueClient

from icekeeper.common.config.model import MAX_INLINE_MONIKER_BYTES, AzureQueueTransport
from icekeeper.common.file_events import parse_event_grid
from icekeeper.common.moniker import Moniker, MonikerError, decode_moniker, encode_moniker
from icekeeper.common.transports.base import Delivery, MonikerTransport
from icekeeper.common.transports.folder import DeadLetterFolder, MonikerFolder

MAX_INLINE_BYTES = MAX_INLINE_MONIKER_BYTES
"""Below the 64 KiB message limit with room for the XML escaping the SDK applies (the default of
`transport.max_inline_bytes`)."""
POINTER_KEY = "icekeeper_moniker_pointer"


class AzureQueueMonikerTransport(MonikerTransport):
    """One queue message per moniker; the journal folder holds the durable copies."""

    def __init__(
        self, settings: AzureQueueTransport, visibility_timeout_s: int | None = None
    ) -> None:
        connection_string = settings.connection_string.get_secret_value()
        self.queue = _queue(connection_string, settings.queue_name, settings.api_version)
        self.dead_letter_queue = _queue(
            connection_string, settings.dead_letter_queue_name, settings.api_version
        )
        self.journal = MonikerFolder(settings.journal_uri)
        self.dead_letters = DeadLetterFolder(settings.dead_letter_uri)
        self.visibility_timeout_s = visibility_timeout_s or max(1, int(settings.visibility_timeout))
        self.max_inline_bytes = settings.max_inline_bytes

    def publish(self, moniker: Moniker) -> None:
        path = self.journal.write(moniker)
        self.send(moniker, path)

    def send(self, moniker: Moniker, journal_path: str | None = None) -> None:
        """(Re)send the message of a moniker whose journal copy exists."""
        body = encode_moniker(moniker)
        if len(body) > self.max_inline_bytes:
            body = json.dumps(
                {POINTER_KEY: journal_path or self.journal.path_for(moniker), "id": moniker.id}
            ).encode()
        self.queue.send_message(body.decode("utf-8"))

    def resume(self, writer_id: str) -> int:
        return self.resend_journal(writer_id)

    def resend_journal(self, writer_id: str) -> int:
        """Send again the message of every journal copy of `writer_id`'s monikers; how many.

        A writer killed between the journal write and the send leaves a copy whose message never
        went out, and every later moniker of its table waits on it (`prev_seq`). A queue cannot
        be listed, so which copies lack their message is unknown: all go again, oldest seq first.
        The bookkeeper drops the duplicates (a seq already committed, or an id twice in a receive).
        """
        copies = [
            stored.moniker
            for stored in self.journal.list()
            if stored.moniker is not None and stored.moniker.writer_id == writer_id
        ]
        for moniker in sorted(copies, key=lambda m: (m.table, m.seq)):
            self.send(moniker)
        return len(copies)

    def receive(self, max_count: int = 1000) -> list[Delivery]:
        """Every message visible now, each once: a message received again within the same call
        (a long receive outlasting its visibility timeout) keeps only its newest receipt, the only
        one that can still delete it."""
        deliveries: dict[str, Delivery] = {}
        pages = self.queue.receive_messages(
            messages_per_page=32,
            visibility_timeout=self.visibility_timeout_s,
            max_messages=max_count,
        )
        for message in pages:
            raw = (
                message.content.encode("utf-8")
                if isinstance(message.content, str)
                else bytes(message.content or b"")
            )
            moniker, error = self._decode(raw)
            event = None
            if moniker is None and (grid := parse_event_grid(raw)) is not None:
                event, error = grid.file, grid.error
            deliveries.pop(message.id, None)  # the newer receipt goes last, in receive order
            deliveries[message.id] = Delivery(
                moniker,
                f"queue:{message.id}",
                error,
                raw,
                message.dequeue_count or 1,
                handle=message,
                file_event=event,
            )
        return list(deliveries.values())

    def _decode(self, raw: bytes) -> tuple[Moniker | None, str | None]:
        try:
            parsed = json.loads(raw)
        except ValueError as error:
            return None, f"not JSON: {error}"
        if isinstance(parsed, dict) and POINTER_KEY in parsed:
            if (
                self.journal.filesystem.get_file_info(parsed[POINTER_KEY]).type
                == pafs.FileType.NotFound
            ):
                # Its copy goes only when the moniker is acknowledged: this
                # is a second message of a moniker already committed
                # (`resend_journal`), to acknowledge and ignore, not poison.
                return None, None
            stored = self.journal.read(parsed[POINTER_KEY])
            return stored.moniker, stored.error
        try:
            return decode_moniker(raw), None
        except MonikerError as error:
            return None, str(error)

    def acknowledge(self, delivery: Delivery) -> None:
        self.acknowledge_copy(delivery)
        if delivery.moniker is not None:
            self.journal.delete(self.journal.path_for(delivery.moniker))

    def acknowledge_copy(self, delivery: Delivery) -> None:
        """Delete this message only: the journal copy stays for the moniker's other message
        (`resend_journal` sends a second one while the first may still wait to be committed)."""
        try:
            self.queue.delete_message(delivery.handle)
        except ResourceNotFoundError:
            pass  # already gone (its visibility lapsed and another receive deleted it)
        except HttpResponseError as error:
            if error.error_code != "PopReceiptMismatch":
                raise
            # Received again since (its visibility lapsed): that delivery settles it, or it is
            # received once more and dropped as a duplicate.

    def release(self, deliveries: list[Delivery]) -> None:
        """Visible again at once (visibility timeout 0): a backlog over the commit budget would
        otherwise commit one budget per `visibility_timeout`, and fall behind for good."""
        for delivery in deliveries:
            try:
                # By id and receipt, not the message object: the SDK would upload its content again.
                self.queue.update_message(
                    delivery.handle.id,
                    pop_receipt=delivery.handle.pop_receipt,
                    visibility_timeout=0,
                )
            except ResourceNotFoundError:
                pass  # acknowledged by another receive meanwhile
            except HttpResponseError as error:
                if error.error_code != "PopReceiptMismatch":
                    raise
                # received again since: it is visible to that receive already

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        # The moniker itself, not the message: a big one's message only points to its journal copy,
        # which the acknowledgement deletes.
        raw = encode_moniker(delivery.moniker) if delivery.moniker is not None else delivery.raw
        name = self.dead_letters.put(delivery.source, raw, reason)
        content = (
            delivery.raw.decode("utf-8", "replace") if len(delivery.raw) <= MAX_INLINE_BYTES else ""
        )
        self.dead_letter_queue.send_message(
            json.dumps(
                {"reason": reason, "source": delivery.source, "name": name, "content": content}
            )
        )
        self.acknowledge(delivery)

    def has_pending(self) -> bool:
        return bool(self.queue.peek_messages(max_messages=1))

    def pending(self, table: str | None = None, writer_id: str | None = None) -> list[Moniker]:
        return [
            stored.moniker
            for stored in self.journal.list(table, writer_id)
            if stored.moniker is not None and writer_id in (None, stored.moniker.writer_id)
        ]


def _queue(connection_string: str, name: str, api_version: str | None) -> QueueClient:
    kwargs = {"api_version": api_version} if api_version else {}
    client = QueueClient.from_connection_string(connection_string, name, **kwargs)
    try:
        client.create_queue()
    except ResourceExistsError:
        pass
    return client

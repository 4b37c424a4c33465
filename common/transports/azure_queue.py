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
import logging
import time

import pyarrow.fs as pafs
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.storage.queue import QueueClient, QueueMessage

from icekeeper.common.config.model import MAX_INLINE_MONIKER_BYTES, AzureQueueTransport
from icekeeper.common.file_events import parse_event_grid
from icekeeper.common.moniker import Moniker, MonikerError, decode_moniker, encode_moniker
from icekeeper.common.transports.base import Delivery, MonikerTransport
from icekeeper.common.transports.folder import DeadLetterFolder, MonikerFolder

MAX_INLINE_BYTES = MAX_INLINE_MONIKER_BYTES
"""Below the 64 KiB message limit with room for the XML escaping the SDK applies (the default of
`transport.max_inline_bytes`)."""
POINTER_KEY = "icekeeper_moniker_pointer"
UNREADABLE_READS_KEY = "unreadable_reads"
"""In a pointer message: how many reads found its journal copy unreadable (bad input)."""
UNREACHABLE_RETRY_S = 5
"""How soon a message whose journal copy could not be read (an outage) is received again."""
OUTAGE_BUDGET_S = UNREACHABLE_RETRY_S
"""How long one receive spends on journal reads that fail (an outage) before it reads no more
journal copies: those messages come back `UNREACHABLE_RETRY_S` later, for the next cycle."""
MAX_UNREACHABLE_KEPT = 10_000
"""Ids of messages whose copy could not be read, kept to read them last next time (`receive`)."""

log = logging.getLogger(__name__)


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
        self._unreachable: set[str] = set()
        """Ids of messages whose journal copy the last receive that read it could not read (an
        outage): read after the others in the next receive (`receive`)."""

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
        one that can still delete it.

        A message that cannot be read now (its journal copy's store does not answer, or the
        queue refuses to count an unreadable read) is left out, not raised: the others of the
        call are returned, and it is made visible again `UNREACHABLE_RETRY_S` later. A read that
        fails takes the store client's retries (seconds), longer than that: reading every message
        received, a call took one such message again while another one's read failed, and went
        on for as long as the store failed (no commit, no lease renewal, no stop on SIGTERM). So
        a message is read at most once per call; once the call's failed reads took
        `OUTAGE_BUDGET_S`, it reads no other journal copy (those come back soon too); and a
        message whose copy could not be read last time is read after the others, so that one
        copy that keeps failing never takes the budget of those behind it."""
        deliveries: dict[str, Delivery] = {}
        failed_again: dict[str, QueueMessage] = {}
        reads = _FailedReads()
        pages = self.queue.receive_messages(
            messages_per_page=32,
            visibility_timeout=self.visibility_timeout_s,
            max_messages=max_count,
        )
        for message in pages:
            deliveries.pop(message.id, None)  # the newer receipt goes last, in receive order
            failed_again.pop(message.id, None)
            if message.id in self._unreachable and message.id not in reads.ids:
                failed_again[message.id] = message  # hidden meanwhile: read once the rest is
                continue
            self._read(message, deliveries, reads)
        for message in failed_again.values():
            self._read(message, deliveries, reads)
        if len(self._unreachable) > MAX_UNREACHABLE_KEPT:
            self._unreachable.clear()  # only an order: forgetting it costs no message
        return list(deliveries.values())

    def _read(
        self, message: QueueMessage, deliveries: dict[str, Delivery], reads: _FailedReads
    ) -> None:
        """`message`'s delivery into `deliveries`, or, its copy unreadable now (or this receive
        out of its budget for failed reads), made visible again soon (see `receive`)."""
        if message.id in reads.ids or (
            reads.seconds >= OUTAGE_BUDGET_S and _pointer(_content(message)) is not None
        ):
            reads.ids.add(message.id)
            self._retry_soon(message)
            return
        began = time.monotonic()
        try:
            deliveries[message.id] = self._delivery(message)
        except (OSError, AzureError) as error:
            # An outage, not bad input: not counted toward dead-lettering.
            reads.seconds += time.monotonic() - began
            reads.ids.add(message.id)
            self._unreachable.add(message.id)
            log.warning(
                "queue message not readable now; received again soon",
                extra={"source": f"queue:{message.id}", "error": repr(error)},
            )
            self._retry_soon(message)
            return
        self._unreachable.discard(message.id)

    def _delivery(self, message: QueueMessage) -> Delivery:
        """The delivery of `message`; an outage (its journal copy's store, the queue) raises."""
        raw = _content(message)
        source = f"queue:{message.id}"
        pointer = _pointer(raw)
        if pointer is not None:
            return self._pointed_delivery(message, source, raw, pointer)
        moniker, error = _inline(raw)
        event = None
        if moniker is None and (grid := parse_event_grid(raw)) is not None:
            event, error = grid.file, grid.error
        # The content of a message never changes: each of its receives found what this one did,
        # so the queue's count of them is its count of unreadable reads.
        return Delivery(
            moniker,
            source,
            error,
            raw,
            message.dequeue_count or 1,
            handle=message,
            file_event=event,
        )

    def _pointed_delivery(
        self, message: QueueMessage, source: str, raw: bytes, pointer: dict
    ) -> Delivery:
        """A moniker sent as a pointer to its journal copy. Received many times while it waits
        (its predecessor missing, the cycle full), it counts only the reads that found its copy
        unreadable, in the message itself (`UNREADABLE_READS_KEY`): a restarted bookkeeper goes
        on counting, and a copy readable again is never dead-lettered for its past waits."""
        path = self._journal_path(pointer)
        if path is None:
            reason = f"bad pointer: {pointer[POINTER_KEY]!r} is no file of the journal"
            return self._unreadable(message, source, raw, pointer, reason)
        if self.journal.filesystem.get_file_info(path).type == pafs.FileType.NotFound:
            # Its copy goes only when the moniker is acknowledged: this is a second message of a
            # moniker already committed (`resend_journal`), to acknowledge and ignore, not poison.
            return Delivery(None, source, None, raw, handle=message)
        try:
            data = self.journal.read_bytes(path)
        except FileNotFoundError:
            return Delivery(None, source, None, raw, handle=message)  # acknowledged meanwhile
        try:
            return Delivery(decode_moniker(data), source, None, raw, handle=message)
        except MonikerError as error:
            return self._unreadable(message, source, data, pointer, str(error))

    def _journal_path(self, pointer: dict) -> str | None:
        """The journal file a pointer names, or None for anything else: a message's pointer is
        read, and deleted once dead-lettered, so it must never reach outside the journal."""
        path = pointer[POINTER_KEY]
        if not isinstance(path, str) or ".." in path.split("/"):
            return None
        root = self.journal.root.rstrip("/") + "/"
        return path if path.startswith(root) and path.endswith(".json") else None

    def _unreadable(
        self, message: QueueMessage, source: str, data: bytes, pointer: dict, error: str
    ) -> Delivery:
        """Count this unreadable read in the message before anyone acts on it (a crash after
        counting counts one read more, never fewer: a truly bad copy is dead-lettered after
        `bookkeeper.max_attempts` reads, restarts or not); it stays hidden for the visibility
        timeout, the backoff of bad input."""
        reads = _count(pointer.get(UNREADABLE_READS_KEY)) + 1
        counted = self.queue.update_message(
            message.id,
            pop_receipt=message.pop_receipt,
            content=json.dumps({**pointer, UNREADABLE_READS_KEY: reads}),
            visibility_timeout=self.visibility_timeout_s,
        )
        message.pop_receipt = counted.pop_receipt  # the receipt that deletes it now
        return Delivery(None, source, error, data, reads, handle=message)

    def _retry_soon(self, message: QueueMessage) -> None:
        """Visible again in `UNREACHABLE_RETRY_S`, not the visibility timeout: an outage is
        usually short. Not at once: a receive that outlasts it would read it again and again."""
        try:
            self.queue.update_message(
                message.id,
                pop_receipt=message.pop_receipt,
                visibility_timeout=min(UNREACHABLE_RETRY_S, self.visibility_timeout_s),
            )
        except AzureError as error:
            log.warning(
                "queue message left hidden for the visibility timeout",
                extra={"source": f"queue:{message.id}", "error": repr(error)},
            )

    def acknowledge(self, delivery: Delivery) -> None:
        """The journal copy first, then the message: a failure between the two leaves the
        message, received again and acknowledged as a duplicate (a pointer whose copy is gone is
        ignored). The other way round it left the journal copy, pending for the writers until one
        restarted and sent it again."""
        if delivery.moniker is not None:
            self.journal.delete(self.journal.path_for(delivery.moniker))
        self.acknowledge_copy(delivery)

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
        pointer = _pointer(_content(delivery.handle))
        if delivery.moniker is None and pointer is not None:
            if (path := self._journal_path(pointer)) is not None:
                # An unreadable journal copy, in the dead-letter place now: no writer resends it.
                self.journal.delete(path)

    def has_pending(self) -> bool:
        return bool(self.queue.peek_messages(max_messages=1))

    def pending(self, table: str | None = None, writer_id: str | None = None) -> list[Moniker]:
        return [
            stored.moniker
            for stored in self.journal.list(table, writer_id)
            if stored.moniker is not None and writer_id in (None, stored.moniker.writer_id)
        ]


class _FailedReads:
    """One receive's reads that failed (an outage): which messages, and how long they took."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.seconds = 0.0


def _content(message: QueueMessage | None) -> bytes:
    if message is None or message.content is None:
        return b""
    return (
        message.content.encode("utf-8")
        if isinstance(message.content, str)
        else bytes(message.content)
    )


def _inline(raw: bytes) -> tuple[Moniker | None, str | None]:
    """A moniker carried whole in a message, or why its bytes are not one."""
    try:
        json.loads(raw)
    except (ValueError, RecursionError) as error:  # RecursionError: nested too deep (`[[[[...`)
        return None, f"not JSON: {error}"
    try:
        return decode_moniker(raw), None
    except MonikerError as error:
        return None, str(error)


def _pointer(raw: bytes) -> dict | None:
    """The pointer a message carries instead of a moniker too big for it, if it is one."""
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) and POINTER_KEY in parsed else None


def _count(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0


def _queue(connection_string: str, name: str, api_version: str | None) -> QueueClient:
    kwargs = {"api_version": api_version} if api_version else {}
    client = QueueClient.from_connection_string(connection_string, name, **kwargs)
    try:
        client.create_queue()
    except ResourceExistsError:
        pass
    return client

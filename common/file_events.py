"""Azure Event Grid `BlobCreated` events: a Parquet file that arrived without a moniker (seed 003).

Event Grid delivers storage events to a Storage Queue, base64-encoded by default, in the Event
Grid schema (`eventType`, `data.url`) or as CloudEvents (`type`, `data.url`). A blob counts once
it is complete: `PutBlob`, `PutBlockList` or `CopyBlob` on Blob Storage, `FlushWithClose` on
ADLS Gen2 (where `CreateFile` fires for an empty file first and must be ignored), and not empty:
a block upload may put an empty blob first (pyarrow's Azure filesystem does), then its blocks.
"""

from __future__ import annotations

import base64
import binascii
import json
import urllib.parse
from dataclasses import dataclass

BLOB_CREATED = "Microsoft.Storage.BlobCreated"
COMPLETE_APIS = {"PutBlob", "PutBlockList", "CopyBlob", "FlushWithClose"}


@dataclass(frozen=True)
class FileEvent:
    """A complete file: where it is, and its size as the event reports it."""

    url: str
    size_bytes: int | None
    event_id: str

    @property
    def container_path(self) -> str:
        """`container/path/to/file` for https URLs of Blob/ADLS; the path for local files."""
        return location_key(self.url)


def location_key(location: str) -> str:
    """A comparable key of a storage location, whatever URL form names it.

    `https://acct.blob.core.windows.net/c/p`, `https://acct.dfs.core.windows.net/c/p`,
    `abfs[s]://c@acct.dfs.core.windows.net/p` and `wasbs://c@acct.blob.core.windows.net/p` all give
    `acct/c/p`; `file:///x/p` and `/x/p` give `/x/p`.
    """
    parsed = urllib.parse.urlparse(location)
    if parsed.scheme in ("https", "http") and parsed.netloc:
        account = parsed.netloc.split(".")[0]
        return f"{account}{urllib.parse.unquote(parsed.path)}".rstrip("/")
    if parsed.scheme in ("abfs", "abfss", "wasb", "wasbs") and "@" in parsed.netloc:
        container, host = parsed.netloc.split("@", 1)
        return f"{host.split('.')[0]}/{container}{urllib.parse.unquote(parsed.path)}".rstrip("/")
    if parsed.scheme == "file" or not parsed.scheme:
        return "/" + (parsed.path if parsed.scheme else location).lstrip("/").rstrip("/")
    return location.rstrip("/")


@dataclass(frozen=True)
class EventGridMessage:
    """An Event Grid (or CloudEvents) message: the complete file it announces, or why it has none.

    `file` and `error` both None means an event to acknowledge and ignore: another event type, a
    blob that is not Parquet, or an ADLS `CreateFile` that precedes its `FlushWithClose`.
    """

    file: FileEvent | None = None
    error: str | None = None


def parse_event_grid(raw: bytes | str) -> EventGridMessage | None:
    """The Event Grid message in a queue message (plain or base64 JSON, one event or a list of one).

    Returns None when the message is not an Event Grid event at all (callers try monikers first).
    """
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    parsed = _json(text)
    if parsed is None:
        try:
            parsed = _json(base64.b64decode(text, validate=True).decode("utf-8"))
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
    if isinstance(parsed, list) and len(parsed) == 1:
        parsed = parsed[0]
    if not isinstance(parsed, dict) or not ("eventType" in parsed or "specversion" in parsed):
        return None
    if (parsed.get("eventType") or parsed.get("type")) != BLOB_CREATED:
        return EventGridMessage()
    data = parsed.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        return EventGridMessage(error="BlobCreated event without data.url")
    if data.get("api") not in COMPLETE_APIS or not data["url"].endswith(".parquet"):
        return EventGridMessage()
    size = data.get("contentLength")
    if size == 0:
        # No Parquet file is empty: this is the first step of a block upload. pyarrow's Azure
        # filesystem (so pyarrow, polars, pandas writing abfss://) puts an empty blob, stages the
        # blocks and commits them (`PutBlockList`, a second event with the bytes). Taken as the
        # file, it was quarantined ("N bytes, the event says 0") and its second event, in the
        # same receive, dropped as a duplicate: the file was never committed.
        return EventGridMessage()
    return EventGridMessage(
        FileEvent(
            url=data["url"],
            size_bytes=size if isinstance(size, int) else None,
            event_id=str(parsed.get("id", "")),
        )
    )


def _json(text: str) -> object | None:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # nested deeper than the parser's stack: not an event
        return None

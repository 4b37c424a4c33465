"""Messages as Azure Event Grid delivers blob events to a storage queue, for the Event Grid intake
tests (Azurite has no Event Grid)."""

from __future__ import annotations

import base64
import json
import uuid


def event_grid(
    url: str, api: str, size: int | None, event_type: str = "Microsoft.Storage.BlobCreated"
) -> str:
    """A message as Event Grid's storage-queue handler delivers it: a JSON event, base64-encoded."""
    event = {
        "id": uuid.uuid4().hex,
        "eventType": event_type,
        "subject": url,
        "eventTime": "2026-11-22T08:00:00Z",
        "data": {"api": api, "url": url, "contentLength": size, "blobType": "BlockBlob"},
        "dataVersion": "",
        "metadataVersion": "1",
    }
    return base64.b64encode(json.dumps(event).encode()).decode()


def cloud_event(url: str, api: str, size: int) -> str:
    """The CloudEvents 1.0 schema, sent as plain JSON."""
    return json.dumps(
        {
            "specversion": "1.0",
            "id": uuid.uuid4().hex,
            "type": "Microsoft.Storage.BlobCreated",
            "source": "/subscriptions/x",
            "data": {"api": api, "url": url, "contentLength": size},
        }
    )

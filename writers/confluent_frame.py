"""Confluent's wire format: a value (or key) framed by a zero byte and its schema's registry id.

Both engines choose a record's schema version by its frame (`spark-sql` compares the first five
bytes in SQL, the arrow engine with Arrow compute), and the writer learns schemas by the ids that
frames of dead letters name.
"""

from __future__ import annotations

import struct

FRAME_BYTES = 5
"""The frame's length: the magic byte 0, then the schema id as a 4-byte big-endian int."""


def frame_prefix(schema_id: int) -> bytes:
    """The frame of a value written with schema `schema_id`."""
    return struct.pack(">bI", 0, schema_id)

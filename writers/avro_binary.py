"""Avro's binary encoding of a long, which both engines write by hand: the arrow engine to frame
record bodies as an Avro container, the spark-sql engine to know an all-null record's bytes.
(fastavro has the encoder, but only behind a writer object per value: too slow per record.)"""

from __future__ import annotations


def zigzag_varint(value: int) -> bytes:
    """Avro's encoding of an int or long: zigzag, then a little-endian base-128 varint."""
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag & ~0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)

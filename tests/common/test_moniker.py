"""The moniker codec: one wire form, deterministic ids, and clear errors for bad input."""

from __future__ import annotations

import json

import pytest

from icekeeper.common.moniker import (
    MonikerError,
    decode_moniker,
    encode_moniker,
    moniker_id,
)
from tests.support.moniker_values import SAMPLE_SCHEMA, sample_moniker


def test_round_trip_keeps_every_field() -> None:
    moniker = sample_moniker()
    decoded = decode_moniker(encode_moniker(moniker))
    assert decoded == moniker
    assert decoded.schema_ == SAMPLE_SCHEMA and decoded.bytes == 2001


def test_id_depends_on_writer_table_and_ranges_only() -> None:
    assert sample_moniker(seq=3).id == sample_moniker(seq=9, prev_seq=None).id
    assert sample_moniker().id != sample_moniker(writer="w2").id
    assert sample_moniker().id != sample_moniker(table="db.u").id
    assert sample_moniker().id != sample_moniker(until=151).id
    ranges = sample_moniker().offsets
    assert moniker_id("w1", "db.t", ranges) == moniker_id("w1", "db.t", list(reversed(ranges)))


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda raw: raw.replace(b'"format_version":1', b'"format_version":9'), "format_version"),
        (lambda raw: raw[: len(raw) // 2], "not JSON"),
        (lambda raw: raw.replace(b'"records":21', b'"records":22'), "records"),
        (lambda raw: raw.replace(b'"until_offset":150', b'"until_offset":50'), "until_offset"),
        (lambda raw: raw.replace(b'"writer_id":"w1"', b'"writer_id":"w9"'), "does not match"),
        (lambda raw: b"[1, 2]", "not a JSON object"),
        (lambda raw: raw.replace(b'"table"', b'"tabel"'), "table"),
    ],
)
def test_corrupt_monikers_are_rejected_with_the_reason(mutate, reason: str) -> None:
    with pytest.raises(MonikerError, match=reason):
        decode_moniker(mutate(encode_moniker(sample_moniker())))


def test_prev_seq_must_precede_seq() -> None:
    with pytest.raises(ValueError, match="prev_seq"):
        sample_moniker(seq=2, prev_seq=2)


def test_wire_form_is_plain_json_with_the_schema_key() -> None:
    raw = json.loads(encode_moniker(sample_moniker()))
    assert raw["schema"] == SAMPLE_SCHEMA and raw["format_version"] == 1 and "delete_files" in raw

"""The moniker: what a writer hands the bookkeeper for one table and one batch.

A moniker names the Parquet files a writer made durable, the Iceberg schema they were written with,
and the source offsets they cover. It is the only message between writers and the bookkeeper, so it
is versioned (`format_version`) and has exactly one codec (`encode_moniker` / `decode_moniker`).

Exactly-once rests on two fields besides the offsets. `seq` numbers a writer's batches, and
`prev_seq` names the writer's previous moniker *for the same table*. The bookkeeper commits a
moniker only when the table's committed state already holds `prev_seq` for that writer, so a
writer's monikers land in order and none twice, whatever order the transport delivers them in.
Tables that got no rows in a batch get no moniker; the chain simply skips that batch.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

FORMAT_VERSION = 1


class MonikerError(ValueError):
    """Bytes that are not a readable moniker of a version this code understands."""


class _Value(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OffsetRange(_Value):
    """Records `[from_offset, until_offset)` of one topic-partition."""

    topic: str
    partition: int = Field(ge=0)
    from_offset: int = Field(ge=0)
    until_offset: int = Field(ge=0)
    topic_reset: Literal[True] | None = Field(
        None,
        description="The topic was deleted and recreated (`sources[].on_topic_reset: restart`): "
        "this range starts the new topic below the offsets the table committed of the old one, "
        "and the partition's committed offset becomes `until_offset`.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> OffsetRange:
        if self.until_offset < self.from_offset:
            raise ValueError(f"until_offset {self.until_offset} < from_offset {self.from_offset}")
        return self

    @property
    def count(self) -> int:
        return self.until_offset - self.from_offset


class ColumnMetrics(_Value):
    """Per-field-id statistics, as Iceberg data files carry them (bounds in Iceberg's single-value
    binary form, hex)."""

    column_sizes: dict[int, int] = Field(default_factory=dict)
    value_counts: dict[int, int] = Field(default_factory=dict)
    null_value_counts: dict[int, int] = Field(default_factory=dict)
    nan_value_counts: dict[int, int] = Field(default_factory=dict)
    lower_bounds: dict[int, str] = Field(default_factory=dict)
    upper_bounds: dict[int, str] = Field(default_factory=dict)


class FileEntry(_Value):
    """One file the writer made durable under the table's data folder (`<location>/data`)."""

    path: str
    size_bytes: int = Field(ge=0)
    record_count: int = Field(ge=0)
    content: Literal["data", "deleted-keys"] = Field(
        "data",
        description="`deleted-keys`: rows (of the table's schema) whose keys' last change in the "
        "batch is a delete (upsert tables).",
    )
    partition: dict[str, Any] = Field(
        default_factory=dict, description="Partition field name -> transformed value."
    )
    spec_id: int = 0
    metrics: ColumnMetrics | None = None


class Moniker(_Value):
    """One writer batch for one table. See the module docstring for the ordering fields."""

    format_version: int = FORMAT_VERSION
    id: str
    writer_id: str
    seq: int = Field(ge=0)
    prev_seq: int | None = None
    table: str
    table_location: str | None = Field(
        None, description="Where the writer placed files of a table not created yet."
    )
    schema_: dict[str, Any] = Field(
        alias="schema", description="Iceberg schema (pyiceberg JSON) the files were written with."
    )
    files: list[FileEntry] = Field(default_factory=list)
    delete_files: list[FileEntry] = Field(
        default_factory=list,
        description="Upsert tables: deleted-keys files; the bookkeeper turns them into position "
        "deletes.",
    )
    offsets: list[OffsetRange]
    records: int = Field(ge=0, description="Rows in `files`.")
    dead_lettered: int = Field(
        0, ge=0, description="Records of `offsets` routed here that went to the dead-letter topic."
    )
    min_event_time_ms: int | None = None
    max_event_time_ms: int | None = None
    created_ms: int = Field(default_factory=lambda: int(time.time() * 1000))
    rereads_refused: Literal[True] | None = Field(
        None,
        description="The writer reads a refused moniker's offsets again (it reads the table's "
        "`icekeeper.refusals`): the bookkeeper records a refusal instead of moving the writer's "
        "chain past it. Writers of earlier versions leave it out, and their refused monikers are "
        "dead-lettered as before.",
    )

    @property
    def bytes(self) -> int:
        return sum(entry.size_bytes for entry in self.files) + sum(
            entry.size_bytes for entry in self.delete_files
        )

    @model_validator(mode="after")
    def _consistent(self) -> Moniker:
        if self.records != sum(entry.record_count for entry in self.files):
            raise ValueError(f"records {self.records} != sum of file record counts")
        if self.prev_seq is not None and self.prev_seq >= self.seq:
            raise ValueError(f"prev_seq {self.prev_seq} must be below seq {self.seq}")
        return self


def moniker_id(writer_id: str, table: str, offsets: list[OffsetRange]) -> str:
    """Deterministic id from the writer, the table and the offset ranges it covers."""
    ranges = sorted((r.topic, r.partition, r.from_offset, r.until_offset) for r in offsets)
    digest = hashlib.sha256(json.dumps([writer_id, table, ranges]).encode()).hexdigest()
    return digest[:32]


def encode_moniker(moniker: Moniker) -> bytes:
    """The one wire form: compact UTF-8 JSON."""
    return moniker.model_dump_json(by_alias=True, exclude_none=True).encode("utf-8")


def decode_moniker(data: bytes | str) -> Moniker:
    """Parse and validate; anything unreadable raises `MonikerError` with the reason."""
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        # RecursionError: arrays or objects nested deeper than the parser's stack (`[[[[...`),
        # bad input like any other, never an error that fails the receive of every message.
        raise MonikerError(f"not JSON: {error}") from None
    if not isinstance(raw, dict):
        raise MonikerError("not a JSON object")
    version = raw.get("format_version")
    if version != FORMAT_VERSION:
        raise MonikerError(f"format_version {version!r} is not {FORMAT_VERSION}")
    try:
        moniker = Moniker.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        raise MonikerError(
            f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}"
        ) from None
    if moniker.id != moniker_id(moniker.writer_id, moniker.table, moniker.offsets):
        raise MonikerError(f"id {moniker.id} does not match its writer, table and offsets")
    return moniker

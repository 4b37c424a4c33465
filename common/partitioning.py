"""Partition specs from config terms (`day(ts)`,
`bucket(16, id)`, `ID2`), for writers and bookkeeper.

Both roles build the spec from the same config terms, so a writer lays files out exactly as the
bookkeeper's table is partitioned; field names follow Iceberg's conventions (`ts_day`,
`id_bucket`, ...), and files carry partition values by those names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)

_TERM = re.compile(
    r"^\s*(?:(?P<fn>\w+)\(\s*(?:(?P<arg>\d+)\s*,\s*)?(?P<col1>[\w.]+)\s*\)|(?P<col2>[\w.]+))\s*$"
)
_FIRST_PARTITION_FIELD_ID = 1000


@dataclass(frozen=True)
class PartitionTerm:
    """One config term: transform name, its width/buckets, source column."""

    transform: str  # identity, year, month, day, hour, bucket, truncate
    source: str
    argument: int | None = None

    @property
    def field_name(self) -> str:
        suffix = {
            "identity": "",
            "year": "_year",
            "month": "_month",
            "day": "_day",
            "hour": "_hour",
            "bucket": "_bucket",
            "truncate": "_trunc",
        }[self.transform]
        return f"{self.source}{suffix}"

    def iceberg_transform(self) -> Transform:
        if self.transform == "bucket":
            return BucketTransform(self.argument or 0)
        if self.transform == "truncate":
            return TruncateTransform(self.argument or 0)
        return {
            "identity": IdentityTransform(),
            "year": YearTransform(),
            "month": MonthTransform(),
            "day": DayTransform(),
            "hour": HourTransform(),
        }[self.transform]


def parse_term(term: str) -> PartitionTerm:
    match = _TERM.match(term)
    if not match:
        raise ValueError(f"{term!r} is not a partition term")
    if match.group("col2"):
        return PartitionTerm("identity", match.group("col2"))
    name = (
        match.group("fn").lower().rstrip("s")
        if match.group("fn").lower() in ("years", "months", "days", "hours")
        else match.group("fn").lower()
    )
    if name not in ("year", "month", "day", "hour", "bucket", "truncate", "identity"):
        raise ValueError(f"{term!r}: unknown transform {match.group('fn')!r}")
    argument = int(match.group("arg")) if match.group("arg") else None
    if name in ("bucket", "truncate") and not argument:
        raise ValueError(f"{term!r}: {name} needs a width, e.g. {name}(16, col)")
    return PartitionTerm(name, match.group("col1"), argument)


def resolve_column(schema: Schema, name: str) -> str:
    """The schema's spelling of `name`; seed 000 wrote key and partition columns in lower case."""
    names = [field.name for field in schema.fields]
    if name in names:
        return name
    matches = [candidate for candidate in names if candidate.lower() == name.lower()]
    if len(matches) == 1:
        return matches[0]
    raise ValueError(f"column {name!r} is not in the schema (columns: {names})")


def partition_terms(terms: list[str], schema: Schema) -> list[PartitionTerm]:
    """Parsed terms with source names resolved against the schema."""
    parsed = [parse_term(term) for term in terms]
    return [
        PartitionTerm(term.transform, resolve_column(schema, term.source), term.argument)
        for term in parsed
    ]


def partition_spec(terms: list[str], schema: Schema) -> PartitionSpec:
    """The Iceberg partition spec for config `terms` over `schema` (spec id 0)."""
    fields = []
    for index, term in enumerate(partition_terms(terms, schema)):
        source_id = schema.find_field(term.source).field_id
        fields.append(
            PartitionField(
                source_id=source_id,
                field_id=_FIRST_PARTITION_FIELD_ID + index,
                transform=term.iceberg_transform(),
                name=term.field_name,
            )
        )
    return PartitionSpec(*fields, spec_id=0)

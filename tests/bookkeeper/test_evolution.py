"""Schema evolution decisions: what the bookkeeper changes before committing newer files."""

from __future__ import annotations

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
)

from bookkeeper.evolution import IncompatibleSchema, plan_evolution

TABLE = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "amount", IntegerType(), required=False),
    NestedField(3, "price", DecimalType(10, 2), required=False),
    NestedField(
        4,
        "address",
        StructType(NestedField(5, "city", StringType(), required=False)),
        required=False,
    ),
    NestedField(6, "score", FloatType(), required=True),
    identifier_field_ids=[1],
)


def files(*changed: NestedField) -> Schema:
    by_id = {f.field_id: f for f in TABLE.fields}
    for f in changed:
        by_id[f.field_id] = f
    return Schema(*by_id.values(), identifier_field_ids=[1])


def test_same_schema_needs_nothing() -> None:
    assert plan_evolution(TABLE, TABLE).schema is None


def test_new_column_is_added_with_the_writers_id_as_optional() -> None:
    evolution = plan_evolution(TABLE, files(NestedField(7, "note", StringType(), required=True)))
    added = evolution.schema.find_field("note")
    assert (added.field_id, added.required) == (7, False)
    assert (
        evolution.schema.schema_id == TABLE.schema_id + 1
        and evolution.schema.identifier_field_ids == [1]
    )


def test_nested_field_is_added_inside_its_struct() -> None:
    address = StructType(
        NestedField(5, "city", StringType(), required=False),
        NestedField(7, "zip", StringType(), required=False),
    )
    evolution = plan_evolution(TABLE, files(NestedField(4, "address", address, required=False)))
    assert evolution.schema.find_field("address.zip").field_id == 7
    assert evolution.changes == ["add address.zip string"]


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        (NestedField(2, "amount", LongType(), required=False), LongType()),
        (NestedField(6, "score", DoubleType(), required=True), DoubleType()),
        (NestedField(3, "price", DecimalType(12, 2), required=False), DecimalType(12, 2)),
    ],
)
def test_allowed_widenings(field: NestedField, expected) -> None:
    assert (
        plan_evolution(TABLE, files(field)).schema.find_field(field.field_id).field_type == expected
    )


def test_narrower_files_fit_a_wider_table_without_change() -> None:
    wide = Schema(
        *[
            NestedField(2, "amount", LongType(), required=False) if f.field_id == 2 else f
            for f in TABLE.fields
        ],
        identifier_field_ids=[1],
    )
    assert plan_evolution(wide, TABLE).schema is None


def test_required_becomes_optional() -> None:
    evolution = plan_evolution(TABLE, files(NestedField(6, "score", FloatType(), required=False)))
    assert evolution.schema.find_field("score").required is False


@pytest.mark.parametrize(
    ("field", "reason"),
    [
        (NestedField(2, "amount", StringType(), required=False), "int cannot become string"),
        (
            NestedField(3, "price", DecimalType(10, 3), required=False),
            "decimal scale cannot change",
        ),
        (NestedField(2, "total", IntegerType(), required=False), "field id 2 is 'amount'"),
    ],
)
def test_incompatible_changes_are_refused_with_the_reason(field: NestedField, reason: str) -> None:
    with pytest.raises(IncompatibleSchema, match=reason):
        plan_evolution(TABLE, files(field))


def test_a_new_column_with_an_id_the_table_already_used_is_refused() -> None:
    """A writer that assigned ids against a stale schema
    must not make files read the wrong column."""
    stale = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(5, "note", StringType(), required=False),
        identifier_field_ids=[1],
    )
    with pytest.raises(IncompatibleSchema, match="stale"):
        plan_evolution(TABLE, stale)


def test_columns_missing_from_files_stay_unless_dropping_is_configured() -> None:
    fewer = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "amount", IntegerType(), required=False),
        identifier_field_ids=[1],
    )
    assert plan_evolution(TABLE, fewer).schema is None
    dropped = plan_evolution(TABLE, fewer, allow_drop=True).schema
    assert [f.name for f in dropped.fields] == ["id", "amount"]

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

from icekeeper.bookkeeper.evolution import IncompatibleSchema, plan_evolution

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


def evolve(
    table: Schema,
    files: Schema,
    allow_drop: bool = False,
    last_column_id: int | None = None,
    earlier: tuple[Schema, ...] = (),
):
    """`plan_evolution` on a table whose last-column-id is its schema's highest unless given."""
    return plan_evolution(
        table,
        files,
        allow_drop,
        last_column_id=table.highest_field_id if last_column_id is None else last_column_id,
        earlier_schemas=(*earlier, table),
    )


def test_same_schema_needs_nothing() -> None:
    assert evolve(TABLE, TABLE).schema is None


def test_new_column_is_added_with_the_writers_id_as_optional() -> None:
    evolution = evolve(TABLE, files(NestedField(7, "note", StringType(), required=True)))
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
    evolution = evolve(TABLE, files(NestedField(4, "address", address, required=False)))
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
    assert evolve(TABLE, files(field)).schema.find_field(field.field_id).field_type == expected


def test_narrower_files_fit_a_wider_table_without_change() -> None:
    wide = Schema(
        *[
            NestedField(2, "amount", LongType(), required=False) if f.field_id == 2 else f
            for f in TABLE.fields
        ],
        identifier_field_ids=[1],
    )
    assert evolve(wide, TABLE).schema is None


def test_required_becomes_optional() -> None:
    evolution = evolve(TABLE, files(NestedField(6, "score", FloatType(), required=False)))
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
        evolve(TABLE, files(field))


def test_a_new_column_with_an_id_the_table_already_used_is_refused() -> None:
    """A writer that assigned ids against a stale schema
    must not make files read the wrong column."""
    stale = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(5, "note", StringType(), required=False),
        identifier_field_ids=[1],
    )
    with pytest.raises(IncompatibleSchema, match="stale"):
        evolve(TABLE, stale)


def test_columns_missing_from_files_stay_unless_dropping_is_configured() -> None:
    fewer = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "amount", IntegerType(), required=False),
        identifier_field_ids=[1],
    )
    assert evolve(TABLE, fewer).schema is None
    dropped = evolve(TABLE, fewer, allow_drop=True).schema
    assert [f.name for f in dropped.fields] == ["id", "amount"]


def without(schema: Schema, *names: str) -> Schema:
    """`schema` after `allow_drop_columns` dropped the top-level `names` (next schema id)."""
    return Schema(
        *[f for f in schema.fields if f.name not in names],
        schema_id=schema.schema_id + 1,
        identifier_field_ids=[1],
    )


def test_a_new_column_with_a_dropped_columns_id_is_refused() -> None:
    """Issue 26 item 3: a writer that numbered a new column from the current schema's highest id
    gave it the dropped column's id, and old files' values of that column read as the new one."""
    table = without(TABLE, "score")  # id 6 dropped: highest 5, last-column-id 6
    reused = Schema(*table.fields, NestedField(6, "promo", StringType()), identifier_field_ids=[1])
    with pytest.raises(IncompatibleSchema, match="promo: new field with id 6, which the table"):
        evolve(table, reused, last_column_id=6, earlier=(TABLE,))
    fresh = Schema(*table.fields, NestedField(7, "promo", StringType()), identifier_field_ids=[1])
    evolution = evolve(table, fresh, last_column_id=6, earlier=(TABLE,))
    assert evolution.schema.find_field("promo").field_id == 7
    assert evolution.changes == ["add promo string"]


def test_a_new_nested_field_with_a_dropped_fields_id_is_refused() -> None:
    address = TABLE.find_field("address")
    before = Schema(
        *[f for f in TABLE.fields if f.name != "address"],
        NestedField(
            4,
            "address",
            StructType(*address.field_type.fields, NestedField(7, "zip", StringType())),
        ),
        identifier_field_ids=[1],
    )
    table = Schema(*TABLE.fields, schema_id=1, identifier_field_ids=[1])  # zip (7) dropped
    files = Schema(
        *[f for f in TABLE.fields if f.name != "address"],
        NestedField(
            4,
            "address",
            StructType(*address.field_type.fields, NestedField(7, "street", StringType())),
        ),
        identifier_field_ids=[1],
    )
    with pytest.raises(IncompatibleSchema, match="address.street: new field with id 7"):
        evolve(table, files, last_column_id=7, earlier=(before,))


def test_a_column_dropped_after_the_writer_read_the_schema_comes_back_with_its_id() -> None:
    """Several writers on one table: one still writing `amount` (id 2) when another's files made
    the bookkeeper drop it. Its files are the same column, by id and name: taken back, not
    quarantined as stale."""
    table = without(TABLE, "amount")
    evolution = evolve(table, TABLE, allow_drop=True, last_column_id=6, earlier=(TABLE,))
    assert evolution.schema.find_field("amount") == NestedField(2, "amount", IntegerType())
    assert evolution.changes == ["restore amount int"]
    # Not the same column: `amount`'s id under another name is a stale writer's.
    renamed = Schema(
        *[NestedField(2, "total", IntegerType()) if f.field_id == 2 else f for f in TABLE.fields],
        identifier_field_ids=[1],
    )
    with pytest.raises(IncompatibleSchema, match="total: new field with id 2"):
        evolve(table, renamed, allow_drop=True, last_column_id=6, earlier=(TABLE,))

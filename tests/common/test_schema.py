"""Field ids a writer gives its files' columns (`assign_ids`), on table metadata built as pyiceberg
builds it: a table created, then a schema without dropped columns added as the bookkeeper adds
one, so that its last-column-id stays above the current schema's highest id."""

from __future__ import annotations

from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import AddSchemaUpdate, SetCurrentSchemaUpdate, update_table_metadata
from pyiceberg.types import IntegerType, NestedField, StringType, StructType

from icekeeper.common.schema import Column, assign_ids

ORDERS = Schema(
    NestedField(1, "id", IntegerType(), required=True),
    NestedField(2, "qty", IntegerType(), required=False),
    NestedField(3, "legacy_code", StringType(), required=False),
    NestedField(4, "note", StringType(), required=False),
    identifier_field_ids=[1],
)


def dropped(*names: str) -> TableMetadata:
    """`ORDERS`' metadata after the bookkeeper dropped `names` (`allow_drop_columns`)."""
    created = new_table_metadata(
        ORDERS, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, "file:///t"
    )
    kept = Schema(
        *[f for f in created.schema().fields if f.name not in names],
        schema_id=1,
        identifier_field_ids=[1],
    )
    return update_table_metadata(
        created, (AddSchemaUpdate(schema=kept), SetCurrentSchemaUpdate(schema_id=-1))
    )


def ids(schema: Schema) -> dict[str, int]:
    return {schema.find_column_name(i): i for i in sorted(schema.field_ids)}


def test_a_new_column_after_a_drop_gets_an_id_no_column_had() -> None:
    """Issue 26 item 3: after DROP legacy_code (3), DROP note (4), ADD promo, the current schema's
    highest id is 2; promo took 3 and old files' legacy_code values read as promo."""
    table = dropped("legacy_code", "note")
    assert (table.schema().highest_field_id, table.last_column_id) == (2, 4)
    columns = [
        Column("id", IntegerType(), True),
        Column("qty", IntegerType()),
        Column("promo", StringType()),
    ]
    schema = assign_ids(columns, table, ["id"])
    assert ids(schema) == {"id": 1, "qty": 2, "promo": 5}
    assert schema.identifier_field_ids == [1]
    # Writers that see the same new columns against the same table give them the same ids, so
    # their files agree without the bookkeeper renumbering anything.
    assert assign_ids(columns, table, ["id"]) == schema


def test_a_column_re_added_under_a_dropped_columns_name_is_a_new_column() -> None:
    table = dropped("legacy_code", "note")
    columns = [Column("id", IntegerType(), True), Column("legacy_code", StringType())]
    assert ids(assign_ids(columns, table, ["id"]))["legacy_code"] == 5


def test_nested_ids_of_a_new_struct_follow_the_last_column_id() -> None:
    table = dropped("note")
    address = StructType(
        NestedField(1000, "city", StringType(), required=False),
        NestedField(1001, "zip", StringType(), required=False),
    )
    columns = [Column("id", IntegerType(), True), Column("address", address)]
    assert ids(assign_ids(columns, table, ["id"])) == {
        "id": 1,
        "address": 5,
        "address.city": 6,
        "address.zip": 7,
    }

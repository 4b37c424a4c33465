"""Decide how a table's schema must change before files of a newer schema can be committed.

Files carry Iceberg field ids assigned by their writer (see `common/schema.assign_ids`): names
the table had keep the table's ids, new names got ids after the table's last-column-id. So the
bookkeeper evolves by id, adopting the writer's ids for new columns; that is what makes the
files' columns resolve correctly. Allowed changes: add columns (nested fields too), widen
int->long, float->double, decimal precision (never scale), required->optional, and drop a
column when configured. Anything else is an `IncompatibleSchema` with a reason; the moniker is
quarantined and other monikers and tables keep flowing.

An id is never given to a second column (Iceberg's rule: old files' values under a dropped
column's id would read as the new column). A file's field the table lacks is new only with an id
above the table's last-column-id; below it, it is a column the table dropped after the writer
read its schema (several writers on one table), taken back with its id and name, or else it was
written against a stale schema and refused.

pyiceberg's own `union_by_name` is not used: it assigns fresh ids (which would not match the
files) and accepts decimal scale changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StructType,
)


class IncompatibleSchema(ValueError):
    """Files whose schema the table cannot take; the message says which field and why."""


@dataclass
class Evolution:
    """The table's next schema, or None when the files fit the current one."""

    schema: Schema | None
    changes: list[str] = field(default_factory=list)


_PROMOTIONS = {(IntegerType(), LongType()), (FloatType(), DoubleType())}


@dataclass(frozen=True)
class _AssignedIds:
    """The ids the table has given out, which a file's field the table lacks must not reuse."""

    last_column_id: int
    table_schema: Schema
    earlier_schemas: Sequence[Schema]
    file_schema: Schema

    def dropped_field(self, field_id: int) -> NestedField | None:
        """The field that had `field_id` in the newest earlier schema holding it, if it had the
        files' name (path) for it there and the current schema no longer holds that id: the
        same column, dropped since the writer read the table's schema."""
        if field_id in self.table_schema.field_ids:
            return None  # elsewhere in the table: the writer's ids are stale
        path = self.file_schema.find_column_name(field_id)
        for schema in reversed(self.earlier_schemas):
            if (name := schema.find_column_name(field_id)) is not None:
                return schema.find_field(field_id) if name == path else None
        return None


def plan_evolution(
    table_schema: Schema,
    file_schema: Schema,
    allow_drop: bool = False,
    *,
    last_column_id: int,
    earlier_schemas: Sequence[Schema] = (),
) -> Evolution:
    """The schema the table needs to read files written with `file_schema`.

    Args:
        table_schema: the table's current schema.
        file_schema: the schema the files were written with (their field ids).
        allow_drop: drop the table's columns the files lack (`bookkeeper.allow_drop_columns`).
        last_column_id: the table's last-column-id (`TableMetadata.last_column_id`): the ids up
            to it were given out, possibly to columns dropped since.
        earlier_schemas: the table's schemas (`TableMetadata.schemas`, oldest first), where a
            dropped column is found again; the new schema's id follows theirs.

    Raises:
        IncompatibleSchema: a type that cannot be promoted, or field ids that disagree with names.
    """
    changes: list[str] = []
    ids = _AssignedIds(
        max(last_column_id, table_schema.highest_field_id),
        table_schema,
        earlier_schemas,
        file_schema,
    )
    fields = _merge_struct(
        table_schema.as_struct(), file_schema.as_struct(), ids, "", changes, allow_drop
    )
    if not changes:
        return Evolution(None)
    identifier_ids = list(table_schema.identifier_field_ids) or list(
        file_schema.identifier_field_ids
    )
    # After the highest schema id, not the current one's: an engine that dropped what it added
    # made an earlier schema current again, and "set current" resolves a repeated id to the
    # first schema that has it.
    schema_id = max(s.schema_id for s in (table_schema, *earlier_schemas)) + 1
    schema = Schema(*fields, schema_id=schema_id, identifier_field_ids=identifier_ids)
    return Evolution(schema, changes)


def _merge_struct(
    table: StructType,
    files: StructType,
    ids: _AssignedIds,
    path: str,
    changes: list[str],
    allow_drop: bool,
) -> list[NestedField]:
    file_by_id = {f.field_id: f for f in files.fields}
    file_by_name = {f.name: f for f in files.fields}
    merged: list[NestedField] = []
    for current in table.fields:
        name = f"{path}{current.name}"
        incoming = file_by_id.get(current.field_id)
        if incoming is None:
            if current.name in file_by_name:
                other = file_by_name[current.name]
                raise IncompatibleSchema(
                    f"{name}: the files give it field id {other.field_id}, the table "
                    f"{current.field_id}"
                )
            if allow_drop:
                changes.append(f"drop {name}")
                continue
            merged.append(current)
            continue
        if incoming.name != current.name:
            raise IncompatibleSchema(
                f"field id {current.field_id} is {name!r} in the table but {path}{incoming.name!r} "
                "in the files"
            )
        merged.append(_merge_field(current, incoming, ids, name, changes, allow_drop))
    table_ids = {f.field_id for f in table.fields}
    for incoming in files.fields:
        if incoming.field_id in table_ids:
            continue
        name = f"{path}{incoming.name}"
        # A new column, or a dropped one, can hold nulls for rows without it: added optional.
        if incoming.field_id > ids.last_column_id:
            changes.append(f"add {name} {incoming.field_type}")
            merged.append(
                NestedField(
                    incoming.field_id,
                    incoming.name,
                    incoming.field_type,
                    required=False,
                    doc=incoming.doc,
                )
            )
            continue
        dropped = ids.dropped_field(incoming.field_id)
        if dropped is None:
            raise IncompatibleSchema(
                f"{name}: new field with id {incoming.field_id}, which the table already gave "
                f"out (last column id {ids.last_column_id}; written against a stale schema)"
            )
        # The writer read the schema before the drop was committed: the same column by id and
        # name, with its earlier values (files written since the drop read null).
        field_type = _merge_type(
            dropped.field_type, incoming.field_type, ids, name, changes, allow_drop
        )
        changes.append(f"restore {name} {field_type}")
        merged.append(
            NestedField(dropped.field_id, dropped.name, field_type, required=False, doc=dropped.doc)
        )
    return merged


def _merge_field(
    current: NestedField,
    incoming: NestedField,
    ids: _AssignedIds,
    name: str,
    changes: list[str],
    allow_drop: bool,
) -> NestedField:
    required = current.required
    if current.required and not incoming.required:
        changes.append(f"make {name} optional")
        required = False
    field_type = _merge_type(
        current.field_type, incoming.field_type, ids, name, changes, allow_drop
    )
    return NestedField(
        current.field_id, current.name, field_type, required=required, doc=current.doc
    )


def _merge_type(
    current: IcebergType,
    incoming: IcebergType,
    ids: _AssignedIds,
    name: str,
    changes: list[str],
    allow_drop: bool,
) -> IcebergType:
    if current == incoming:
        return current
    if isinstance(current, StructType) and isinstance(incoming, StructType):
        return StructType(*_merge_struct(current, incoming, ids, f"{name}.", changes, allow_drop))
    if isinstance(current, ListType) and isinstance(incoming, ListType):
        element = _merge_type(
            current.element_type,
            incoming.element_type,
            ids,
            f"{name}[]",
            changes,
            allow_drop,
        )
        return ListType(
            current.element_id, element, current.element_required and incoming.element_required
        )
    if isinstance(current, MapType) and isinstance(incoming, MapType):
        if current.key_type != incoming.key_type:
            raise IncompatibleSchema(
                f"{name}: map key type {current.key_type} cannot become {incoming.key_type}"
            )
        value = _merge_type(
            current.value_type, incoming.value_type, ids, f"{name}{{}}", changes, allow_drop
        )
        return MapType(
            current.key_id,
            current.key_type,
            current.value_id,
            value,
            current.value_required and incoming.value_required,
        )
    if (current, incoming) in _PROMOTIONS:
        changes.append(f"widen {name} {current} -> {incoming}")
        return incoming
    if (incoming, current) in _PROMOTIONS:
        return current  # files with the narrower type read fine as the wider one
    if isinstance(current, DecimalType) and isinstance(incoming, DecimalType):
        if current.scale != incoming.scale:
            raise IncompatibleSchema(
                f"{name}: decimal scale cannot change ({current} -> {incoming})"
            )
        if incoming.precision > current.precision:
            changes.append(f"widen {name} {current} -> {incoming}")
            return incoming
        return current
    raise IncompatibleSchema(f"{name}: {current} cannot become {incoming}")

"""Decide how a table's schema must change before files of a newer schema can be committed.

Files carry Iceberg field ids assigned by their writer (see `common/schema.assign_ids`): names
the table had keep the table's ids, new names got ids after the table's highest. So the
bookkeeper evolves by id, adopting the writer's ids for new columns; that is what makes the
files' columns resolve correctly. Allowed changes: add columns (nested fields too), widen
int->long, float->double, decimal precision (never scale), required->optional, and drop a
column when configured. Anything else is an `IncompatibleSchema` with a reason; the moniker is
quarantined and other monikers and tables keep flowing.

pyiceberg's own `union_by_name` is not used: it assigns fresh ids (which would not match the
files) and accepts decimal scale changes.
"""

from __future__ import annotations

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


def plan_evolution(
    table_schema: Schema, file_schema: Schema, allow_drop: bool = False
) -> Evolution:
    """The schema the table needs to read files written with `file_schema`.

    Raises:
        IncompatibleSchema: a type that cannot be promoted, or field ids that disagree with names.
    """
    changes: list[str] = []
    fields = _merge_struct(
        table_schema.as_struct(),
        file_schema.as_struct(),
        table_schema.highest_field_id,
        "",
        changes,
        allow_drop,
    )
    if not changes:
        return Evolution(None)
    identifier_ids = list(table_schema.identifier_field_ids) or list(
        file_schema.identifier_field_ids
    )
    schema = Schema(
        *fields, schema_id=table_schema.schema_id + 1, identifier_field_ids=identifier_ids
    )
    return Evolution(schema, changes)


def _merge_struct(
    table: StructType,
    files: StructType,
    highest_id: int,
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
        merged.append(_merge_field(current, incoming, highest_id, name, changes, allow_drop))
    table_ids = {f.field_id for f in table.fields}
    for incoming in files.fields:
        if incoming.field_id in table_ids:
            continue
        name = f"{path}{incoming.name}"
        if incoming.field_id <= highest_id:
            raise IncompatibleSchema(
                f"{name}: new field with id {incoming.field_id}, not above the table's highest id "
                f"{highest_id} (written against a stale schema)"
            )
        changes.append(f"add {name} {incoming.field_type}")
        # A new column can hold nulls for all earlier rows, so it is added optional.
        merged.append(
            NestedField(
                incoming.field_id,
                incoming.name,
                incoming.field_type,
                required=False,
                doc=incoming.doc,
            )
        )
    return merged


def _merge_field(
    current: NestedField,
    incoming: NestedField,
    highest_id: int,
    name: str,
    changes: list[str],
    allow_drop: bool,
) -> NestedField:
    required = current.required
    if current.required and not incoming.required:
        changes.append(f"make {name} optional")
        required = False
    field_type = _merge_type(
        current.field_type, incoming.field_type, highest_id, name, changes, allow_drop
    )
    return NestedField(
        current.field_id, current.name, field_type, required=required, doc=current.doc
    )


def _merge_type(
    current: IcebergType,
    incoming: IcebergType,
    highest_id: int,
    name: str,
    changes: list[str],
    allow_drop: bool,
) -> IcebergType:
    if current == incoming:
        return current
    if isinstance(current, StructType) and isinstance(incoming, StructType):
        return StructType(
            *_merge_struct(current, incoming, highest_id, f"{name}.", changes, allow_drop)
        )
    if isinstance(current, ListType) and isinstance(incoming, ListType):
        element = _merge_type(
            current.element_type,
            incoming.element_type,
            highest_id,
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
            current.value_type, incoming.value_type, highest_id, f"{name}{{}}", changes, allow_drop
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

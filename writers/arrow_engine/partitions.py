"""A table's rows of one task split by Iceberg partition, with pyiceberg's own Arrow transforms.

The `spark-sql` engine computes partition values with Iceberg's Spark functions
(`common/parquet_files.py`); here each transform's `pyarrow_transform` (Iceberg's Rust code in
pyiceberg-core, the same murmur3 bucketing and the same date arithmetic) computes them over whole
columns, and the rows of each partition value go to files of their own. The values a file gets
are those `list_written_files` reads back from Spark's folders: ints, days since the epoch for
dates, booleans and strings, None for null. The folders are named as Spark names them
(`_ik_p0=3/`), so both engines' files look alike and either lister reads them.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.partitioning import PartitionSpec
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
from pyiceberg.types import IcebergType

from icekeeper.common.parquet_files import identity_kind, partition_column

"""Column types whose identity (and truncate) partitions writers take (`parquet_files`)."""
_TEMPORAL = (YearTransform, MonthTransform, DayTransform, HourTransform)
_NULL_FOLDER = "__HIVE_DEFAULT_PARTITION__"
_ESCAPED = set("\"#%'*/:=?\\\x7f{[]^}")
"""Characters Spark escapes in a partition folder's value (`ExternalCatalogUtils`)."""
_EPOCH = datetime.date(1970, 1, 1)


@dataclass(frozen=True)
class PartitionField:
    """One field of a table's partition spec, as a task computes it."""

    name: str
    """The partition field's name: the key of the value in the file's moniker entry."""
    source: str
    """The column the value is computed from."""
    transform: Transform
    source_type: IcebergType

    def values(self, rows: pa.Table) -> pa.Array:
        """The field's value of every row (dates as days since the epoch)."""
        column = rows.column(self.source)
        values = self.transform.pyarrow_transform(self.source_type)(column.combine_chunks())
        if pa.types.is_date32(values.type):
            return pc.cast(values, pa.int32())
        return values


def partition_fields(spec: PartitionSpec, schema: Schema) -> list[PartitionField]:
    """The spec's fields, refusing what `spark-sql` refuses (`parquet_files.partition_columns`)."""
    fields = []
    for field in spec.fields:
        source = schema.find_field(field.source_id)
        transform = field.transform
        type_name = str(source.field_type)
        if isinstance(transform, (IdentityTransform, TruncateTransform)):
            identity_kind(type_name)  # refuses what `spark-sql` refuses
        elif not isinstance(transform, (BucketTransform, *_TEMPORAL)):
            raise ValueError(f"partition transform {transform} is not supported by writers")
        fields.append(PartitionField(field.name, source.name, transform, source.field_type))
    return fields


@dataclass(frozen=True)
class PartitionRows:
    """The rows of one partition value, and where its files go under the batch folder."""

    values: dict[str, object]
    folder: str
    rows: pa.Table


def split_by_partition(rows: pa.Table, fields: list[PartitionField]) -> list[PartitionRows]:
    """`rows` split by partition value, in the order the values first occur; each part keeps
    the rows' order. Without fields, all rows in one part with no values."""
    if not fields:
        return [PartitionRows({}, "", rows)]
    names = [partition_column(index) for index in range(len(fields))]
    keys = pa.table(
        [field.values(rows) for field in fields] + [pa.array(range(rows.num_rows), pa.int64())],
        names=[*names, "_ik_row"],
    )
    groups = keys.group_by(names, use_threads=False).aggregate([("_ik_row", "list")])
    parts = []
    for group in groups.to_pylist():
        values = {field.name: group[name] for field, name in zip(fields, names, strict=True)}
        folder = "/".join(
            f"{name}={_folder_value(group[name], field)}"
            for field, name in zip(fields, names, strict=True)
        )
        parts.append(PartitionRows(values, folder, rows.take(group["_ik_row_list"])))
    return parts


def _folder_value(value: object, field: PartitionField) -> str:
    """The value as Spark writes it in a folder name (dates as ISO dates, booleans in lower
    case, special characters escaped as `%XX`)."""
    if value is None:
        return _NULL_FOLDER
    if isinstance(value, bool):
        return str(value).lower()
    identity_date = isinstance(field.transform, IdentityTransform) and (
        str(field.source_type) == "date"
    )
    if identity_date or isinstance(field.transform, DayTransform):
        return (_EPOCH + datetime.timedelta(days=int(value))).isoformat()  # type: ignore[arg-type]
    text = str(value)
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED or ord(c) < 0x20 else c for c in text)

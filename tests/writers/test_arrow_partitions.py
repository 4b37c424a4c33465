"""The arrow engine's partition values are Iceberg's (issue 15 item 5): each transform over an
Arrow column gives what pyiceberg's own transform gives value by value, the rows of a task split
into one part per value, and the folders read back as `spark-sql`'s files read back."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.partitioning import PartitionField as IcebergPartitionField
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
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
)

from icekeeper.common.arrow_parquet import write_files
from icekeeper.common.parquet_files import PartitionColumn, list_written_files
from icekeeper.writers.arrow_engine.partitions import (
    PartitionField,
    partition_fields,
    split_by_partition,
)

MICROS = [-1, 0, 1, 3_599_999_999, -86_400_000_001, 1_767_225_600_123_456, None]
DAYS = [-1, 0, 1, 59, -719_162, 2_932_896, None]
INTS = [0, 1, -1, 7, -7, 2**31 - 1, -(2**31), None]
LONGS = [0, -1, 2**40, -(2**63), 2**63 - 1, 34, None]
STRINGS = ["", "a", "iceberg", "üñï©ødé", "日本語テキスト", "a/b=c%d", None]


def _arrow(values: list, source_type: IcebergType) -> pa.Array:
    arrow_type = {
        "int": pa.int32(),
        "long": pa.int64(),
        "string": pa.string(),
        "date": pa.date32(),
        "timestamp": pa.timestamp("us"),
        "timestamptz": pa.timestamp("us", tz="UTC"),
        "boolean": pa.bool_(),
        "binary": pa.binary(),
    }.get(str(source_type))
    if isinstance(source_type, DecimalType):
        arrow_type = pa.decimal128(source_type.precision, source_type.scale)
    if arrow_type in (pa.date32(),):
        return pa.array(values, pa.int32()).cast(arrow_type)
    if pa.types.is_timestamp(arrow_type):
        return pa.array(values, pa.int64()).cast(arrow_type)
    return pa.array(values, arrow_type)


CASES: list[tuple[Transform, IcebergType, list]] = [
    (IdentityTransform(), IntegerType(), INTS),
    (IdentityTransform(), LongType(), LONGS),
    (IdentityTransform(), StringType(), STRINGS),
    (IdentityTransform(), DateType(), DAYS),
    (IdentityTransform(), BooleanType(), [True, False, None]),
    # The smallest int and long are left out: truncating them overflows, which Iceberg's Java
    # (and pyiceberg-core) wraps and pyiceberg's Python does not.
    (TruncateTransform(10), IntegerType(), INTS[:-2] + [None]),
    (TruncateTransform(3), LongType(), [v for v in LONGS if v != -(2**63)]),
    (TruncateTransform(3), StringType(), STRINGS),
    *[
        (BucketTransform(buckets), source_type, values)
        for buckets in (1, 4, 16, 1000)
        for source_type, values in (
            (IntegerType(), INTS),
            (LongType(), LONGS),
            (StringType(), STRINGS),
            (DateType(), DAYS),
            (TimestampType(), MICROS),
            (TimestamptzType(), MICROS),
            (BinaryType(), [b"", b"\x00\xff", "ü".encode(), None]),
            (
                DecimalType(18, 2),
                [
                    decimal.Decimal("0.00"),
                    decimal.Decimal("-12.34"),
                    decimal.Decimal("1000000000000000.00"),
                    None,
                ],
            ),
        )
    ],
    *[
        (transform, source_type, values)
        for transform in (YearTransform(), MonthTransform(), DayTransform(), HourTransform())
        for source_type, values in (
            (TimestampType(), MICROS),
            (TimestamptzType(), MICROS),
            (DateType(), DAYS),
        )
        if not (isinstance(transform, HourTransform) and isinstance(source_type, DateType))
    ],
]


@pytest.mark.parametrize(
    ("transform", "source_type", "values"), CASES, ids=[f"{t}-{s}" for t, s, _ in CASES]
)
def test_arrow_transforms_give_pyicebergs_values(
    transform: Transform, source_type: IcebergType, values: list
) -> None:
    field = PartitionField("p", "c", transform, source_type)
    column = _arrow(values, source_type)

    computed = field.values(pa.table({"c": column})).to_pylist()

    expected = [transform.transform(source_type)(value) for value in values]
    if isinstance(transform, IdentityTransform) and isinstance(source_type, DateType):
        expected = values  # identity dates are days since the epoch in a file's partition
    assert computed == expected


def _schema() -> Schema:
    return Schema(
        NestedField(1, "id", LongType()),
        NestedField(2, "name", StringType()),
        NestedField(3, "at", TimestamptzType()),
        NestedField(4, "on", DateType()),
        NestedField(5, "flag", BooleanType()),
        NestedField(6, "amount", DecimalType(10, 2)),
    )


def _spec(*fields: tuple[int, Transform, str]) -> PartitionSpec:
    return PartitionSpec(
        *[
            IcebergPartitionField(source, 1000 + index, transform, name)
            for index, (source, transform, name) in enumerate(fields)
        ]
    )


def test_rows_split_by_partition_value_and_read_back_as_spark_sqls_files(tmp_path: Path) -> None:
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    rows = pa.table(
        {
            "id": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
            "name": ["a/b", "a/b", "x=y%", None, "", "a/b"],
            "at": pa.array(
                [epoch, epoch, epoch - datetime.timedelta(microseconds=1), None, epoch, epoch],
                pa.timestamp("us", tz="UTC"),
            ),
            "on": pa.array([0, 0, -1, None, 0, 19_000], pa.int32()).cast(pa.date32()),
            "flag": [True, True, False, None, True, True],
        }
    )
    spec = _spec(
        (2, IdentityTransform(), "name"),
        (3, DayTransform(), "at_day"),
        (4, IdentityTransform(), "on"),
        (5, IdentityTransform(), "flag"),
        (1, BucketTransform(2), "id_bucket"),
    )
    fields = partition_fields(spec, _schema())

    parts = split_by_partition(rows, fields)

    bucket = BucketTransform(2).transform(LongType())
    expected: dict[tuple, list[int]] = {}
    for row_id, values in [
        (1, ("a/b", 0, 0, True, bucket(1))),
        (2, ("a/b", 0, 0, True, bucket(2))),
        (3, ("x=y%", -1, -1, False, bucket(3))),
        (4, (None, None, None, None, bucket(4))),
        (5, ("", 0, 0, True, bucket(5))),
        (6, ("a/b", 0, 19_000, True, bucket(6))),
    ]:
        expected.setdefault(values, []).append(row_id)
    assert {
        tuple(part.values.values()): part.rows.column("id").to_pylist() for part in parts
    } == expected
    written = [
        file
        for part in parts
        for file in write_files(part.rows, tmp_path.as_uri(), 0, 100, {}, part.folder, part.values)
    ]
    kinds = ["string", "date", "date", "bool", "int"]
    listed = list_written_files(
        tmp_path.as_uri(),
        [
            PartitionColumn(f"_ik_p{index}", field.name, None, kind)  # type: ignore[arg-type]
            for index, (field, kind) in enumerate(zip(fields, kinds, strict=True))
        ],
        0,
    )
    assert sorted((f.path, f.partition) for f in listed) == sorted(
        (f.path, f.partition) for f in written
    )
    assert any("_ik_p0=a%2Fb/" in f.path for f in written)


@pytest.mark.parametrize(
    ("transform", "source"),
    [(IdentityTransform(), 3), (TruncateTransform(4), 6)],
)
def test_partitions_spark_sql_refuses_are_refused_alike(transform: Transform, source: int) -> None:
    with pytest.raises(ValueError, match="not supported by writers"):
        partition_fields(_spec((source, transform, "p")), _schema())

"""Data files from footers: our fast statistics equal pyiceberg's, keyed by the file's field ids."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import compute_statistics_plan, data_file_statistics_from_parquet_metadata, parquet_path_to_id_mapping
from pyiceberg.schema import Schema
from pyiceberg.types import DecimalType, DoubleType, IntegerType, LongType, NestedField, StringType, TimestamptzType

from bookkeeper.datafiles import FooterReader, InvalidFile, describe_file, footer_statistics, validate
from common.moniker import FileEntry

SCHEMA = Schema(
    NestedField(3, "id", LongType(), required=True),
    NestedField(5, "name", StringType(), required=False),
    NestedField(7, "amount", IntegerType(), required=False),
    NestedField(8, "price", DecimalType(10, 2), required=False),
    NestedField(9, "ratio", DoubleType(), required=False),
    NestedField(11, "at", TimestamptzType(), required=False),
)


def write(path: Path, rows: int, row_group_size: int) -> Path:
    fields = [
        pa.field("id", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"3"}),
        pa.field("name", pa.string(), metadata={b"PARQUET:field_id": b"5"}),
        pa.field("amount", pa.int32(), metadata={b"PARQUET:field_id": b"7"}),
        pa.field("price", pa.decimal128(10, 2), metadata={b"PARQUET:field_id": b"8"}),
        pa.field("ratio", pa.float64(), metadata={b"PARQUET:field_id": b"9"}),
        pa.field("at", pa.timestamp("us", tz="UTC"), metadata={b"PARQUET:field_id": b"11"}),
    ]
    base = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
    data = [{"id": i, "name": None if i % 7 == 0 else f"customer name that is longer than sixteen {i:05d}", "amount": i * 3 if i % 5 else None,
             "price": decimal.Decimal(i) / 4, "ratio": i / 3, "at": base + datetime.timedelta(seconds=i)} for i in range(rows)]
    pq.write_table(pa.Table.from_pylist(data, schema=pa.schema(fields)), path, row_group_size=row_group_size, compression="zstd")
    return path


@pytest.mark.parametrize("row_group_size", [10_000, 97])
def test_statistics_equal_pyicebergs(tmp_path: Path, row_group_size: int) -> None:
    path = write(tmp_path / "f.parquet", 1000, row_group_size)
    metadata = pq.read_metadata(path)
    ours = footer_statistics(metadata, SCHEMA, {})
    theirs = data_file_statistics_from_parquet_metadata(metadata, compute_statistics_plan(SCHEMA, {}), parquet_path_to_id_mapping(SCHEMA)).to_serialized_dict()
    for key in ("record_count", "column_sizes", "value_counts", "null_value_counts", "lower_bounds", "upper_bounds", "split_offsets"):
        assert ours[key] == theirs[key], key
    assert set(ours["lower_bounds"]) == {3, 5, 7, 8, 9, 11} and ours["null_value_counts"][5] == 143


def test_validation_names_what_does_not_match(tmp_path: Path) -> None:
    (tmp_path / "table" / "data").mkdir(parents=True)
    path = write(tmp_path / "table" / "data" / "f.parquet", 10, 100)
    facts = describe_file(str(path), SCHEMA, {})
    entry = FileEntry(path=f"file://{path}", size_bytes=facts.size_bytes, record_count=10)
    validate(entry, facts, f"file://{tmp_path}/table", SCHEMA)
    with pytest.raises(InvalidFile, match="size"):
        validate(entry.model_copy(update={"size_bytes": 1}), facts, f"file://{tmp_path}/table", SCHEMA)
    with pytest.raises(InvalidFile, match="rows"):
        validate(entry.model_copy(update={"record_count": 11}), facts, f"file://{tmp_path}/table", SCHEMA)
    with pytest.raises(InvalidFile, match="not under the table location"):
        validate(entry, facts, f"file://{tmp_path}/elsewhere", SCHEMA)
    with pytest.raises(InvalidFile, match="not in the moniker's schema"):
        validate(entry, facts, f"file://{tmp_path}/table", Schema(*SCHEMA.fields[:3]))
    with pytest.raises(InvalidFile, match="does not exist"):
        describe_file(f"file://{tmp_path}/missing.parquet", SCHEMA, {})


def test_worker_processes_describe_files_like_the_main_process(tmp_path: Path) -> None:
    paths = [str(write(tmp_path / f"f{i}.parquet", 50 + i, 1000)) for i in range(FooterReader.PROCESS_THRESHOLD + 6)]
    paths.append(str(tmp_path / "missing.parquet"))
    reader = FooterReader(workers=2)
    try:
        described = reader.describe([(path, SCHEMA, SCHEMA.model_dump_json()) for path in paths], {})
    finally:
        reader.close()
    assert isinstance(described[paths[-1]], InvalidFile)
    for path in paths[:3]:
        assert described[path] == describe_file(path, SCHEMA, {})

"""The arrow engine's files follow the table's Bloom filter properties as `spark-sql`'s do
(issue 15 item 5): a filter on each column the table asks for, none on the others, so readers
skip files by it; no batch of such a table falls back to `spark-sql` any more."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from icekeeper.common.arrow_parquet import untaken_properties, write_files, writer_options

PROPERTIES = {
    "write.parquet.bloom-filter-enabled.column.id": "true",
    "write.parquet.bloom-filter-fpp.column.id": "0.001",
    "write.parquet.bloom-filter-enabled.column.name": "false",
    "write.parquet.bloom-filter-enabled.column.absent": "true",
}


def _excluded(path: str, column: str, value: object) -> bool:
    """Whether the file's Bloom filter says `value` is not in `column` (DuckDB reads it)."""
    [(_, _, excluded)] = duckdb.sql(
        "SELECT * FROM parquet_bloom_probe($path, $column, $value)",
        params={"path": path, "column": column, "value": value},
    ).fetchall()
    return excluded


def _filter_bytes(path: str) -> int:
    return pq.ParquetFile(path).metadata.row_group(0).column(0).bloom_filter_length


def test_bloom_filter_properties_give_filters_on_the_columns_they_name(tmp_path: Path) -> None:
    rows = pa.table(
        {
            "id": pa.array(range(0, 20_000, 2), pa.int64()),
            "name": [f"n{i}" for i in range(10_000)],
        }
    )
    assert untaken_properties(PROPERTIES) == []

    [written] = write_files(rows, tmp_path.as_uri(), 0, 100_000, writer_options(PROPERTIES))

    path = written.path.removeprefix("file://")
    assert not _excluded(path, "id", 4)
    absent = [_excluded(path, "id", odd) for odd in range(1, 2_001, 2)]
    assert sum(absent) >= 995  # fpp 0.001
    assert not _excluded(path, "name", "nothing such")  # no filter: nothing is excluded
    assert _filter_bytes(path) > 4096
    capped = {**PROPERTIES, "write.parquet.bloom-filter-max-bytes": "4096"}
    [small] = write_files(rows, (tmp_path / "small").as_uri(), 0, 100_000, writer_options(capped))
    assert _filter_bytes(small.path.removeprefix("file://")) <= 4096 + 64  # and its header
    plain_path = tmp_path / "plain"
    [plain] = write_files(rows, plain_path.as_uri(), 0, 100_000, writer_options({}))
    assert not _excluded(plain.path.removeprefix("file://"), "id", 1)
    assert untaken_properties({"write.parquet.page-version": "v2"}) == [
        "write.parquet.page-version"
    ]

"""Write Parquet files with pyarrow as a table's `write.parquet.*` properties ask; describe them.

Every role that writes a table's data files with pyarrow writes them here: the arrow engine's tasks
(`writers/arrow_engine/task.py`) and the bookkeeper's purge of mostly-deleted files
(`bookkeeper/purges.py`). The files get what the table's properties ask (codec, level, dictionary
page size, page size, Bloom filters), as the `spark-sql` engine's files do (`writers/files.py`);
decimals are stored as integers where they fit, as Spark stores them; Iceberg field ids come with
the Arrow schema.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from icekeeper.common.moniker import FileEntry
from icekeeper.common.storage import make_folder, open_filesystem

_TAKEN = {
    "write.parquet.compression-codec",
    "write.parquet.compression-level",
    "write.parquet.dict-size-bytes",
    "write.parquet.page-size-bytes",
    "write.parquet.page-row-limit",
    "write.parquet.row-group-size-bytes",
    "write.parquet.bloom-filter-max-bytes",
}
"""The Parquet table properties the arrow engine honours, with the column ones below; any other
`write.parquet.*` sends the batch to `spark-sql` (`untaken_properties`)."""
_BLOOM_ENABLED = "write.parquet.bloom-filter-enabled.column."
_BLOOM_FPP = "write.parquet.bloom-filter-fpp.column."
_BLOOM_DEFAULTS = {"fpp": 0.01, "max_bytes": 1_048_576}
"""Iceberg's defaults (`TableProperties`): false-positive probability and largest filter."""


def untaken_properties(table_properties: Mapping[str, str]) -> list[str]:
    """`write.parquet.*` properties pyarrow's writer is not given here."""
    return sorted(
        key
        for key in table_properties
        if key.startswith("write.parquet.")
        and key not in _TAKEN
        and not key.startswith((_BLOOM_ENABLED, _BLOOM_FPP))
    )


def bloom_filters(table_properties: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """Column -> its Bloom filter's `fpp` and `max_bytes`, for the columns the table's
    `write.parquet.bloom-filter-enabled.column.*` properties turn on."""
    max_bytes = int(
        table_properties.get("write.parquet.bloom-filter-max-bytes", _BLOOM_DEFAULTS["max_bytes"])
    )
    return {
        key.removeprefix(_BLOOM_ENABLED): {
            "fpp": float(
                table_properties.get(
                    _BLOOM_FPP + key.removeprefix(_BLOOM_ENABLED), _BLOOM_DEFAULTS["fpp"]
                )
            ),
            "max_bytes": max_bytes,
        }
        for key, value in table_properties.items()
        if key.startswith(_BLOOM_ENABLED) and value.strip().lower() == "true"
    }


def _bloom_filter_options(
    filters: Mapping[str, Mapping[str, float]], rows: int
) -> dict[str, dict[str, float]]:
    """pyarrow's `bloom_filter_options` for a file of `rows` rows: each filter sized for as many
    distinct values as rows (pyarrow sizes by distinct values, Iceberg caps by bytes), at most
    as many as fit `max_bytes` (pyarrow rounds a filter's size up to a power of two)."""
    options = {}
    for column, bloom in filters.items():
        fpp = bloom["fpp"]
        largest = 2 ** int(math.log2(bloom["max_bytes"]))
        # A split-block filter takes -8 * ndv / ln(1 - fpp ** (1 / 8)) bits.
        fitting = int(largest * -math.log(1 - fpp ** (1 / 8)))
        options[column] = {"ndv": max(1, min(rows, fitting)), "fpp": fpp}
    return options


def writer_options(table_properties: Mapping[str, str]) -> dict[str, object]:
    """pyarrow `ParquetWriter` options for a table's properties (Iceberg's defaults otherwise)."""
    codec = table_properties.get("write.parquet.compression-codec", "zstd").lower()
    options: dict[str, object] = {
        "compression": "none" if codec == "uncompressed" else codec,
        "store_decimal_as_integer": True,
        "write_statistics": True,
    }
    if "write.parquet.compression-level" in table_properties:
        options["compression_level"] = int(table_properties["write.parquet.compression-level"])
    if "write.parquet.dict-size-bytes" in table_properties:
        options["dictionary_pagesize_limit"] = int(
            table_properties["write.parquet.dict-size-bytes"]
        )
    if "write.parquet.page-size-bytes" in table_properties:
        options["data_page_size"] = int(table_properties["write.parquet.page-size-bytes"])
    if "write.parquet.page-row-limit" in table_properties:
        options["data_page_row_count_limit"] = int(table_properties["write.parquet.page-row-limit"])
    if filters := bloom_filters(table_properties):
        options["bloom_filter_options"] = filters  # sized per file by `write_files`
    return options


@dataclass(frozen=True)
class WrittenFile:
    """What a task tells the driver of one file."""

    path: str
    size_bytes: int
    record_count: int
    partition: dict[str, object] = field(default_factory=dict)

    def entry(self, spec_id: int) -> FileEntry:
        return FileEntry(
            path=self.path,
            size_bytes=self.size_bytes,
            record_count=self.record_count,
            partition=self.partition,
            spec_id=spec_id,
        )


def write_files(
    rows: pa.Table,
    output_uri: str,
    task_index: int,
    max_records_per_file: int,
    options: Mapping[str, object],
    folder: str = "",
    partition: Mapping[str, object] | None = None,
) -> list[WrittenFile]:
    """`rows` as files of at most `max_records_per_file` rows under `output_uri` (in `folder`
    below it: a partition's), each with the `partition` values of its rows."""
    if rows.num_rows == 0:
        return []
    filesystem, root = open_filesystem(output_uri)
    base_uri = output_uri.rstrip("/")
    if folder:
        # A folder's `%XX` escapes are part of its name (the door decodes no URI).
        root = f"{root.rstrip('/')}/{folder}"
        base_uri = f"{base_uri}/{folder}"
    make_folder(filesystem, root)
    written = []
    for number, start in enumerate(range(0, rows.num_rows, max_records_per_file)):
        piece = rows.slice(start, max_records_per_file)
        name = f"part-{task_index:05d}-{number:03d}-{uuid.uuid4().hex}.parquet"
        path = f"{root.rstrip('/')}/{name}"
        file_options = dict(options)
        if "bloom_filter_options" in options:
            file_options["bloom_filter_options"] = _bloom_filter_options(
                options["bloom_filter_options"],  # type: ignore[arg-type]
                piece.num_rows,
            )
        with pq.ParquetWriter(path, rows.schema, filesystem=filesystem, **file_options) as writer:
            writer.write_table(piece, row_group_size=piece.num_rows)
        size = filesystem.get_file_info(path).size
        # Named as the output URI names its folder: the store's one URI form, as configured.
        uri = f"{base_uri}/{name}"
        written.append(WrittenFile(uri, int(size), piece.num_rows, dict(partition or {})))
    return written

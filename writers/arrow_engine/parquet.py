"""Write a table's rows of one task as Parquet files with pyarrow, and describe them.

The files get what the table's `write.parquet.*` properties ask (codec, level, dictionary page
size, page size), as the `spark-sql` engine's files do (`writers/files.py`); decimals are stored
as integers where they fit, as Spark stores them; Iceberg field ids come with the Arrow schema.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from common.moniker import FileEntry

_TAKEN = {
    "write.parquet.compression-codec",
    "write.parquet.compression-level",
    "write.parquet.dict-size-bytes",
    "write.parquet.page-size-bytes",
    "write.parquet.page-row-limit",
    "write.parquet.row-group-size-bytes",
}
"""The Parquet table properties the arrow engine honours; any other `write.parquet.*` (bloom
filters) sends the batch to `spark-sql` (`untaken_properties`)."""


def untaken_properties(table_properties: Mapping[str, str]) -> list[str]:
    """`write.parquet.*` properties pyarrow's writer is not given here."""
    return sorted(
        key for key in table_properties if key.startswith("write.parquet.") and key not in _TAKEN
    )


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
    filesystem, root = pafs.FileSystem.from_uri(output_uri)
    if folder:
        # Joined after parsing the URI: a folder's `%XX` escapes are part of its name.
        root = f"{root.rstrip('/')}/{folder}"
    filesystem.create_dir(root, recursive=True)
    scheme = output_uri.split("://", 1)[0] + "://" if "://" in output_uri else ""
    written = []
    for number, start in enumerate(range(0, rows.num_rows, max_records_per_file)):
        piece = rows.slice(start, max_records_per_file)
        name = f"part-{task_index:05d}-{number:03d}-{uuid.uuid4().hex}.parquet"
        path = f"{root.rstrip('/')}/{name}"
        with pq.ParquetWriter(path, rows.schema, filesystem=filesystem, **options) as writer:
            writer.write_table(piece, row_group_size=piece.num_rows)
        size = filesystem.get_file_info(path).size
        uri = ("file://" + path) if scheme == "file://" else (scheme + path if scheme else path)
        written.append(WrittenFile(uri, int(size), piece.num_rows, dict(partition or {})))
    return written

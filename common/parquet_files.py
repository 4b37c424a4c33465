"""Spark writes of Parquet files laid out by a table's Iceberg partitions, and listing them back.

Both roles that add data files write them this way: writers (a batch's rows) and the reaper (an
upsert table's compaction, which the bookkeeper then commits). Spark's own Parquet writer does the
work (zstd, microsecond timestamps, Iceberg field ids from column metadata). Partition values are
computed with Iceberg's own transform functions (`system.days`, `system.bucket`, ...), so a file's
partition is exactly what Iceberg would compute, and Spark lays files out by them; listing the
files back reads each one's partition from its folder names.

Spark writes an empty string partition value to the same folder as a null
(`__HIVE_DEFAULT_PARTITION__`), where Iceberg keeps them apart: string values are written with a
one-character prefix (`_ik_p0=sred/`, `_ik_p0=s/` for ''), which listing removes, so '' keeps a
folder of its own and a file's partition is Iceberg's value.
"""

from __future__ import annotations

import datetime
import posixpath
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow.parquet as pq
from pyarrow import fs as pafs
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    TruncateTransform,
    YearTransform,
)
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from icekeeper.common.moniker import FileEntry
from icekeeper.common.spark import FUNCTIONS_CATALOG
from icekeeper.common.storage import open_filesystem
from icekeeper.common.stores.azure import HADOOP_AZURE

_NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_STRING_PREFIX = "s"
"""Starts every non-null string partition value Spark writes in a folder name: with it an empty
string is `s`, which Spark does not turn into a null (it does so with '' itself)."""
_PARQUET_OPTIONS = {
    "write.parquet.row-group-size-bytes": "parquet.block.size",
    "write.parquet.page-size-bytes": "parquet.page.size",
    "write.parquet.page-row-limit": "parquet.page.row.count.limit",
    "write.parquet.dict-size-bytes": "parquet.dictionary.page.size",
    "write.parquet.compression-codec": "compression",
    "write.parquet.bloom-filter-max-bytes": "parquet.bloom.filter.max.bytes",
}
"""Iceberg's Parquet table properties and the Spark/parquet-mr write options that do the same."""
_BLOOM_COLUMN = "write.parquet.bloom-filter-enabled.column."
_EPOCH = datetime.date(1970, 1, 1)


def partition_column(index: int) -> str:
    """The derived column Spark partitions files by for the spec's partition field `index`.

    Spark names the folders after it (`_ik_p0=3/`), so it is part of the files' paths.
    """
    return f"_ik_p{index}"


@dataclass(frozen=True)
class PartitionColumn:
    """A derived column Spark partitions the output by, for one Iceberg partition field."""

    name: str
    field_name: str
    expression: SparkColumn
    kind: str  # "int", "date", "string", "long", "bool"
    folder_prefix: str = ""
    """What the folder's value starts with before the value itself (`_STRING_PREFIX` for the
    string values Spark writes; none in the arrow engine's folders, which keep '' as `_ik_p0=`)."""


def partition_columns(spec: PartitionSpec, schema: Schema) -> list[PartitionColumn]:
    """Spark expressions computing each partition field's value, with Iceberg's transforms."""
    columns = []
    for index, field in enumerate(spec.fields):
        source = schema.find_field(field.source_id)
        column = F.col(f"`{source.name}`")
        transform = field.transform
        if isinstance(transform, IdentityTransform):
            expression, kind = column, identity_kind(str(source.field_type))
        elif isinstance(transform, BucketTransform):
            expression, kind = (
                F.expr(
                    f"{FUNCTIONS_CATALOG}.system.bucket({transform.num_buckets}, `{source.name}`)"
                ),
                "int",
            )
        elif isinstance(transform, TruncateTransform):
            expression, kind = (
                F.expr(f"{FUNCTIONS_CATALOG}.system.truncate({transform.width}, `{source.name}`)"),
                identity_kind(str(source.field_type)),
            )
        elif isinstance(transform, DayTransform):
            expression, kind = F.expr(f"{FUNCTIONS_CATALOG}.system.days(`{source.name}`)"), "date"
        elif isinstance(transform, HourTransform):
            expression, kind = F.expr(f"{FUNCTIONS_CATALOG}.system.hours(`{source.name}`)"), "int"
        elif isinstance(transform, MonthTransform):
            expression, kind = F.expr(f"{FUNCTIONS_CATALOG}.system.months(`{source.name}`)"), "int"
        elif isinstance(transform, YearTransform):
            expression, kind = F.expr(f"{FUNCTIONS_CATALOG}.system.years(`{source.name}`)"), "int"
        else:
            raise ValueError(f"partition transform {transform} is not supported by writers")
        prefix = _STRING_PREFIX if kind == "string" else ""
        if prefix:  # concat keeps a null null, and makes '' a value Spark does not null
            expression = F.concat(F.lit(prefix), expression)
        columns.append(
            PartitionColumn(partition_column(index), field.name, expression, kind, prefix)
        )
    return columns


def identity_kind(type_name: str) -> str:
    """The kind of partition value an identity or truncate field of this source type has; a
    ValueError for types the writers do not partition by (both engines ask here)."""
    if type_name in ("int",):
        return "int"
    if type_name in ("long",):
        return "long"
    if type_name == "date":
        return "date"
    if type_name == "boolean":
        return "bool"
    if type_name == "string":
        return "string"
    raise ValueError(f"identity partitions on {type_name} columns are not supported by writers")


def parquet_write_options(table_properties: Mapping[str, str]) -> dict[str, str]:
    """Spark write options that give our files what the table's `write.parquet.*` properties ask.

    Iceberg's own writers read these properties; Spark's Parquet writer, which writes our files,
    takes parquet-mr settings instead, so users tune one set of properties for both.
    """
    options: dict[str, str] = {}
    for key, value in table_properties.items():
        if key in _PARQUET_OPTIONS:
            options[_PARQUET_OPTIONS[key]] = (
                value.lower() if key == "write.parquet.compression-codec" else value
            )
        elif key.startswith(_BLOOM_COLUMN):
            options[f"parquet.bloom.filter.enabled#{key.removeprefix(_BLOOM_COLUMN)}"] = value
    level = table_properties.get("write.parquet.compression-level")
    if level is not None and options.get("compression", "zstd") == "zstd":
        options["parquet.compression.codec.zstd.level"] = level
    return options


def write_parquet(
    rows: DataFrame,
    output_uri: str,
    partitions: list[PartitionColumn],
    max_records_per_file: int,
    rebalance: bool = False,
    options: Mapping[str, str] | None = None,
) -> None:
    """Write `rows` (row columns only) under `output_uri`, laid out by `partitions`.

    Without `rebalance`, every Kafka task writes its own files: no shuffle, and a skewed
    partition value is spread over all tasks instead of piling onto one (seed 004). With it,
    rows are shuffled by partition and Spark's adaptive rebalancing splits skewed partitions,
    giving fewer, larger files.
    """
    staged = (
        rows.select("*", *[p.expression.alias(p.name) for p in partitions]) if partitions else rows
    )
    if rebalance and partitions:
        staged = staged.hint("rebalance", *[p.name for p in partitions])
    writer = (
        staged.write.mode("errorifexists")
        .option("maxRecordsPerFile", max_records_per_file)
        .options(**(options or {}))
    )
    if partitions:
        writer = writer.partitionBy(*[p.name for p in partitions])
    require_hadoop_filesystem(rows.sparkSession, output_uri)
    writer.parquet(output_uri)


class NoHadoopFileSystem(RuntimeError):
    """Spark has no Hadoop filesystem for a URI it is to write: a deployment's classpath, not
    the data, is at fault."""


def require_hadoop_filesystem(spark: SparkSession, uri: str) -> None:
    """Raise `NoHadoopFileSystem`, naming what to add, when Spark cannot write `uri` itself.

    Spark's Parquet writer goes through Hadoop's FileSystem, and PySpark ships no driver for
    Azure's `abfss://` (icekeeper's own files there go through the storage door instead); the
    error would otherwise be a `ClassNotFoundException` from the first task."""
    scheme = uri.partition("://")[0].lower() if "://" in uri else "file"
    if scheme not in ("abfs", "abfss"):
        return
    # Imported here: `internals` brings pyiceberg's catalog and tables (~140 modules), which the
    # arrow engine's executor tasks, importing this module for its partition columns, never use.
    from icekeeper.common.internals import hadoop_configuration, spark_jvm

    jvm = spark_jvm(spark)
    try:
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, hadoop_configuration(spark))
    except Exception as error:  # noqa: BLE001 - py4j's error: the class is not there
        raise NoHadoopFileSystem(
            f"{uri}: Spark writes these files itself, through Hadoop's abfs driver, which is not "
            f"on its classpath: add {HADOOP_AZURE} to spark-submit's --packages (or "
            "`spark.jars.packages`), or use `writer.engine: arrow` (docs/operations.md, "
            f'"Azure Blob, Event Grid and the storage queue"). ({str(error).splitlines()[0]})'
        ) from None


def list_written_files(
    output_uri: str, partitions: list[PartitionColumn], spec_id: int
) -> list[FileEntry]:
    """Every Parquet file under `output_uri` that holds records, with size, record count (from its
    footer) and partition.

    A file of no records is deleted instead: Spark's first write task opens a file even when none
    of the rows are its own (so that an empty write leaves a schema behind), e.g. a table whose
    rows the batch's other tables surround. Nothing may refer to it, and `output_uri` is the
    caller's own new folder.
    """
    filesystem, root = open_filesystem(output_uri)
    selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    entries = []
    for info in filesystem.get_file_info(selector):
        name = posixpath.basename(info.path)
        if (
            info.type != pafs.FileType.File
            or not name.endswith(".parquet")
            or name.startswith((".", "_"))
        ):
            continue
        with filesystem.open_input_file(info.path) as handle:
            record_count = pq.ParquetFile(handle).metadata.num_rows
        if record_count == 0:
            filesystem.delete_file(info.path)
            continue
        relative = posixpath.relpath(posixpath.dirname(info.path), root)
        entries.append(
            FileEntry(
                # Named as the output URI names its folder: the store's one URI form.
                path=f"{output_uri.rstrip('/')}/{posixpath.relpath(info.path, root)}",
                size_bytes=info.size,
                record_count=record_count,
                partition=_partition_values(relative, partitions),
                spec_id=spec_id,
            )
        )
    return sorted(entries, key=lambda entry: entry.path)


def _partition_values(relative_dir: str, partitions: list[PartitionColumn]) -> dict[str, object]:
    found = {}
    for segment in relative_dir.split("/"):
        if "=" in segment:
            name, _, raw = segment.partition("=")
            found[name] = urllib.parse.unquote(raw)
    values: dict[str, object] = {}
    for partition in partitions:
        raw = found.get(partition.name)
        if raw is None or raw == _NULL_PARTITION:
            values[partition.field_name] = None
        elif partition.kind in ("int", "long"):
            values[partition.field_name] = int(raw)
        elif partition.kind == "date":
            values[partition.field_name] = (datetime.date.fromisoformat(raw) - _EPOCH).days
        elif partition.kind == "bool":
            values[partition.field_name] = raw == "true"
        else:
            values[partition.field_name] = raw.removeprefix(partition.folder_prefix)
    return values

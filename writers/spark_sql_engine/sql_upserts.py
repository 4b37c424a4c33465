"""Upsert tables on `spark-sql`: per batch, the last change of each key, and which keys it deletes.

Within a batch, a key's changes are ordered as Kafka orders them: by offset within the key's
partition (Debezium keys records by primary key, so one key's changes share a partition; a key
found in two partitions, after a repartitioning say, is ordered by offset alone). Only the last
change of each key survives. Its row goes to the table's data files, unless the change is a delete
(Debezium's op `d`) in `delete_mode: hard`: then the row (the `before` image, at least its key
columns) goes to a deleted-keys file, which the bookkeeper turns into position deletes of the
key's earlier row. A change of primary key arrives from Debezium as a delete of the old key and
a create of the new one, two keys, each handled on its own.

Both kinds of file come out of one Spark write: the deleted flag is the first partition column,
so the files land in `_ik_deleted=false/` and `_ik_deleted=true/` folders of the batch, and no
row crosses the JVM or is computed twice.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from icekeeper.common.moniker import FileEntry
from icekeeper.common.parquet_files import PartitionColumn
from icekeeper.writers.files import DELETED
from icekeeper.writers.spark_sql_engine import sql
from icekeeper.writers.spark_sql_engine.columns import KAFKA_OFFSET, KAFKA_PARTITION

_LATEST = "_ik_latest"


def last_change_per_key(rows: DataFrame, key_columns: list[str]) -> DataFrame:
    """One row per key of `rows` (which carry the Kafka position helpers): its last change."""
    latest = Window.partitionBy(*[F.col(sql.ident(key)) for key in key_columns]).orderBy(
        F.col(KAFKA_OFFSET).desc(), F.col(KAFKA_PARTITION).desc()
    )
    return (
        rows.withColumn(_LATEST, F.row_number().over(latest))
        .where(F.col(_LATEST) == 1)
        .drop(_LATEST)
    )


def deleted_partition(op_column: str | None) -> PartitionColumn:
    """Lays a batch's files out by whether their rows' last change deletes the key (Debezium's op
    `d` in `op_column`; None: deletes keep their row, `UpsertRule.op_column`); see the module
    docstring."""
    deleted = (
        F.coalesce(F.col(sql.ident(op_column)) == F.lit("d"), F.lit(False))
        if op_column
        else F.lit(False)
    )
    return PartitionColumn(DELETED, DELETED, deleted, "bool")


def split_deleted(files: list[FileEntry]) -> tuple[list[FileEntry], list[FileEntry]]:
    """(data files, deleted-keys files) of a write laid out by `DELETED_PARTITION` first."""
    data, deleted = [], []
    for entry in files:
        partition = {name: value for name, value in entry.partition.items() if name != DELETED}
        if entry.partition.get(DELETED):
            deleted.append(
                entry.model_copy(update={"partition": partition, "content": "deleted-keys"})
            )
        else:
            data.append(entry.model_copy(update={"partition": partition}))
    return data, deleted

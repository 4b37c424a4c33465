"""The change stream of `icekeeper bench upsert`: inserts, updates and deletes of a bounded key set.

A plan fixes every change with a seeded generator: its operation (about 70% updates, 10% deletes,
20% inserts), its key, and the sequence numbers its `before` and `after` images come from. Every
column of a row image is a function of those numbers (`row_image`), so the Debezium envelopes
are built from the plan in Spark's JVM (producing a million records from Python would take
minutes) and the final state a correct mirror must hold is built from the same plan with the same
function, without keeping a copy of what was produced.

Keys start absent: inserts take a free key, updates and deletes an existing one, and a deleted key
can be inserted again. With 20% inserts and 10% deletes, `changes` changes over `keys` keys end
with about `changes / 10` live keys (the key set fills up by the end at the default 1M over 100k).
A key always goes to the same Kafka partition, in the plan's order, as Debezium keys its records.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.samples.debezium import DEBEZIUM_VERSION, TableShape
from icekeeper.samples.produce import ConfluentAvroFramer, ensure_topic
from icekeeper.samples.synthetic import ORDER_COLUMNS

SHAPE = TableShape("bench", "upsert", "rows", ORDER_COLUMNS, key=("id",))
ROW_COLUMNS = [column.name for column in SHAPE.columns]
"""The source table's columns: what a mirror's rows must equal (metadata columns aside)."""
OPS = np.array(["c", "u", "d"])
_INSERT, _UPDATE, _DELETE = 0, 1, 2
_BASE_TS_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: the content does not depend on when it runs
_STATUSES = ["new", "paid", "shipped", "returned"]


@dataclass(frozen=True)
class ChangePlan:
    """Change i: `OPS[op[i]]` of `key[i]`; its `before` image is row `prev_seq[i]` (-1: none),
    its `after` image row i; the key's current life began with insert `born_seq[i]`."""

    op: np.ndarray
    key: np.ndarray
    prev_seq: np.ndarray
    born_seq: np.ndarray
    keys: int

    @property
    def changes(self) -> int:
        return len(self.op)

    def op_counts(self) -> dict[str, int]:
        counts = np.bincount(self.op, minlength=3)
        return {
            "inserts": int(counts[_INSERT]),
            "updates": int(counts[_UPDATE]),
            "deletes": int(counts[_DELETE]),
        }

    def final_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(key, seq, born_seq) of every live key's last row: the state a mirror ends with."""
        touched, first_from_end = np.unique(self.key[::-1], return_index=True)
        last = self.changes - 1 - first_from_end
        live = self.op[last] != _DELETE
        return touched[live], last[live], self.born_seq[last[live]]


def plan_changes(
    changes: int, keys: int, update_ratio: float = 0.7, delete_ratio: float = 0.1, seed: int = 13
) -> ChangePlan:
    """The plan of `changes` changes over `keys` keys (see the module docstring)."""
    rng = np.random.default_rng(seed)
    draws = rng.random(changes).tolist()
    picks = rng.random(changes).tolist()
    op = np.empty(changes, dtype=np.int8)
    key = np.empty(changes, dtype=np.int64)
    prev_seq = np.empty(changes, dtype=np.int64)
    born_seq = np.empty(changes, dtype=np.int64)
    free = rng.permutation(keys).tolist()
    alive: list[int] = []
    position = [0] * keys
    last_seq = [-1] * keys
    born = [-1] * keys
    for seq in range(changes):
        draw = draws[seq]
        kind = (
            _DELETE
            if draw < delete_ratio
            else _UPDATE
            if draw < delete_ratio + update_ratio
            else _INSERT
        )
        if kind == _INSERT and not free:
            kind = _UPDATE
        if kind != _INSERT and not alive:
            kind = _INSERT
        if kind == _INSERT:
            slot = int(picks[seq] * len(free))
            chosen = free[slot]
            free[slot] = free[-1]
            free.pop()
            position[chosen] = len(alive)
            alive.append(chosen)
            born[chosen] = seq
            prev_seq[seq] = -1
        else:
            slot = int(picks[seq] * len(alive))
            chosen = alive[slot]
            prev_seq[seq] = last_seq[chosen]
            if kind == _DELETE:
                moved = alive.pop()
                if moved != chosen:
                    alive[slot] = moved
                    position[moved] = slot
                free.append(chosen)
        op[seq], key[seq], born_seq[seq] = kind, chosen, born[chosen]
        last_seq[chosen] = seq
    return ChangePlan(op=op, key=key, prev_seq=prev_seq, born_seq=born_seq, keys=keys)


def row_image(seq: SparkColumn, born_seq: SparkColumn, key: SparkColumn) -> SparkColumn:
    """The source row written by change `seq` of `key` (whose life began at `born_seq`)."""
    return F.struct(
        key.cast("int").alias("id"),
        F.concat(
            F.lit("customer-"), F.lpad((born_seq * 7919 % 100_000).cast("string"), 5, "0")
        ).alias("customer"),
        (F.lit(1) + seq * 7919 % 10_000).cast("int").alias("amount"),
        (F.lit(1.0) + (seq * 104_729 % 49_900) / F.lit(100.0)).cast("double").alias("price"),
        F.element_at(
            F.array(*[F.lit(status) for status in _STATUSES]),
            (seq % len(_STATUSES) + 1).cast("int"),
        ).alias("status"),
        (F.lit(_BASE_TS_MS) + born_seq * 10).cast("long").alias("created_at"),
        (F.lit(_BASE_TS_MS) + seq * 10).cast("long").alias("updated_at"),
    )


def plan_frame(spark: SparkSession, plan: ChangePlan, partitions: int, folder: Path) -> DataFrame:
    """The plan as a Spark frame (seq, op, key, prev_seq,
    born_seq, partition), through a Parquet file."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "plan.parquet"
    pq.write_table(
        pa.table(
            {
                "seq": np.arange(plan.changes, dtype=np.int64),
                "op": OPS[plan.op],
                "key": plan.key,
                "prev_seq": plan.prev_seq,
                "born_seq": plan.born_seq,
                "partition": (plan.key % partitions).astype(np.int32),
            }
        ),
        path,
    )
    return spark.read.parquet(str(path))


def final_state_frame(
    spark: SparkSession, plan: ChangePlan, folder: Path, table_rows: int = 0
) -> DataFrame:
    """The rows (`ROW_COLUMNS`) a mirror of the source table holds after the whole plan, and the
    `table_rows` rows the tables started with (`upsert_table_rows.py`: key `keys + i` holds row
    image `changes + i`); Debezium's `Timestamp` columns (epoch milliseconds) as timestamps, as a
    table holds them."""
    keys, seqs, borns = plan.final_rows()
    extra = np.arange(table_rows, dtype=np.int64)
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table(
            {
                "key": np.concatenate([keys, extra + plan.keys]),
                "seq": np.concatenate([seqs, extra + plan.changes]),
                "born_seq": np.concatenate([borns, extra + plan.changes]),
            }
        ),
        folder / "final-rows.parquet",
    )
    frame = spark.read.parquet(str(folder / "final-rows.parquet"))
    rows = frame.select(
        row_image(F.col("seq"), F.col("born_seq"), F.col("key")).alias("row")
    ).select("row.*")
    timestamps = [
        column.name
        for column in SHAPE.columns
        if column.connect_name == "io.debezium.time.Timestamp"
    ]
    return rows.withColumns({name: F.timestamp_millis(F.col(name)) for name in timestamps})


def envelope_frame(plan_rows: DataFrame) -> DataFrame:
    """Debezium MySQL envelopes (`key`, `value` structs, `partition`) of the plan's changes, in plan
    order within each Kafka partition; op `r` is a snapshot read (no `before`)."""
    seq, op, key = F.col("seq"), F.col("op"), F.col("key")
    gtid = F.concat(F.lit("bench-upsert:"), (seq + 1).cast("string"))
    source = F.struct(
        F.lit(DEBEZIUM_VERSION).alias("version"),
        F.lit("mysql").alias("connector"),
        F.lit(SHAPE.server).alias("name"),
        (F.lit(_BASE_TS_MS) + seq * 10).cast("long").alias("ts_ms"),
        F.when(op == "r", F.lit("true")).otherwise(F.lit("false")).alias("snapshot"),
        F.lit(SHAPE.db).alias("db"),
        F.lit(None).cast("string").alias("sequence"),
        F.lit(SHAPE.table).alias("table"),
        F.lit(1).cast("long").alias("server_id"),
        gtid.alias("gtid"),
        F.lit("mysql-bin.000001").alias("file"),
        (F.lit(4) + seq * 512).cast("long").alias("pos"),
        F.lit(0).alias("row"),
        F.lit(None).cast("long").alias("thread"),
        F.lit(None).cast("string").alias("query"),
    )
    transaction = F.struct(
        gtid.alias("id"),
        F.lit(1).cast("long").alias("total_order"),
        F.lit(1).cast("long").alias("data_collection_order"),
    )
    envelope = F.struct(
        F.when(~op.isin("c", "r"), row_image(F.col("prev_seq"), F.col("born_seq"), key)).alias(
            "before"
        ),
        F.when(op != "d", row_image(seq, F.col("born_seq"), key)).alias("after"),
        source.alias("source"),
        op.alias("op"),
        (F.lit(_BASE_TS_MS + 5) + seq * 10).cast("long").alias("ts_ms"),
        transaction.alias("transaction"),
    )
    return plan_rows.select(
        F.col("partition"),
        F.struct(key.cast("int").alias("id")).alias("key"),
        envelope.alias("value"),
    )


def preload(
    spark: SparkSession,
    config: IcekeeperConfig,
    topic: str,
    plan: ChangePlan,
    partitions: int,
    folder: Path,
) -> dict[str, Any]:
    """Register the schemas and fill `topic` with the plan's Confluent-framed Avro records.

    Each Kafka partition is written by one Spark task in plan order (the Kafka producer keeps a
    connection's order), so every key's changes are in Kafka in the order the plan made them."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    source = config.sources[0]
    ensure_topic(source.bootstrap_servers, topic, partitions)
    framer = ConfluentAvroFramer(SchemaRegistryClient({"url": source.schema_registry_url}), topic)
    value_schema, key_schema = SHAPE.value_schema(), SHAPE.key_schema()
    value_id = framer.schema_id(value_schema, is_key=False)
    key_id = framer.schema_id(key_schema, is_key=True)
    ordered = (
        plan_frame(spark, plan, partitions, folder)
        .repartition(partitions, "partition")
        .sortWithinPartitions("seq")
    )
    framed = confluent_records(envelope_frame(ordered), key_id, value_id)
    started = time.monotonic()
    (
        framed.write.format("kafka")
        .mode("append")
        .option("kafka.bootstrap.servers", source.bootstrap_servers)
        .option("topic", topic)
        .option("kafka.enable.idempotence", "true")
        .option("kafka.linger.ms", "50")
        .option("kafka.batch.size", "1000000")
        .option("kafka.compression.type", "lz4")
        .save()
    )
    return {
        "topic": topic,
        "changes": plan.changes,
        "preload_s": round(time.monotonic() - started, 1),
        "value_schema_id": value_id,
        "key_schema_id": key_id,
        "value_schema": json.dumps(value_schema),
        "partition_records": np.bincount(plan.key % partitions, minlength=partitions).tolist(),
    }


def confluent_records(
    envelopes: DataFrame, key_id: int, value_id: int, keep: tuple[str, ...] = ()
) -> DataFrame:
    """`envelope_frame`'s rows as Kafka records (`partition`, `key`, `value`,
    and the columns in `keep`): Confluent-framed Avro of the bench's key and
    value schemas, registered under `key_id` and `value_id`."""
    from pyspark.sql.avro.functions import to_avro

    prefix = lambda schema_id: F.lit(bytes([0]) + schema_id.to_bytes(4, "big"))  # noqa: E731
    return envelopes.select(
        F.col("partition"),
        F.concat(prefix(key_id), to_avro(F.col("key"), json.dumps(SHAPE.key_schema()))).alias(
            "key"
        ),
        F.concat(prefix(value_id), to_avro(F.col("value"), json.dumps(SHAPE.value_schema()))).alias(
            "value"
        ),
        *keep,
    )

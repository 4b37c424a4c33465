"""`icekeeper bench writer`: our writer against Spark's own Iceberg streaming sink, same data, same
cores.

The topic is preloaded with seed-000-like Debezium Avro records (the `tbl_test_1` envelope, ~230
bytes each, Confluent-framed with a registered schema). The records are made in Spark's JVM with
`to_avro` (producing a million from Python would take minutes). Then, in one SparkSession:

- ours: `WriterJob` batches until idle (Parquet files + monikers; no commit),
- baseline: `readStream` from Kafka, the same `from_avro` decoding and flattening, and
  `writeStream` into an Iceberg table (iceberg-spark-runtime), trigger availableNow.

Then the bare pipeline in stages (`stages_s`: Kafka read; + decoding and flattening; + Parquet),
which shows where the time goes. The last stdout line is one JSON object with the figures.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyiceberg.schema import Schema
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from common.config.model import IcekeeperConfig
from common.spark import spark_session
from icekeeper.bench.work import fresh_work_folder
from icekeeper.samples import seed000
from icekeeper.samples.debezium import DEBEZIUM_VERSION
from icekeeper.samples.produce import ConfluentAvroFramer, ensure_topic

Progress = Callable[[str], None]


def seed_like_frame(spark: SparkSession, records: int, partitions: int) -> DataFrame:
    """`records` seed-000 envelopes (schema v4: C3..C6), keys spread over 100k ids, mostly
    updates."""
    n = F.col("id")
    row_fields = lambda base: F.struct(  # noqa: E731 - a template for before/after
        (F.lit(1000) + n % 100_000).cast("int").alias("ID1"),
        F.lit("A").alias("ID2"),
        F.concat(F.lit("V"), (n % 97).cast("string"), F.lit("-1")).alias("C1"),
        (base + n % 10_000).cast("int").alias("C2"),
        F.lit(None).cast("string").alias("C6"),
        F.concat(F.lit("S4-"), (n % 1000).cast("string")).alias("C5"),
        (F.lit(4000) + n % 13).cast("int").alias("C4"),
        F.lit(None).cast("int").alias("C3"),
        F.lit(1646101923000).cast("long").alias("CREATE_TIME"),
        (F.lit(1646296793000) + n * 1000).cast("long").alias("UPDATE_TIME"),
    )
    op = F.when(n % 10 == 0, F.lit("c")).otherwise(F.lit("u"))
    source = F.struct(
        F.lit(DEBEZIUM_VERSION).alias("version"),
        F.lit("mysql").alias("connector"),
        F.lit("test").alias("name"),
        (F.lit(1646297167000) + n * 1000).cast("long").alias("ts_ms"),
        F.lit("false").alias("snapshot"),
        F.lit("db_gb18030_test").alias("db"),
        F.lit(None).cast("string").alias("sequence"),
        F.lit("tbl_test_1").alias("table"),
        F.lit(1).cast("long").alias("server_id"),
        F.concat(F.lit("e45b718e-906f-11ec-89e3-0242c0a8640a:"), n.cast("string")).alias("gtid"),
        F.lit("mysql-bin.000021").alias("file"),
        (F.lit(46951) + n * 7).cast("long").alias("pos"),
        F.lit(0).alias("row"),
        F.lit(None).cast("long").alias("thread"),
        F.lit(None).cast("string").alias("query"),
    )
    transaction = F.struct(
        F.concat(F.lit("e45b718e-906f-11ec-89e3-0242c0a8640a:"), n.cast("string")).alias("id"),
        F.lit(1).cast("long").alias("total_order"),
        F.lit(1).cast("long").alias("data_collection_order"),
    )
    envelope = F.struct(
        F.when(op == "u", row_fields(F.lit(5000))).alias("before"),
        row_fields(F.lit(5001)).alias("after"),
        source.alias("source"),
        op.alias("op"),
        (F.lit(1646297167652) + n * 1000).cast("long").alias("ts_ms"),
        transaction.alias("transaction"),
    )
    key = F.struct((F.lit(1000) + n % 100_000).cast("int").alias("ID1"), F.lit("A").alias("ID2"))
    return spark.range(0, records, numPartitions=partitions).select(
        key.alias("key"), envelope.alias("value")
    )


def preload(
    spark: SparkSession, config: IcekeeperConfig, topic: str, records: int, partitions: int = 3
) -> dict[str, Any]:
    """Register the seed v4 schemas and fill `topic` with `records` Confluent-framed Avro
    messages."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from pyspark.sql.avro.functions import to_avro

    source = config.sources[0]
    ensure_topic(source.bootstrap_servers, topic, partitions)
    shape = seed000.SCHEMA_VERSIONS[4]
    framer = ConfluentAvroFramer(SchemaRegistryClient({"url": source.schema_registry_url}), topic)
    value_id = framer.schema_id(shape.value_schema(), is_key=False)
    key_id = framer.schema_id(shape.key_schema(), is_key=True)
    frame = seed_like_frame(spark, records, partitions)
    prefix = lambda schema_id: F.lit(bytes([0]) + schema_id.to_bytes(4, "big"))  # noqa: E731
    framed = frame.select(
        F.concat(prefix(key_id), to_avro(F.col("key"), json.dumps(shape.key_schema()))).alias(
            "key"
        ),
        F.concat(prefix(value_id), to_avro(F.col("value"), json.dumps(shape.value_schema()))).alias(
            "value"
        ),
    )
    started = time.monotonic()
    (
        framed.write.format("kafka")
        .mode("append")
        .option("kafka.bootstrap.servers", source.bootstrap_servers)
        .option("topic", topic)
        .option("kafka.linger.ms", "50")
        .option("kafka.batch.size", "1000000")
        .option("kafka.compression.type", "lz4")
        .save()
    )
    sizes = framed.select(F.avg(F.length("value")).alias("avg")).collect()[0]["avg"]
    return {
        "topic": topic,
        "records": records,
        "avg_value_bytes": round(float(sizes), 1),
        "preload_s": round(time.monotonic() - started, 1),
        "value_schema_id": value_id,
    }


def _seed_rows(
    config: IcekeeperConfig, kafka_frame: DataFrame, schema_text: str, schema_id: int
) -> tuple[DataFrame, Schema]:
    """The seed table's rows from a Kafka frame (batch or stream): our `from_avro` decoding and
    flattening, poison dropped; also the flattened Iceberg schema."""
    from common.schema import resolve_named_types
    from writers.columns import HELPER_COLUMNS
    from writers.decode import decode_avro_confluent
    from writers.flatten import flatten
    from writers.registry import RegisteredSchema

    registered = RegisteredSchema(
        schema_id, schema_text, resolve_named_types(json.loads(schema_text))
    )
    decoded = decode_avro_confluent(kafka_frame.withColumn("headers", F.lit(None)), [registered])
    flat = flatten(decoded.frame, decoded.versions, config.metadata_columns, None, ["ID1", "ID2"])
    return flat.frame.where(F.col("_ik_error").isNull()).drop(*HELPER_COLUMNS), flat.schema


def run_baseline(
    spark: SparkSession,
    config: IcekeeperConfig,
    topic: str,
    schema_text: str,
    schema_id: int,
    work_dir: Path,
) -> float:
    """Spark's own path: readStream -> same decode and flatten -> writeStream into an Iceberg
    table."""
    from common.catalog import DEFAULT_TABLE_PROPERTIES, open_catalog
    from common.spark import iceberg_catalog_conf

    for key, value in iceberg_catalog_conf(config).items():
        spark.conf.set(key, value)
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", config.sources[0].bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "250000")
        .option("minPartitions", str(spark.sparkContext.defaultParallelism))
        .load()
    )
    rows, schema = _seed_rows(config, stream, schema_text, schema_id)
    catalog = open_catalog(config)
    catalog.create_namespace_if_not_exists("bench")  # it exists after an earlier run
    identifier = f"bench.baseline_{uuid.uuid4().hex[:6]}"
    # Spark's columns are nullable, and the Iceberg sink refuses them for required fields.
    fields = [field.model_copy(update={"required": False}) for field in schema.fields]
    # The table properties our writer's files get (zstd, dictionary size), so both write alike.
    catalog.create_table(identifier, schema=Schema(*fields), properties=DEFAULT_TABLE_PROPERTIES)
    started = time.monotonic()
    query = (
        rows.writeStream.format("iceberg")
        .outputMode("append")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(work_dir / "baseline-checkpoint"))
        .toTable(f"{config.catalog.name}.{identifier}")
    )
    query.awaitTermination()
    seconds = time.monotonic() - started
    count = spark.table(f"{config.catalog.name}.{identifier}").count()
    return seconds if count else float("nan")


def measure_stages(
    spark: SparkSession,
    config: IcekeeperConfig,
    topic: str,
    schema_text: str,
    schema_id: int,
    work_dir: Path,
) -> dict[str, float]:
    """Seconds for the whole topic through growing prefixes of the pipeline, one Spark job each:
    Kafka read alone, + Avro decoding and flattening (Spark's `noop` sink), + Parquet (our files'
    settings). The differences say where a writer's time goes, on the same cores as the runs
    above."""

    def kafka() -> DataFrame:
        return (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", config.sources[0].bootstrap_servers)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .option("minPartitions", str(spark.sparkContext.defaultParallelism))
            .load()
        )

    from common.catalog import DEFAULT_TABLE_PROPERTIES
    from writers.files import parquet_write_options

    parquet_options = parquet_write_options(DEFAULT_TABLE_PROPERTIES)

    def timed(action: Callable[[], object]) -> float:
        started = time.monotonic()
        action()
        return round(time.monotonic() - started, 2)

    return {
        "read": timed(lambda: kafka().selectExpr("sum(length(value))").collect()),
        "read_decode_flatten": timed(
            lambda: (
                _seed_rows(config, kafka(), schema_text, schema_id)[0]
                .write.format("noop")
                .mode("overwrite")
                .save()
            )
        ),
        "read_decode_flatten_parquet": timed(
            lambda: (
                _seed_rows(config, kafka(), schema_text, schema_id)[0]
                .write.options(**parquet_options)
                .parquet(str(work_dir / "stages" / uuid.uuid4().hex))
            )
        ),
    }


def _run_ours(
    spark: SparkSession, config: IcekeeperConfig, topic: str, work_dir: Path
) -> tuple[float, int, int]:
    """Our writer over the whole topic, in batches of up to 500k records; (seconds, rows,
    batches)."""
    from writers.job import WriterJob

    bench_config = config.model_copy(
        update={
            "sources": [
                config.sources[0].model_copy(
                    update={"topics": [topic], "max_offsets_per_trigger": 500_000}
                )
            ],
            "tables": [
                config.tables[0].model_copy(
                    update={"topics": [topic], "identifier": "bench.ours", "mode": "changelog"}
                )
            ],
            "writer": config.writer.model_copy(
                update={"trigger_interval": 0.0, "checkpoint_uri": str(work_dir / "checkpoints")}
            ),
            "transport": config.transport.model_copy(update={"uri": str(work_dir / "txlog")})
            if config.transport.kind == "txlog"
            else config.transport,
            "catalog": config.catalog.model_copy(
                update={
                    "properties": {
                        **config.catalog.properties,
                        "warehouse": (work_dir / "warehouse").as_uri(),
                    }
                }
            ),
        }
    )
    job = WriterJob(bench_config, spark=spark, writer_id="bench-writer")
    started = time.monotonic()
    reports = job.run(until_idle=True)
    return time.monotonic() - started, sum(r.rows_written for r in reports), len(reports)


def run_writer_bench(
    config: IcekeeperConfig,
    records: int,
    progress: Progress = print,
    cores: int | None = None,
    repeat: int = 3,
) -> dict[str, Any]:
    """Preload, then time our writer and the baseline in one SparkSession, `repeat` times each.

    The two take turns (ours, baseline, ours, ...) and the figures are medians: on a shared
    machine the speed of the same run drifts by a quarter within minutes, and runs side by side
    see the same drift.
    """
    cores = cores or os.cpu_count() or 2
    work_dir = fresh_work_folder(config.state_dir, "bench-writer")
    topic = f"bench.seed.{uuid.uuid4().hex[:8]}"
    warm_topic = topic + ".warmup"
    spark = spark_session(
        config,
        "icekeeper-bench-writer",
        master=f"local[{cores}]",
        extra_conf={"spark.sql.shuffle.partitions": str(cores), "spark.driver.memory": "4g"},
    )
    progress(f"preloading {records:,} seed-like records into {topic} (and 100,000 to warm up)")
    loaded = preload(spark, config, topic, records)
    warm = preload(spark, config, warm_topic, 100_000)
    progress(
        f"preloaded in {loaded['preload_s']}s, {loaded['avg_value_bytes']} bytes per value on "
        "average"
    )
    schema_text = json.dumps(seed000.SCHEMA_VERSIONS[4].value_schema())

    # Both sides run once on the warm-up topic first, so neither pays for JIT compilation.
    _run_ours(spark, config, warm_topic, work_dir / "warm")
    run_baseline(spark, config, warm_topic, schema_text, warm["value_schema_id"], work_dir / "warm")
    ours_runs: list[float] = []
    baseline_runs: list[float] = []
    batches = 0
    for run in range(1, repeat + 1):
        ours_s, ours_rows, batches = _run_ours(spark, config, topic, work_dir / f"ours-{run}")
        if ours_rows != records:
            raise RuntimeError(f"our writer wrote {ours_rows:,} rows of {records:,} records")
        ours_runs.append(ours_s)
        baseline_runs.append(
            run_baseline(
                spark,
                config,
                topic,
                schema_text,
                loaded["value_schema_id"],
                work_dir / f"baseline-{run}",
            )
        )
        progress(
            f"run {run}/{repeat}: ours {ours_s:.1f}s ({batches} batches), baseline (Spark Iceberg "
            f"sink) {baseline_runs[-1]:.1f}s"
        )
    stages = measure_stages(spark, config, topic, schema_text, loaded["value_schema_id"], work_dir)
    progress(f"stages, seconds for the whole topic: {stages}")
    spark.stop()
    shutil.rmtree(work_dir, ignore_errors=True)
    ours_s, baseline_s = statistics.median(ours_runs), statistics.median(baseline_runs)
    ours_rate = records / ours_s
    baseline_rate = records / baseline_s
    return {
        "records": records,
        "cores": cores,
        "avg_value_bytes": loaded["avg_value_bytes"],
        "ours_s": round(ours_s, 2),
        "ours_records_per_s": round(ours_rate),
        "ours_records_per_s_per_core": round(ours_rate / cores),
        "baseline_s": round(baseline_s, 2),
        "baseline_records_per_s": round(baseline_rate),
        "ratio_vs_baseline": round(ours_rate / baseline_rate, 2),
        "ours_batches": batches,
        "stages_s": stages,
        "ours_runs_s": [round(s, 2) for s in ours_runs],
        "baseline_runs_s": [round(s, 2) for s in baseline_runs],
    }

"""`icekeeper bench writer`: our writer against Spark's own Iceberg streaming sink, on equal terms.

The topic is preloaded with seed-000-like Debezium Avro records (the `tbl_test_1` envelope, ~230
bytes each, Confluent-framed with a registered schema). The records are made in Spark's JVM with
`to_avro` (producing a million from Python would take minutes). Then, in one SparkSession:

- ours: `WriterJob` batches until idle (Parquet files + monikers), then the bookkeeper commits
  them: `ours_writer_s` is the writer alone, `ours_s` until every record is visible in a
  snapshot (our rows are not readable before the bookkeeper's commit);
- baseline: `readStream` from Kafka, the same `from_avro` decoding and flattening, and
  `writeStream` into an Iceberg table (iceberg-spark-runtime), trigger availableNow: its rows are
  visible when it ends.

Equal terms: both read with the writer's Spark Kafka options (`batch_read_options`: tasks of at
most a quarter of a batch on 2 cores, the same fetch sizes), in batches of `BATCH_RECORDS`
(`maxOffsetsPerTrigger` for the baseline), decode with the same Avro reader schema (only the
envelope fields the metadata columns use), write Parquet with the same table properties, and
take turns going first (ours first in odd runs, the baseline in even ones); figures are medians.

Then the bare pipeline in stages (`stages_s`: Kafka read; + decoding and flattening; + Parquet),
with the same read options and reader schema, which shows where the time goes. The last stdout
line is one JSON object with the figures.

`layouts` (`--layout local,s3`): the sides above always run with their tables on local disk; each
other layout adds a side taking its turn with them: the default engine (`writer.engine`) with its
warehouse there (`s3`: the stack's S3 server, `layouts.py`), on the same topic, batches, cores
and SparkSession (started with the S3 jars and s3a settings when a layout needs them). Its
figures, and their ratio to the same engine's on local disk in the same run, are under the
layout's name (`"s3": {"visible_vs_local": ...}`). Only the tables' files move: checkpoints and
monikers stay local.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pyiceberg.schema import Schema
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from icekeeper.bench.layouts import (
    BenchLayout,
    open_layout,
    remove_layout_files,
)
from icekeeper.bench.work import fresh_work_folder
from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.common.exit_codes import UsageError
from icekeeper.common.spark import spark_session
from icekeeper.samples import seed000
from icekeeper.samples.debezium import DEBEZIUM_VERSION
from icekeeper.samples.produce import ConfluentAvroFramer, ensure_topic
from icekeeper.seed_defaults import SEED_TABLE

Progress = Callable[[str], None]


def seed_like_frame(spark: SparkSession, records: int, partitions: int) -> DataFrame:
    """`records` seed-000 envelopes (schema v4: C3..C6),
    keys spread over 100k ids, mostly updates."""
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
    """Register the seed v4 schemas and fill `topic`
    with `records` Confluent-framed Avro messages."""
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


BATCH_RECORDS = 500_000
"""Records per batch: ours (`max_offsets_per_trigger`) and the baseline (`maxOffsetsPerTrigger`)."""


def _kafka_options(spark: SparkSession, config: IcekeeperConfig) -> dict[str, str]:
    """The writer's Spark Kafka options for a batch of `BATCH_RECORDS` (task split, fetch sizes)."""
    from icekeeper.writers.spark_sql_engine.kafka_source import batch_read_options

    parallelism = spark.sparkContext.defaultParallelism
    return batch_read_options(config.sources[0], parallelism, BATCH_RECORDS)


def _seed_rows(
    config: IcekeeperConfig, kafka_frame: DataFrame, schema_text: str, schema_id: int
) -> tuple[DataFrame, Schema]:
    """The seed table's rows from a Kafka frame (batch or stream):
    our `from_avro` decoding (with the writer's reader schema) and
    flattening, poison dropped; also the flattened Iceberg schema."""
    from icekeeper.common.schema import resolve_named_types
    from icekeeper.writers.registry import RegisteredSchema
    from icekeeper.writers.spark_sql_engine.columns import HELPER_COLUMNS
    from icekeeper.writers.spark_sql_engine.decoding import decode_avro_confluent
    from icekeeper.writers.spark_sql_engine.sql_flatten import flatten
    from icekeeper.writers.table_batch import table_schema
    from icekeeper.writers.version_shapes import envelope_fields

    registered = RegisteredSchema(
        schema_id, schema_text, resolve_named_types(json.loads(schema_text))
    )
    decoded = decode_avro_confluent(
        kafka_frame.withColumn("headers", F.lit(None)),
        [registered],
        envelope_fields(config.metadata_columns),
    )
    schema = table_schema(decoded.versions, config.metadata_columns, None, ["ID1", "ID2"])
    flat = flatten(decoded.frame, decoded.versions, config.metadata_columns, schema)
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
    table; seconds until it ends (its rows are then visible)."""
    from icekeeper.common.catalog import DEFAULT_TABLE_PROPERTIES, open_catalog
    from icekeeper.common.spark import iceberg_catalog_conf

    for key, value in iceberg_catalog_conf(config).items():
        spark.conf.set(key, value)
    stream = (
        spark.readStream.format("kafka")
        .options(**_kafka_options(spark, config))
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(BATCH_RECORDS))
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
    settings), with the writer's read options and reader schema. The differences say where a
    writer's time goes, on the same cores as the runs above."""

    def kafka() -> DataFrame:
        return (
            spark.read.format("kafka")
            .options(**_kafka_options(spark, config))
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .load()
        )

    from icekeeper.common.catalog import DEFAULT_TABLE_PROPERTIES
    from icekeeper.common.parquet_files import parquet_write_options

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


def _ours_config(
    config: IcekeeperConfig,
    topic: str,
    work_dir: Path,
    engine: str = "spark-sql",
    layout: BenchLayout | None = None,
) -> IcekeeperConfig:
    """One source and one changelog table (seed 000's: the preloaded records are its) on `topic`,
    state (checkpoints, txlog, warehouse, lease) under `work_dir`; with a `layout` on an object
    store, the warehouse there (a folder of the run's own) and its storage properties."""
    properties = {
        **config.catalog.properties,
        "uri": f"sqlite:///{work_dir / 'catalog.db'}",
        "warehouse": (work_dir / "warehouse").as_uri(),
    }
    if layout is not None and layout.on_object_store:
        properties = {
            **properties,
            **layout.catalog_properties,
            "uri": f"sqlite:///{work_dir / 'catalog.db'}",
            "warehouse": layout.location(work_dir.name),
        }
    return config.model_copy(
        update={
            "sources": [
                config.sources[0].model_copy(
                    update={"topics": [topic], "max_offsets_per_trigger": BATCH_RECORDS}
                )
            ],
            "tables": [
                SEED_TABLE.model_copy(
                    update={
                        "source": config.sources[0].name,
                        "topics": [topic],
                        "identifier": "bench.ours",
                        "mode": "changelog",
                    }
                )
            ],
            "writer": config.writer.model_copy(
                update={
                    "trigger_interval": 0.0,
                    "checkpoint_uri": str(work_dir / "checkpoints"),
                    "engine": engine,
                }
            ),
            "transport": config.transport.model_copy(update={"uri": str(work_dir / "txlog")})
            if config.transport.kind == "txlog"
            else config.transport,
            "bookkeeper": config.bookkeeper.model_copy(
                update={"http_port": 0, "commit_report_path": str(work_dir / "commits.jsonl")}
            ),
            "group": config.group.model_copy(update={"lease_uri": str(work_dir / "lease")}),
            "catalog": config.catalog.model_copy(update={"properties": properties}),
        }
    )


def _run_ours(
    spark: SparkSession,
    config: IcekeeperConfig,
    topic: str,
    work_dir: Path,
    engine: str = "spark-sql",
    layout: BenchLayout | None = None,
) -> tuple[float, float, int, int]:
    """Our writer over the whole topic in batches of `BATCH_RECORDS`, then the bookkeeper until
    every record is committed; (writer seconds, seconds until visible, rows, batches)."""
    from icekeeper.bookkeeper.service import Bookkeeper
    from icekeeper.common.catalog import load_table_or_none, open_catalog
    from icekeeper.writers.job import WriterJob

    bench_config = _ours_config(config, topic, work_dir, engine, layout)
    job = WriterJob(bench_config, spark=spark, writer_id="bench-writer")
    started = time.monotonic()
    reports = job.run(until_idle=True)
    written_s = time.monotonic() - started
    rows = sum(r.rows_written for r in reports)
    catalog = open_catalog(bench_config)
    committed = 0
    while committed < rows:
        Bookkeeper(bench_config).run(once=True)
        table = load_table_or_none(catalog, "bench.ours")
        snapshot = table.current_snapshot() if table is not None else None
        committed = int(snapshot.summary["total-records"]) if snapshot is not None else 0
        if time.monotonic() - started > 600:
            raise TimeoutError(f"the bookkeeper committed {committed:,} rows of {rows:,}")
    visible_s = time.monotonic() - started
    if layout is not None and layout.on_object_store:
        _check_files_on(layout, catalog, bench_config)
    return written_s, visible_s, rows, len(reports)


def _check_files_on(layout: BenchLayout, catalog: Any, config: IcekeeperConfig) -> None:
    """Untimed: every data file of the run's table is under the layout's root (a layout the
    writer did not take would measure local disk under the layout's name)."""
    table = catalog.load_table("bench.ours")
    paths = [task.file.file_path for task in table.scan().plan_files()]
    elsewhere = [path for path in paths if not path.startswith(layout.root)]
    if not paths or elsewhere:
        raise RuntimeError(
            f"layout {layout.name}: {len(elsewhere)} of {len(paths)} data files are not under "
            f"{layout.root} (e.g. {elsewhere[:1]}); warehouse "
            f"{config.catalog.properties['warehouse']}"
        )


WRITER_LAYOUTS = ("local", "s3")
"""Layouts `bench writer` takes (`layouts.py`); the REST catalog plays no part in writing."""


def run_writer_bench(
    config: IcekeeperConfig,
    records: int,
    progress: Progress = print,
    cores: int | None = None,
    repeat: int = 3,
    layouts: Sequence[str] = ("local",),
    spark: SparkSession | None = None,
    warmup_records: int = 100_000,
) -> dict[str, Any]:
    """Preload, then time our writer and the baseline in one SparkSession, `repeat` times each.

    The sides take turns, and which goes first rotates, and the figures are medians: on a
    shared machine the speed of the same run drifts by a quarter within minutes, and runs side
    by side see the same drift. Each layout of `layouts` but `local` adds a side: the default
    engine with its warehouse on that layout (the module docstring).

    Args:
        spark: a running session to use (and leave running; the tests' one, which has the S3
            jars); by default the bench starts its own on `cores` cores and stops it.
        warmup_records: records of the warm-up topic every side runs over first.
    """
    unknown = [name for name in layouts if name not in WRITER_LAYOUTS]
    if unknown:
        raise UsageError(
            f"bench writer: no layout {', '.join(unknown)} (writer: {', '.join(WRITER_LAYOUTS)})"
        )
    cores = cores or os.cpu_count() or 2
    work_dir = fresh_work_folder(config.state_dir, "bench-writer")
    elsewhere = [
        open_layout(name, config, work_dir / f"layout-{name}")
        for name in dict.fromkeys(layouts)
        if name != "local"
    ]
    own_session = spark is None
    if spark is None:
        spark = spark_session(
            _session_config(config, elsewhere),
            "icekeeper-bench-writer",
            master=f"local[{cores}]",
            extra_conf={"spark.sql.shuffle.partitions": str(cores), "spark.driver.memory": "4g"},
        )
    try:
        return _run_writer_bench(
            spark, config, records, progress, cores, repeat, work_dir, elsewhere, warmup_records
        )
    finally:
        if own_session:
            spark.stop()
        for layout in elsewhere:
            remove_layout_files(layout)
        shutil.rmtree(work_dir, ignore_errors=True)


def _session_config(config: IcekeeperConfig, elsewhere: list[BenchLayout]) -> IcekeeperConfig:
    """The config the bench's SparkSession starts from: with the object stores' properties when
    a layout needs them, so its jars and Hadoop (s3a) settings are there from the start (they
    cannot be added to a running session). Under another catalog name: a name's FileIO
    settings cannot be taken back once set, and the local sides' catalog must keep its own."""
    properties = dict(config.catalog.properties)
    for layout in elsewhere:
        properties.update(layout.catalog_properties)
    if not elsewhere:
        return config
    catalog = config.catalog.model_copy(
        update={"name": f"{config.catalog.name}_layouts", "properties": properties}
    )
    return config.model_copy(update={"catalog": catalog})


def _run_writer_bench(
    spark: SparkSession,
    config: IcekeeperConfig,
    records: int,
    progress: Progress,
    cores: int,
    repeat: int,
    work_dir: Path,
    elsewhere: list[BenchLayout],
    warmup_records: int,
) -> dict[str, Any]:
    topic = f"bench.seed.{uuid.uuid4().hex[:8]}"
    warm_topic = topic + ".warmup"
    progress(
        f"preloading {records:,} seed-like records into {topic} (and {warmup_records:,} to warm up)"
    )
    loaded = preload(spark, config, topic, records)
    warm = preload(spark, config, warm_topic, warmup_records)
    progress(
        f"preloaded in {loaded['preload_s']}s, "
        f"{loaded['avg_value_bytes']} bytes per value on average"
    )
    schema_text = json.dumps(seed000.SCHEMA_VERSIONS[4].value_schema())
    default_engine = config.writer.engine

    # Every side runs once on the warm-up topic first, so none pays for JIT compilation.
    _run_ours(spark, config, warm_topic, work_dir / "warm-ours")
    _run_ours(spark, config, warm_topic, work_dir / "warm-arrow", engine="arrow")
    for layout in elsewhere:
        _run_ours(
            spark, config, warm_topic, work_dir / f"warm-{layout.name}", default_engine, layout
        )
    run_baseline(spark, config, warm_topic, schema_text, warm["value_schema_id"], work_dir / "warm")
    ours_writer: list[float] = []
    ours_visible: list[float] = []
    baseline_runs: list[float] = []
    arrow_writer: list[float] = []
    arrow_visible: list[float] = []
    on_layout: dict[str, tuple[list[float], list[float]]] = {
        layout.name: ([], []) for layout in elsewhere
    }
    batches = 0

    def ours(run: int) -> None:
        nonlocal batches
        writer_s, visible_s, rows, batches = _run_ours(
            spark, config, topic, work_dir / f"ours-{run}"
        )
        if rows != records:
            raise RuntimeError(f"our writer wrote {rows:,} rows of {records:,} records")
        ours_writer.append(writer_s)
        ours_visible.append(visible_s)

    def baseline(run: int) -> None:
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

    def arrow(run: int) -> None:
        # Our writer with `writer.engine: arrow` (writers/arrow_engine/), same batches and tables.
        writer_s, visible_s, rows, _ = _run_ours(
            spark, config, topic, work_dir / f"arrow-{run}", engine="arrow"
        )
        if rows != records:
            raise RuntimeError(f"the arrow engine wrote {rows:,} rows of {records:,} records")
        arrow_writer.append(writer_s)
        arrow_visible.append(visible_s)

    def layout_side(layout: BenchLayout) -> Callable[[int], None]:
        def side(run: int) -> None:
            writer_s, visible_s, rows, _ = _run_ours(
                spark, config, topic, work_dir / f"{layout.name}-{run}", default_engine, layout
            )
            if rows != records:
                raise RuntimeError(f"{layout.name}: wrote {rows:,} rows of {records:,} records")
            on_layout[layout.name][0].append(writer_s)
            on_layout[layout.name][1].append(visible_s)

        side.__name__ = f"{default_engine}_on_{layout.name}"
        return side

    sides = (ours, baseline, arrow, *(layout_side(layout) for layout in elsewhere))
    for run in range(1, repeat + 1):
        # Each side goes first in turn.
        first = (run - 1) % len(sides)
        order = sides[first:] + sides[:first]
        for side in order:
            side(run)
        on_layouts = "".join(
            f"; {default_engine} on {name} {writer[-1]:.1f}s writing, {visible[-1]:.1f}s "
            "until visible"
            for name, (writer, visible) in on_layout.items()
        )
        progress(
            f"run {run}/{repeat} ({order[0].__name__} first): ours {ours_writer[-1]:.1f}s "
            f"writing, {ours_visible[-1]:.1f}s until visible ({batches} batches); "
            f"baseline (Spark Iceberg sink) {baseline_runs[-1]:.1f}s; arrow engine "
            f"{arrow_writer[-1]:.1f}s writing, {arrow_visible[-1]:.1f}s until visible" + on_layouts
        )
    stages = measure_stages(spark, config, topic, schema_text, loaded["value_schema_id"], work_dir)
    progress(f"stages, seconds for the whole topic: {stages}")
    writer_s = statistics.median(ours_writer)
    ours_s, baseline_s = statistics.median(ours_visible), statistics.median(baseline_runs)
    ours_rate, baseline_rate = records / ours_s, records / baseline_s
    local_default = (
        (arrow_writer, arrow_visible) if default_engine == "arrow" else (ours_writer, ours_visible)
    )
    return {
        "records": records,
        "cores": cores,
        "batch_records": BATCH_RECORDS,
        "avg_value_bytes": loaded["avg_value_bytes"],
        "ours_s": round(ours_s, 2),
        "ours_records_per_s": round(ours_rate),
        "ours_records_per_s_per_core": round(ours_rate / cores),
        "ours_writer_s": round(writer_s, 2),
        "ours_writer_records_per_s_per_core": round(records / writer_s / cores),
        "baseline_s": round(baseline_s, 2),
        "baseline_records_per_s": round(baseline_rate),
        "ratio_vs_baseline": round(ours_rate / baseline_rate, 2),
        "ratio_writer_only_vs_baseline": round(baseline_s / writer_s, 2),
        "ours_batches": batches,
        "stages_s": stages,
        "ours_writer_runs_s": [round(s, 2) for s in ours_writer],
        "ours_visible_runs_s": [round(s, 2) for s in ours_visible],
        "baseline_runs_s": [round(s, 2) for s in baseline_runs],
        **_arrow_figures(records, cores, baseline_s, arrow_writer, arrow_visible),
        **_default_figures(default_engine, records, cores, baseline_s, ours_s, arrow_visible),
        "layouts": ["local", *on_layout],
        **{
            name: _layout_figures(default_engine, records, cores, local_default, runs)
            for name, runs in on_layout.items()
        },
    }


def _layout_figures(
    engine: str,
    records: int,
    cores: int,
    local: tuple[list[float], list[float]],
    elsewhere: tuple[list[float], list[float]],
) -> dict[str, Any]:
    """The default engine on another layout (writer seconds, seconds until visible; medians) and
    against its own local-disk runs of the same run: `visible_vs_local` 1.15 is 15% slower."""
    writer_s, visible_s = statistics.median(elsewhere[0]), statistics.median(elsewhere[1])
    local_writer_s, local_visible_s = statistics.median(local[0]), statistics.median(local[1])
    return {
        "engine": engine,
        "visible_s": round(visible_s, 2),
        "records_per_s_per_core": round(records / visible_s / cores),
        "writer_s": round(writer_s, 2),
        "visible_vs_local": round(visible_s / local_visible_s, 3),
        "writer_vs_local": round(writer_s / local_writer_s, 3),
        "writer_runs_s": [round(s, 2) for s in elsewhere[0]],
        "visible_runs_s": [round(s, 2) for s in elsewhere[1]],
    }


def _default_figures(
    engine: str, records: int, cores: int, baseline_s: float, ours_s: float, arrow: list[float]
) -> dict[str, Any]:
    """The figures of `writer.engine`'s default, the ones issue 15's target is about: until
    visible, per core and against the baseline (`ours_*` are spark-sql's, `arrow_*` arrow's)."""
    visible_s = statistics.median(arrow) if engine == "arrow" else ours_s
    return {
        "default_engine": engine,
        "default_s": round(visible_s, 2),
        "default_records_per_s_per_core": round(records / visible_s / cores),
        "default_ratio_vs_baseline": round(baseline_s / visible_s, 2),
    }


def _arrow_figures(
    records: int, cores: int, baseline_s: float, writer: list[float], visible: list[float]
) -> dict[str, Any]:
    """The arrow engine's side of the report (medians, as ours)."""
    writer_s, visible_s = statistics.median(writer), statistics.median(visible)
    return {
        "arrow_s": round(visible_s, 2),
        "arrow_records_per_s_per_core": round(records / visible_s / cores),
        "arrow_writer_s": round(writer_s, 2),
        "arrow_writer_records_per_s_per_core": round(records / writer_s / cores),
        "arrow_ratio_vs_baseline": round(baseline_s / visible_s, 2),
        "arrow_writer_runs_s": [round(s, 2) for s in writer],
        "arrow_visible_runs_s": [round(s, 2) for s in visible],
    }

"""One way to build a SparkSession for icekeeper: the right jars, Iceberg catalog, quiet logs.

Writers (Kafka source, Avro decoding, Iceberg transform functions) and the reaper (Iceberg
procedures on the same catalog pyiceberg uses) both start Spark through `spark_session`.
Jars are fetched once from Maven Central into the cache; on a cluster, `spark-submit
--packages` with `SPARK_PACKAGES` does the same.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from icekeeper.common.artifacts import MavenBundle, maven_bundle
from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.common.jdbc_catalog import SQLITE_JDBC_DRIVER, jdbc_catalog_properties, jdbc_driver
from icekeeper.common.rest_catalog import rest_catalog_packages, rest_catalog_properties
from icekeeper.common.storage import StorageSettings, spark_storage_conf, spark_storage_packages

if TYPE_CHECKING:  # pyspark is imported where a session starts, not when this module loads
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

SPARK_VERSION = "4.1.1"
ICEBERG_VERSION = "1.11.0"
SPARK_PACKAGES = (
    f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}",
    # The 4.1.x token provider is missing from the Maven Central mirror we can reach; its
    # classes (KafkaConfigUpdater, KafkaTokenUtil) are unchanged since 4.0.0, which is there.
    "org.apache.spark:spark-token-provider-kafka-0-10_2.13:4.0.0",
    "org.apache.kafka:kafka-clients:3.9.1",
    "org.apache.commons:commons-pool2:2.12.1",
    f"org.apache.spark:spark-avro_2.13:{SPARK_VERSION}",
    f"org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:{ICEBERG_VERSION}",
    # Spark's JdbcCatalog opens the SQLite catalog file pyiceberg's SqlCatalog writes.
    SQLITE_JDBC_DRIVER,
)
SECRET_CONF_REGEX = r"(?i)secret|password|token|access[.]?key|credential|authorization|[.]header[.]"
"""`spark.redaction.regex`: Spark's default, and the REST catalog's `credential` and headers
(`header.Authorization`), which it would otherwise show in clear wherever it lists its settings
(an event log, `spark-submit --verbose`)."""
V1_SOURCES_BUT_KAFKA = ("avro", "csv", "json", "orc", "parquet", "text")
"""Spark's default `spark.sql.sources.useV1SourceList` without `kafka`."""
FUNCTIONS_CATALOG = "ik_functions"
"""An Iceberg catalog registered only for its `system.*`
functions (bucket, days, hours, truncate)."""


def spark_jars(cache_dir: Path, storage_packages: tuple[str, ...] = ()) -> list[Path]:
    """The jars above, without their dependencies: PySpark already ships the rest; then those of
    the object stores the config uses (`storage_packages`), in a bundle of their own."""
    bundle = MavenBundle(
        name=f"spark-{SPARK_VERSION}-iceberg-{ICEBERG_VERSION}",
        coordinates=SPARK_PACKAGES,
        transitive=False,
    )
    jars = maven_bundle(cache_dir, bundle)
    if storage_packages:
        names = "-".join(sorted(p.split(":")[1] for p in storage_packages))
        jars += maven_bundle(
            cache_dir,
            MavenBundle(
                name=f"spark-storage-{names}-iceberg-{ICEBERG_VERSION}",
                coordinates=storage_packages,
                transitive=False,
            ),
        )
    return jars


def storage_packages(config: IcekeeperConfig) -> tuple[str, ...]:
    """Maven coordinates of the jars Spark needs for the config's object stores: Iceberg's
    S3FileIO with its AWS SDK and Hadoop's s3a for S3, Iceberg's ADLSFileIO for Azure; the
    JDBC driver of a SQL catalog that is not on SQLite (PostgreSQL's), the AWS SDK of a REST
    catalog's SigV4 signing."""
    properties = config.catalog.properties
    kind = properties.get("type", "sql")
    driver = jdbc_driver(properties.get("uri", "")) if kind == "sql" else None
    packages = spark_storage_packages(
        StorageSettings.from_properties(properties), table_locations(config), ICEBERG_VERSION
    ) + ((driver,) if driver else ())
    if kind == "rest":
        packages += rest_catalog_packages(properties, ICEBERG_VERSION)
    return tuple(dict.fromkeys(packages))


def table_locations(config: IcekeeperConfig) -> list[str]:
    """Where the config's tables live: the warehouse and every table's own location."""
    locations = [config.catalog.properties.get("warehouse", "")]
    locations += [table.location for table in config.tables if table.location]
    return [location for location in locations if location]


def iceberg_catalog_conf(config: IcekeeperConfig) -> dict[str, str]:
    """Spark settings that open the pyiceberg catalog under the same name.

    The catalog name must be identical on both sides: Spark's JdbcCatalog stores its Spark
    catalog name as `catalog_name`, exactly like pyiceberg's SqlCatalog stores its own.
    """
    name = config.catalog.name
    properties = config.catalog.properties
    prefix = f"spark.sql.catalog.{name}"
    conf = {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.cache-enabled": "false"}
    kind = properties.get("type", "sql")
    timeout_s = config.catalog.request_timeout
    if kind == "sql":
        conf[f"{prefix}.type"] = "jdbc"
        jdbc = jdbc_catalog_properties(properties["uri"], timeout_s)
        conf.update({f"{prefix}.{key}": value for key, value in jdbc.items()})
    elif kind == "rest":
        # The credentials, headers and signing pyiceberg authenticates with, under Java's names.
        conf[f"{prefix}.type"] = "rest"
        rest = rest_catalog_properties(properties, timeout_s)
        conf.update({f"{prefix}.{key}": value for key, value in rest.items()})
    else:
        conf[f"{prefix}.type"] = kind
        if "uri" in properties:
            conf[f"{prefix}.uri"] = properties["uri"]
    if "warehouse" in properties:
        conf[f"{prefix}.warehouse"] = properties["warehouse"]
    # The tables' FileIO (S3FileIO, ADLSFileIO) from the same `s3.*` / `adls.*` properties
    # pyiceberg takes, and Hadoop's s3a / abfs for the files Spark lists and writes itself.
    file_io, hadoop = spark_storage_conf(
        StorageSettings.from_properties(properties), table_locations(config)
    )
    conf.update({f"{prefix}.{key}": value for key, value in file_io.items()})
    conf.update(hadoop)
    return conf


_LOG4J2_PROPERTIES = """\
# Written by icekeeper (common/spark.py) for `spark.log_level: {level}`: Spark's own logs on stderr.
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""


def spark_log_config(config: IcekeeperConfig) -> Path:
    """A log4j2 configuration at `spark.log_level`, for the driver JVM from its start: Spark's
    warnings at startup (a loopback hostname, no native-hadoop library) come before any
    `setLogLevel`, and its default configuration shows them."""
    level = config.spark.log_level
    path = Path(config.state_dir) / "spark" / f"log4j2-{level}.properties"
    text = _LOG4J2_PROPERTIES.format(level=level)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.part")
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)  # whole, for a JVM starting meanwhile in another process
    return path


def _effective_master(configured: str) -> str:
    """The master the session will run on: spark-submit's (`--master`) when it launched us."""
    if not launched_by_spark_submit():
        return configured
    from pyspark import SparkConf

    return SparkConf().get("spark.master", "local[*]") or "local[*]"


def launched_by_spark_submit() -> bool:
    """True when this Python process was started by `spark-submit` (its JVM is already running)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def spark_submit_packages(config: IcekeeperConfig | None = None) -> str:
    """The `--packages` value for `spark-submit` of a writer (with those of its object stores)."""
    return ",".join(SPARK_PACKAGES + (storage_packages(config) if config is not None else ()))


FIXED_SQL_CONF = {
    # Debezium's DATETIME carriers are wall-clock values encoded as UTC: converted in a UTC session
    # they keep their digits (the engines' conversions: sql_conversions.py, arrow_conversions.py).
    "spark.sql.session.timeZone": "UTC",
    # Iceberg stores proleptic Gregorian dates and times; Spark's default refuses to write dates
    # before 1582 (MariaDB DATE starts at year 1000) rather than write them as they are.
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
    # Avro's dates and timestamps are proleptic Gregorian too (Spark's default): `EXCEPTION` would
    # dead-letter a valid record with a date before 1582 as `undecodable-avro`, `LEGACY` shift
    # it, on `spark-sql` only (the arrow engine reads it as it is).
    "spark.sql.avro.datetimeRebaseModeInRead": "CORRECTED",
}
"""Settings the writer's output depends on: applied after, and over, `spark.conf`."""


def executor_env_conf(config: IcekeeperConfig, master: str) -> dict[str, str]:
    """`spark.archives` shipping the executors' Python environment (`spark.executor_env`), for a
    session whose executors run Python tasks; nothing on a local master (its workers run this
    Python) or when the key is empty. `packed` builds the archive on first use (minutes)."""
    from icekeeper.common.executor_env import PACKED, packed_env, spark_archive_conf
    from icekeeper.common.logs import PROGRESS_LOGGER

    setting = config.spark.executor_env.strip()
    if not setting or master.startswith("local"):
        return {}
    if setting == PACKED:
        announce = logging.getLogger(PROGRESS_LOGGER).info
        archive = str(packed_env(Path(config.cache_dir), announce).archive.resolve())
    else:
        archive = setting
    return spark_archive_conf(archive, config.spark.conf.get("spark.archives"))


def spark_session(
    config: IcekeeperConfig,
    app_name: str,
    master: str | None = None,
    extra_conf: Mapping[str, str] | None = None,
    python_tasks: bool = False,
) -> SparkSession:
    """A SparkSession with Kafka, Avro and Iceberg on the classpath and the catalog registered.

    Args:
        python_tasks: the session runs Python in its executors (the writer's arrow engine): ship
            them the environment `spark.executor_env` names and run its Python.
    """
    from pyspark.sql import SparkSession

    functions_warehouse = Path(config.state_dir) / "spark" / "functions-warehouse"
    builder = SparkSession.builder.appName(app_name)
    own_workers = False
    if not launched_by_spark_submit():
        # Under spark-submit, master and jars come from its command line (`--packages`).
        jars = spark_jars(Path(config.cache_dir), storage_packages(config))
        builder = builder.master(master or config.spark.master).config(
            "spark.jars", ",".join(str(jar) for jar in jars)
        )
        own_workers = (master or config.spark.master).startswith("local") and (
            "PYSPARK_PYTHON" not in os.environ
        )
    if own_workers:
        # Local Python workers run this interpreter (below), so their daemon can be ours, whose
        # tasks start ~150 ms sooner (common/spark_worker_daemon.py).
        builder = builder.config(
            "spark.python.daemon.module", "icekeeper.common.spark_worker_daemon"
        )
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.redaction.regex", SECRET_CONF_REGEX)
        .config("spark.ui.showConsoleProgress", "false")
        .config(
            "spark.sql.extensions",
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        )
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.parquet.fieldId.write.enabled", "true")
        .config("spark.sql.parquet.compression.codec", "zstd")
        .config("spark.sql.shuffle.partitions", "8")
        # Kafka batch reads through the DataSource V2 reader, which hands Spark UnsafeRows; the V1
        # relation (Spark's default for batch reads) converts every record to an external Row and
        # back: measured ~10% of a writer's CPU time on 1M seed-like records.
        .config("spark.sql.sources.useV1SourceList", ",".join(V1_SOURCES_BUT_KAFKA))
        # From the JVM's start: Spark's startup warnings come before `setLogLevel` below can act.
        .config(
            "spark.driver.extraJavaOptions",
            f"-Dlog4j2.configurationFile={spark_log_config(config).resolve().as_uri()}",
        )
        .config(f"spark.sql.catalog.{FUNCTIONS_CATALOG}", "org.apache.iceberg.spark.SparkCatalog")
        .config(f"spark.sql.catalog.{FUNCTIONS_CATALOG}.type", "hadoop")
        .config(f"spark.sql.catalog.{FUNCTIONS_CATALOG}.warehouse", functions_warehouse.as_uri())
    )
    shipped_env = {}
    if python_tasks and config.spark.executor_env.strip():
        shipped_env = executor_env_conf(config, _effective_master(master or config.spark.master))
    for key, value in {
        **iceberg_catalog_conf(config),
        **config.spark.conf,
        **(extra_conf or {}),
        **shipped_env,
        **FIXED_SQL_CONF,
    }.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if shipped_env:
        # PySpark names the executors' Python from the driver (`PYSPARK_PYTHON`, else `python3`),
        # as each job's tasks are created: the unpacked archive's, in every executor's work folder.
        from icekeeper.common.executor_env import EXECUTOR_PYTHON

        session.sparkContext.pythonExec = EXECUTOR_PYTHON
    if session.sparkContext.master.startswith("local") and "PYSPARK_PYTHON" not in os.environ:
        # PySpark starts Python workers with `python3` from PATH unless told otherwise, and that
        # one may lack our packages (the arrow engine's tasks): local workers run this one.
        session.sparkContext.pythonExec = sys.executable
    session.sparkContext.setLogLevel(config.spark.log_level.upper())
    _quiet_routine_warnings(session)
    return session


# Loggers whose warnings are routine for icekeeper and would otherwise repeat every batch: each
# batch read is a new Kafka relation with Spark's own group id, so the executors' consumer pool
# outgrows its soft limit and evicts idle consumers, as designed.
_ROUTINE_WARNINGS = ("org.apache.spark.sql.kafka010.consumer.InternalKafkaConsumerPool",)


def _quiet_routine_warnings(session: SparkSession) -> None:
    """Raise the routine loggers to ERROR in the driver JVM (executors of `local[*]` share it)."""
    from icekeeper.common.internals import (
        spark_jvm,  # pyiceberg too: not for every user of this module
    )

    jvm = spark_jvm(session)  # log4j levels have no Python API
    error = jvm.org.apache.logging.log4j.Level.ERROR
    for name in _ROUTINE_WARNINGS:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, error)

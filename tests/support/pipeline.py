"""One test's pipeline on the session stack: its config, its catalog in the shared SparkSession,
committing what its writers published, and reading back the table and the topics."""

from __future__ import annotations

import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.config import IcekeeperConfig
from tests.support.seed_config import seed_config
from tests.support.stack import TEST_STACK_PORTS, stack_environ


def pipeline_config(
    state_dir: Path, topic: str, extra: dict[str, str] | None = None
) -> IcekeeperConfig:
    """A config for one test: the session stack, its own state folder, catalog and topic.

    The catalog name is unique per test because Spark's Iceberg JdbcCatalog stores its Spark
    catalog name in the catalog database, so a shared SparkSession registers one per test.
    """
    environ = stack_environ(state_dir, TEST_STACK_PORTS)
    environ.update(
        {
            "ICEKEEPER__SOURCES__0__TOPICS": f"[{topic}]",
            "ICEKEEPER__TABLES__0__TOPICS": f"[{topic}]",
            "ICEKEEPER__CATALOG__NAME": f"cat_{uuid.uuid4().hex[:8]}",
            "ICEKEEPER__SPARK__MASTER": "local[2]",
            "ICEKEEPER__WRITER__TRIGGER_INTERVAL": "0",
            "ICEKEEPER__BOOKKEEPER__COMMIT_INTERVAL": "0",
            # Tests share a host (and other checkouts' tests): a writer running continuously
            # serves no port unless its test asks for one.
            "ICEKEEPER__WRITER__HTTP_PORT": "0",
        }
    )
    environ.update(extra or {})
    return seed_config(environ)


def register_catalog(spark, config: IcekeeperConfig) -> str:
    """Register the test's catalog in the shared SparkSession; returns its name."""
    from icekeeper.common.spark import iceberg_catalog_conf

    for key, value in iceberg_catalog_conf(config).items():
        spark.conf.set(key, value)
    return config.catalog.name


def commit_all(config: IcekeeperConfig) -> Bookkeeper:
    """A bookkeeper that has run cycles until nothing is
    pending or it committed nothing more (at most five)."""
    bookkeeper = Bookkeeper(config)
    for _ in range(5):
        report = bookkeeper.run_cycle()
        if not report.pending and not report.committed_monikers:
            break
    return bookkeeper


def table_rows(bookkeeper: Bookkeeper, identifier: str) -> list[dict]:
    """Every row of the table, as pyiceberg reads it."""
    return bookkeeper.catalog.load_table(identifier).scan().to_arrow().to_pylist()


def topic_values_with_headers(
    config: IcekeeperConfig, topic: str
) -> list[tuple[bytes, dict[str, str]]]:
    """Every record value of `topic` (up to the end offsets when called), with its headers."""
    consumer = Consumer(
        {
            "bootstrap.servers": config.sources[0].bootstrap_servers,
            "group.id": "dlq-reader",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        ends = sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        )
        found = []
        while len(found) < ends:
            message = consumer.poll(5)
            if message is None:
                break
            if not message.error():
                found.append(
                    (message.value(), {k: v.decode() for k, v in (message.headers() or [])})
                )
        return found
    finally:
        consumer.close()

"""A schema registry that cannot answer pauses the writer; it does not turn the stream into poison.

Against the stack's real Apicurio registry: a URL where nothing listens (connection refused), a
URL of the same server that is not the registry's API (404 for everything), and a registry that
lost the topic's subject. Each time nothing is published, dead-lettered or checkpointed; with the
right URL every record lands exactly once. A single unknown schema id among known ones is still
a dead letter.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from icekeeper.common.config import IcekeeperConfig
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from icekeeper.writers.job import BatchReport, WriterJob
from icekeeper.writers.registry import RegistryUnavailable, registry_outage
from tests.support.pipeline import (
    commit_all,
    pipeline_config,
    table_rows,
    topic_values_with_headers,
)

TABLE = "shop.orders"


def _config(tmp_path: Path, topic: str, registry_url: str | None = None) -> IcekeeperConfig:
    extra = {
        "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": topic + ".dlq",
        "ICEKEEPER__TABLES__0__IDENTIFIER": TABLE,
        "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
        "ICEKEEPER__TABLES__0__MODE": "changelog",
    }
    if registry_url:
        extra["ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_URL"] = registry_url
    return pipeline_config(tmp_path, topic, extra)


def _dead_letters(config: IcekeeperConfig) -> int:
    """Records in the source's dead-letter topic (0 when the topic was never created)."""
    topic = config.sources[0].dead_letter_topic
    consumer = Consumer(
        {
            "bootstrap.servers": config.sources[0].bootstrap_servers,
            "group.id": "dlq-counter",
            "allow.auto.create.topics": False,
        }
    )
    try:
        described = consumer.list_topics(timeout=10).topics.get(topic)
        if described is None:
            return 0
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in described.partitions
        )
    finally:
        consumer.close()


def _produce_framed(config: IcekeeperConfig, topic: str, schema_ids: list[int]) -> None:
    """One record per id, framed as Confluent's serializer
    frames them, with a body that is not Avro."""
    producer = Producer({"bootstrap.servers": config.sources[0].bootstrap_servers})
    for schema_id in schema_ids:
        producer.produce(
            topic, value=b"\x00" + struct.pack(">I", schema_id) + b"not avro", partition=0
        )
    assert producer.flush(10) == 0


def _run_until_paused(config: IcekeeperConfig, spark) -> tuple[WriterJob, BatchReport]:
    """Run a writer until its first pause (or until it finds nothing, which fails the test)."""
    job = WriterJob(config, spark=spark)
    paused: list[BatchReport] = []

    def on_batch(report: BatchReport) -> None:
        if report.paused:
            paused.append(report)
            job.stop.set()

    written = job.run(until_idle=True, on_batch=on_batch)
    assert paused, (
        f"the writer did not pause; it wrote {[(r.records_read, r.dead_lettered) for r in written]}"
    )
    assert not written, "a paused writer wrote nothing"
    return job, paused[0]


def _nothing_moved(job: WriterJob, config: IcekeeperConfig) -> None:
    """What a user checks: no moniker, no dead letter, no checkpoint, no table."""
    assert job.transport.pending() == []
    assert _dead_letters(config) == 0
    assert job.checkpoints.read(config.sources[0]) == {}
    assert not job.catalog.table_exists(TABLE)


@pytest.mark.integration
@pytest.mark.spark
def test_a_registry_that_cannot_answer_pauses_the_writer_and_nothing_is_lost(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    config = _config(tmp_path, unique_topic)
    spec = SyntheticSpec(seed=41, keys=100, events=800, schema_changes=1)
    produced = produce_synthetic(
        config, spec, topic=unique_topic, partitions=3, progress=lambda m: None
    )
    registry = config.sources[0].schema_registry_url

    # Nothing listens there: connection refused, after the client's own retries.
    refused = _config(tmp_path, unique_topic, "http://127.0.0.1:9/apis/ccompat/v7")
    job, report = _run_until_paused(refused, spark)
    assert "did not answer" in report.paused
    _nothing_moved(job, config)

    # The registry's server, but not its API: 404 for every subject and id.
    wrong_path = _config(
        tmp_path, unique_topic, registry.removesuffix("/apis/ccompat/v7") + "/apis/ccompat/v6"
    )
    job, report = _run_until_paused(wrong_path, spark)
    assert "answered 404 for subjects" in report.paused
    _nothing_moved(job, config)

    # The right URL: every record lands, once, and nothing was dead-lettered.
    reports = WriterJob(config, spark=spark).run(until_idle=True)
    assert (
        sum(r.records_read for r in reports) == produced["records"]
        and sum(r.dead_lettered for r in reports) == 0
    )
    rows = table_rows(commit_all(config), TABLE)
    assert len(rows) == spec.events
    assert len({(row["_kfk_partition"], row["_kfk_offset"]) for row in rows}) == spec.events
    assert _dead_letters(config) == 0


@pytest.mark.integration
@pytest.mark.spark
def test_a_registry_that_lost_the_topics_schemas_pauses_the_writer(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    """Records framed with ids the registry answers 404 for, in a topic it has no subject for,
    while it holds other subjects: what a registry restored from an old backup looks like."""
    config = _config(tmp_path, unique_topic)
    registry = SchemaRegistryClient({"url": config.sources[0].schema_registry_url})
    registry.register_schema(
        f"{unique_topic}.other-value",
        Schema('{"type": "record", "name": "r", "fields": []}', "AVRO"),
    )
    _produce_framed(config, unique_topic, [900_000_000 + n % 3 for n in range(30)])

    job, report = _run_until_paused(config, spark)
    assert f"no value subject for {unique_topic}" in report.paused
    _nothing_moved(job, config)


@pytest.mark.integration
@pytest.mark.spark
def test_one_unknown_schema_id_among_known_ones_is_a_dead_letter(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    config = _config(tmp_path, unique_topic)
    spec = SyntheticSpec(seed=43, keys=50, events=300, schema_changes=0)
    produce_synthetic(config, spec, topic=unique_topic, partitions=1, progress=lambda m: None)
    assert (
        sum(r.rows_written for r in WriterJob(config, spark=spark).run(until_idle=True))
        == spec.events
    )
    # Alone in its batch: no id of that batch resolves, yet the registry knows the topic.
    _produce_framed(config, unique_topic, [987_654_321])

    reports = WriterJob(config, spark=spark).run(until_idle=True)
    assert [(r.records_read, r.dead_lettered, r.paused) for r in reports] == [(1, 1, None)]
    dead = topic_values_with_headers(config, config.sources[0].dead_letter_topic)
    assert [(h["icekeeper.reason"], h["icekeeper.source.offset"]) for _, h in dead] == [
        ("unknown-schema-id", str(spec.events))
    ]
    assert len(table_rows(commit_all(config), TABLE)) == spec.events


def test_which_unknown_ids_are_the_registrys_fault() -> None:
    """The decision alone: an unreachable or empty registry, or a topic that lost its subject
    and whose records name no known id, is an outage; anything else is poison."""
    no_known = lambda topics: set()  # noqa: E731
    all_known = lambda topics: set(topics)  # noqa: E731
    assert registry_outage(RegistryUnavailable("refused"), {"t"}, all_known) == "refused"
    assert "holds no subjects" in registry_outage([], {"t"}, all_known)
    assert "no value subject for t" in registry_outage(["other-value"], {"t"}, no_known)
    assert (
        registry_outage(["other-value"], {"t"}, all_known) is None
    )  # known ids beside the unknown one
    assert registry_outage(["t-value"], {"t"}, no_known) is None  # the registry knows the topic

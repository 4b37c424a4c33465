"""Writers, the dead-letter producer, status and the tools against Kafka over SASL_SSL (SCRAM,
a self-signed CA) and a schema registry behind basic auth, as production clusters are set up.

The secured broker and the registry proxy are the local stack's `--with kafka-sasl
registry-auth` (started once per session, only for these tests). Credentials reach icekeeper
only as `${env:...}` references, the way an operator is told to give them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from confluent_kafka import Message

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.config.model import KafkaSource
from icekeeper.common.config.secrets import masked_dump
from icekeeper.common.kafka_clients import KafkaAccessDenied
from icekeeper.localstack.secured import (
    KAFKA_SASL_PASSWORD,
    KAFKA_SASL_USER,
    REGISTRY_AUTH_PASSWORD,
    REGISTRY_AUTH_USER,
    RegistryAuthService,
    SaslKafkaService,
    make_certificates,
)
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.readback import topic_messages
from icekeeper.samples.synthetic import SyntheticSpec
from icekeeper.status import collect_status
from icekeeper.writers.job import BatchReport, WriterJob
from tests.support.pipeline import pipeline_config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def secured_config(
    state_dir: Path,
    topic: str,
    services: tuple[SaslKafkaService, RegistryAuthService],
    sasl_password: str = KAFKA_SASL_PASSWORD,
    ca_location: Path | None = None,
    registry_password: str = REGISTRY_AUTH_PASSWORD,
) -> IcekeeperConfig:
    """A one-table config that reads `topic` from the secured broker through the auth registry."""
    kafka, registry = services
    security = {
        "protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": KAFKA_SASL_USER,
        "sasl_password": "${env:IK_TEST_SASL_PASSWORD}",
        "ssl_ca_location": str(ca_location or kafka.ca_certificate),
    }
    return pipeline_config(
        state_dir,
        topic,
        {
            "ICEKEEPER__SOURCES__0__BOOTSTRAP_SERVERS": kafka.address(),
            "ICEKEEPER__SOURCES__0__SECURITY": json.dumps(security),
            "ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_URL": registry.address(),
            "ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_USERNAME": REGISTRY_AUTH_USER,
            "ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_PASSWORD": "${env:IK_TEST_REGISTRY_PASSWORD}",
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": f"{topic}.dlq",
            "ICEKEEPER__BOOKKEEPER__COMMIT_REPORT_TOPIC": f"{topic}.commits",
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
            "IK_TEST_SASL_PASSWORD": sasl_password,
            "IK_TEST_REGISTRY_PASSWORD": registry_password,
        },
    )


def eventually_read(source: KafkaSource, topic: str, timeout_s: float = 30.0) -> list[Message]:
    """The records of `topic` once it has some (a producer creates it on its first send)."""
    return wait_until(
        lambda: list(topic_messages(source, topic, timeout_s=timeout_s)),
        timeout_s,
        f"records in {topic}",
        interval_s=0.5,
    )


def test_a_writer_batch_runs_end_to_end_over_sasl_ssl_and_a_registry_behind_basic_auth(
    secured_services, spark, tmp_path: Path, unique_topic: str, caplog
) -> None:
    config = secured_config(tmp_path, unique_topic, secured_services)
    source = config.sources[0]
    produced = produce_synthetic(
        config,
        SyntheticSpec(seed=5, keys=40, events=300, schema_changes=1, poison_ratio=0.03),
        topic=unique_topic,
        progress=lambda m: None,
    )
    poison = sum(produced["poison"].values())
    assert poison > 0

    with caplog.at_level(logging.INFO):
        job = WriterJob(config, spark=spark)
        job.run(until_idle=True)
        [moniker] = job.transport.pending()
        assert moniker.records == 300
        # The dead-letter producer (Spark's Kafka sink) reached the secured broker too.
        dead_letters = list(topic_messages(source, source.dead_letter_topic, timeout_s=30))
        assert len(dead_letters) == poison

        bookkeeper = Bookkeeper(config)
        bookkeeper.run_cycle()
        table = bookkeeper.catalog.load_table("shop.orders")
        assert table.scan().to_arrow().num_rows == 300
        # The bookkeeper's commit-report producer too.
        assert (
            json.loads(next(iter(eventually_read(source, f"{unique_topic}.commits"))).value())[
                "records"
            ]
            == 300
        )

        status = collect_status(config)
    assert status.problems == []
    [writer] = status.writers
    assert writer["lag"] == 0 and all(p["end"] is not None for p in writer["partitions"])
    assert status.dead_letters[f"topic {source.dead_letter_topic}"] == poison

    # `config show`, the config's repr and every log line keep both passwords out.
    shown = json.dumps(masked_dump(config)) + repr(config)
    logged = "\n".join(record.getMessage() + repr(record.__dict__) for record in caplog.records)
    for password in (KAFKA_SASL_PASSWORD, REGISTRY_AUTH_PASSWORD):
        assert password not in shown and password not in logged
    assert "**********" in json.dumps(masked_dump(config)["sources"][0]["security"])


@pytest.mark.parametrize(
    ("wrong", "says"),
    [
        ("password", "SASL authentication error"),
        ("ca", "certificate verify failed"),
    ],
)
def test_a_refused_connection_stops_the_writer_with_a_clear_error_and_dead_letters_nothing(
    secured_services, spark, tmp_path: Path, unique_topic: str, wrong: str, says: str
) -> None:
    good = secured_config(tmp_path / "good", unique_topic, secured_services)
    produce_synthetic(
        good,
        SyntheticSpec(seed=6, keys=10, events=50, schema_changes=0, poison_ratio=0.1),
        topic=unique_topic,
        progress=lambda m: None,
    )
    unknown_ca = make_certificates(tmp_path / "other-ca", "127.0.0.1", "unused", "some other CA")
    config = secured_config(
        tmp_path / "writer",
        unique_topic,
        secured_services,
        sasl_password="not-the-password" if wrong == "password" else KAFKA_SASL_PASSWORD,
        ca_location=unknown_ca.ca_certificate if wrong == "ca" else None,
    )

    job = WriterJob(config, spark=spark)
    with pytest.raises(KafkaAccessDenied) as refused:
        job.run(until_idle=True)
    message = str(refused.value)
    assert says in message and "sources[default].security" in message
    assert "not-the-password" not in message
    # Nothing was published, and nothing was taken for poison.
    assert job.transport.pending() == []
    source = good.sources[0]
    assert list(topic_messages(source, source.dead_letter_topic, timeout_s=30)) == []


def test_a_registry_refusing_the_credentials_pauses_the_writer_without_dead_letters(
    secured_services, spark, tmp_path: Path, unique_topic: str
) -> None:
    good = secured_config(tmp_path / "good", unique_topic, secured_services)
    produce_synthetic(
        good,
        SyntheticSpec(seed=7, keys=10, events=50, schema_changes=0),
        topic=unique_topic,
        progress=lambda m: None,
    )
    config = secured_config(
        tmp_path / "writer", unique_topic, secured_services, registry_password="wrong-registry-pw"
    )
    job = WriterJob(config, spark=spark)
    paused: list[str] = []

    def on_batch(report: BatchReport) -> None:
        if report.paused:
            paused.append(report.paused)
            job.stop.set()

    job.run(on_batch=on_batch)
    assert paused and "401" in paused[0]
    assert "wrong-registry-pw" not in paused[0]
    assert job.transport.pending() == []
    source = good.sources[0]
    assert list(topic_messages(source, source.dead_letter_topic, timeout_s=30)) == []

"""What Prometheus and a Kubernetes probe see of a writer running its loop against real Kafka:
per table and partition lag that reaches 0 once the writer caught up with what was produced,
batch figures and records that add up to what was produced, poison counted by reason, and health
that answers while the writer runs and stops answering once it stopped."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from prometheus_client.parser import text_string_to_metric_families

from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from icekeeper.writers.job import BatchReport, WriterJob
from tests.support.http_get import free_port, get
from tests.support.pipeline import pipeline_config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TABLE = "shop.orders"


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """Every sample of `/metrics`: (name, labels) -> value."""
    status, body = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def series(samples: dict[tuple[str, frozenset], float], name: str) -> dict[frozenset, float]:
    return {labels: value for (sample, labels), value in samples.items() if sample == name}


def test_a_running_writer_serves_lag_batches_dead_letters_and_health(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    port = free_port()
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": unique_topic + ".dlq",
            # Several batches to catch up with: lag shows before it reaches 0.
            "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": "160",
            "ICEKEEPER__TABLES__0__IDENTIFIER": TABLE,
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
            "ICEKEEPER__WRITER__HTTP_PORT": str(port),
        },
    )
    source = config.sources[0].name
    spec = SyntheticSpec(seed=29, keys=100, events=300, schema_changes=0, poison_ratio=0.03)
    produced = produce_synthetic(
        config, spec, topic=unique_topic, partitions=3, progress=lambda m: None
    )
    assert all(produced["poison"].values())  # every kind of poison is in the stream

    job = WriterJob(config, spark=spark)
    reports: list[BatchReport] = []
    runner = threading.Thread(target=job.run, kwargs={"on_batch": reports.append})
    runner.start()
    lags: list[float] = []
    try:
        wait_until(lambda: get(f"http://127.0.0.1:{port}/healthz")[0] == 200, 60, "/healthz")

        def caught_up() -> dict | None:
            """A scrape once the writer read every record produced and its lag is 0 on every
            partition (and the batch that read the last ones has been reported)."""
            samples = scrape(port)
            lag = series(samples, "icekeeper_writer_lag_records")
            lags.append(sum(lag.values()))
            read = samples.get(
                ("icekeeper_writer_records_read_total", frozenset({("source", source)}))
            )
            done = (
                len(lag) == 3
                and sum(lag.values()) == 0
                and read == produced["records"]
                # Records count once published, the batch once it ended: wait for both.
                and samples[("icekeeper_writer_batch_records_sum", frozenset())] == read
                and samples[("icekeeper_writer_batch_records_count", frozenset())] == len(reports)
            )
            return samples if done else None

        samples = wait_until(caught_up, 300, "the writer to catch up", interval_s=0.05)
        live_status, live = get(f"http://127.0.0.1:{port}/healthz")
        ready_status, ready = get(f"http://127.0.0.1:{port}/readyz")
    finally:
        job.stop.set()
        runner.join(timeout=120)
    assert not runner.is_alive()

    # Lag: one series per partition of the table, seen above 0 while the writer caught up.
    lag = series(samples, "icekeeper_writer_lag_records")
    assert {dict(labels)["partition"] for labels in lag} == {"0", "1", "2"}
    assert all(dict(labels)["table"] == TABLE for labels in lag)
    assert 0 < max(lags) <= produced["records"]
    ends = series(samples, "icekeeper_writer_partition_end_offset")
    assert sum(ends.values()) == produced["records"]

    # Batches: as many as the loop reported, holding every record produced.
    assert len(reports) >= 2
    assert samples[("icekeeper_writer_batch_records_sum", frozenset())] == produced["records"]
    assert samples[("icekeeper_writer_batch_duration_seconds_count", frozenset())] == len(reports)
    assert samples[("icekeeper_writer_batch_duration_seconds_sum", frozenset())] == pytest.approx(
        sum(report.seconds for report in reports), rel=1e-6
    )
    assert samples[("icekeeper_writer_batches_total", frozenset({("outcome", "written")}))] == len(
        reports
    )
    assert samples[("icekeeper_writer_batches_total", frozenset({("outcome", "failed")}))] == 0

    # Records: every good event became a row of the table; the poison went to dead letters.
    written = series(samples, "icekeeper_writer_records_written_total")
    assert written == {frozenset({("table", TABLE)}): spec.events}
    dead = {
        dict(labels)["reason"]: value
        for labels, value in series(samples, "icekeeper_writer_dead_letters_total").items()
        if dict(labels)["source"] == source
    }
    assert dead == {
        "bad-magic-byte": produced["poison"]["bad-magic-byte"],
        "unknown-schema-id": produced["poison"]["unknown-schema-id"],
        "undecodable-avro": produced["poison"]["truncated-avro"],
    }
    errors = series(samples, "icekeeper_writer_kafka_read_errors_total")
    assert errors and not any(errors.values())

    # Health while it ran; nothing listens once it stopped.
    assert live_status == 200 and json.loads(live)["state"] in ("writing", "waiting")
    assert ready_status == 200 and json.loads(ready)["last_batch"] in ("written", "idle")
    assert get(f"http://127.0.0.1:{port}/healthz")[0] == 0


def test_a_broker_that_does_not_answer_counts_as_a_failed_read_from_kafka(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    """The batch fails (the loop retries it) and `offsets` counts it: what an alert on
    `icekeeper_writer_kafka_read_errors_total` sees of a broker down."""
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {"ICEKEEPER__SOURCES__0__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"},
    )
    job = WriterJob(config, spark=spark)
    with pytest.raises(KafkaException):
        job.run_batch()

    def errors(stage: str) -> float | None:
        return job.metrics.registry.get_sample_value(
            "icekeeper_writer_kafka_read_errors_total",
            {"source": config.sources[0].name, "stage": stage},
        )

    assert (errors("offsets"), errors("records")) == (1, 0)

"""What an operator's dashboard and probes see of a writer's loop in the cases that used to lie
(an adversarial review of the writer metrics, issue 29): lag while the writer is throttled by the
bookkeeper's backlog, a topic that vanishes mid-run, a batch longer than the liveness grace, and
a batch that fails after publishing (tests/writers/test_writer_checkpoint_retry.py). Each runs the
writer's own loop against the stack's Kafka."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from icekeeper.writers import job as job_module
from icekeeper.writers.job import BatchReport, WriterJob
from tests.support.http_get import free_port, get
from tests.support.pipeline import pipeline_config
from tests.support.waiting import wait_until
from tests.writers.test_writer_metrics import scrape, series

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def quiet(_: str) -> None:
    pass


def writer_config(tmp_path: Path, topic: str, extra: dict[str, str]):
    """The test stack's pipeline config for the synthetic stream's table (keyed by `id`)."""
    return pipeline_config(
        tmp_path,
        topic,
        {
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
            **extra,
        },
    )


def produce(config, topic: str, events: int, seed: int, poison: float = 0.0) -> dict:
    spec = SyntheticSpec(seed=seed, keys=50, events=events, schema_changes=0, poison_ratio=poison)
    return produce_synthetic(config, spec, topic=topic, partitions=3, progress=quiet)


def value(port: int, name: str, **labels: str) -> float:
    return scrape(port).get((name, frozenset(labels.items())), 0.0)


class Running:
    """The writer's continuous loop in a thread, stopped at the end of the `with`."""

    def __init__(self, job: WriterJob) -> None:
        self.job = job
        self.reports: list[BatchReport] = []
        self.thread = threading.Thread(target=job.run, kwargs={"on_batch": self.reports.append})

    def __enter__(self) -> Running:
        self.thread.start()
        port = self.job.config.writer.http_port
        if port:  # its endpoints are served from the loop's start
            wait_until(lambda: get(f"http://127.0.0.1:{port}/healthz")[0] != 0, 60, "/healthz")
        return self

    def __exit__(self, *_: object) -> None:
        self.job.stop.set()
        self.thread.join(timeout=120)
        assert not self.thread.is_alive()


def test_lag_grows_with_kafka_while_the_writer_is_throttled(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    """The bookkeeper is down, so the writer's monikers stay pending and it stops reading
    (`writer.max_pending_bytes`): its lag must show the records produced meanwhile (it stayed at
    the last batch's 0, so an alert on lag never fired during a bookkeeper outage)."""
    port = free_port()
    config = writer_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__WRITER__HTTP_PORT": str(port),
            "ICEKEEPER__WRITER__MAX_PENDING_BYTES": "1",  # one pending moniker throttles
            "ICEKEEPER__WRITER__TRIGGER_INTERVAL": "0.2",
        },
    )
    first = produce(config, unique_topic, 120, seed=1)["records"]
    with Running(WriterJob(config, spark=spark)):
        wait_until(
            lambda: value(port, "icekeeper_writer_batches_total", outcome="throttled") >= 1,
            120,
            "a throttled batch",
        )
        assert sum(series(scrape(port), "icekeeper_writer_lag_records").values()) == 0
        later = produce(config, unique_topic, 80, seed=2)["records"]
        lag = wait_until(
            lambda: (
                total
                if (total := sum(series(scrape(port), "icekeeper_writer_lag_records").values()))
                == later
                else None
            ),
            60,
            f"lag to show the {later} records produced while throttled",
        )
        samples = scrape(port)
    assert lag == later
    source = config.sources[0].name
    read = samples[("icekeeper_writer_records_read_total", frozenset({("source", source)}))]
    assert read == first  # throttled: nothing more was read
    ends = series(samples, "icekeeper_writer_partition_end_offset")
    assert sum(ends.values()) == first + later


def test_a_topic_that_vanishes_is_an_error_and_its_figures_go(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    """One source of three topics: one is not created yet (Debezium creates a table's topic with
    its first change: a warning, the writer is ready), one is deleted mid-run (as if deleted, or
    its ACL lost: Kafka lists neither). The deleted one counts as a failed read from Kafka each
    batch, its lag and end offsets go, /readyz names it, and the other topic is still written."""
    kept, doomed, later = unique_topic, unique_topic + ".b", unique_topic + ".not-yet"
    port = free_port()
    config = writer_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__TOPICS": f"[{kept}, {doomed}, {later}]",
            "ICEKEEPER__TABLES__0__TOPICS": f"[{kept}, {doomed}, {later}]",
            "ICEKEEPER__WRITER__HTTP_PORT": str(port),
            "ICEKEEPER__WRITER__TRIGGER_INTERVAL": "0.2",
        },
    )
    source = config.sources[0].name
    produced = produce(config, kept, 60, seed=3)["records"]
    produced += produce(config, doomed, 60, seed=4)["records"]

    def topics_of(name: str) -> set[str]:
        return {dict(labels)["topic"] for labels in series(scrape(port), name)}

    def read() -> float:
        return value(port, "icekeeper_writer_records_read_total", source=source)

    def offsets_errors() -> float:
        return value(
            port, "icekeeper_writer_kafka_read_errors_total", source=source, stage="offsets"
        )

    with Running(WriterJob(config, spark=spark)):
        wait_until(lambda: read() == produced, 120, "the writer to read both topics")
        wait_until(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 30, "/readyz")
        assert topics_of("icekeeper_writer_lag_records") == {kept, doomed}
        assert offsets_errors() == 0  # a topic not created yet is no failed read

        admin = AdminClient({"bootstrap.servers": config.sources[0].bootstrap_servers})
        admin.delete_topics([doomed])[doomed].result()

        def unready_for_the_deleted_topic() -> bool:
            status, body = get(f"http://127.0.0.1:{port}/readyz")
            return status == 503 and doomed in json.loads(body)["reason"]

        # A batch may first fail on the deletion (its end offsets asked mid-way): then it counts.
        wait_until(unready_for_the_deleted_topic, 60, "/readyz to name the vanished topic")
        assert offsets_errors() >= 1
        wait_until(
            lambda: (
                topics_of("icekeeper_writer_lag_records") == {kept}
                and topics_of("icekeeper_writer_partition_end_offset") == {kept}
            ),
            30,
            "the vanished topic's series to go",
        )

        more = produce(config, kept, 30, seed=5)["records"]
        wait_until(lambda: read() == produced + more, 120, "the kept topic to be read on")
        errors_before = offsets_errors()
        wait_until(lambda: offsets_errors() > errors_before, 30, "an error each batch")


def test_a_batch_longer_than_the_grace_is_alive_while_its_planned_records_take(
    local_stack, spark, tmp_path: Path, unique_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/healthz gave a writer a fixed grace: the first batch over a large backlog
    (`max_offsets_per_trigger: null`) that takes longer was restarted by its probe half way, and
    read again, for ever. The grace now grows with the batch's planned records, and a loop that
    is stuck on a small batch is still seen. (Scaled down: a 1 s base grace, 20 records/s.)"""
    monkeypatch.setattr(job_module, "LIVENESS_GRACE_S", 1.0)
    monkeypatch.setattr(job_module, "_MAX_RETRY_WAIT_S", 0.0)
    monkeypatch.setattr(job_module, "SLOWEST_RECORDS_PER_S", 20.0)
    port = free_port()
    config = writer_config(
        tmp_path,
        unique_topic,
        {"ICEKEEPER__WRITER__HTTP_PORT": str(port), "ICEKEEPER__WRITER__TRIGGER_INTERVAL": "0"},
    )
    big = produce(config, unique_topic, 200, seed=6)["records"]  # 10 s at 20 records/s
    job = WriterJob(config, spark=spark)
    seen: list[tuple[int, float]] = []
    write: Callable = job.batches.write

    def slow_write(*args, **kwargs):
        """A batch that shows no life for 2.5 s, asked for its health half way."""
        time.sleep(2.5)
        status, body = get(f"http://127.0.0.1:{port}/healthz")
        seen.append((status, json.loads(body)["planned_records"]))
        return write(*args, **kwargs)

    job.batches.write = slow_write
    with Running(job) as running:
        wait_until(lambda: len(running.reports) == 1, 120, "the big batch")
        small = produce(config, unique_topic, 5, seed=7)["records"]  # 0.25 s at 20 records/s
        # The producer may hand its few records over in two requests, read by two batches.
        wait_until(
            lambda: sum(r.records_read for r in running.reports) == big + small,
            120,
            "the small batch",
        )
    assert seen[0] == (200, big)
    assert [status for status, _ in seen[1:]] == [503] * (len(seen) - 1)
    assert sum(planned for _, planned in seen[1:]) == small

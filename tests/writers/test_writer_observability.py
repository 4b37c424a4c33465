"""The writer's metrics without services: lag per table and partition from Kafka's end offsets
and the tables' positions, and which failed batches count as failed reads from Kafka."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from icekeeper.writers.arrow_engine.kafka_read import KafkaReadError
from icekeeper.writers.observability import WriterMetrics, kafka_read_error


def lag_of(metrics: WriterMetrics) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["table"], s.labels["topic"], s.labels["partition"]): s.value
        for family in metrics.registry.collect()
        if family.name == "icekeeper_writer_lag_records"
        for s in family.samples
    }


def test_lag_is_the_end_offset_minus_each_tables_position_and_drops_partitions_not_read() -> None:
    metrics = WriterMetrics()
    metrics.show_lag(
        "src",
        {("t", 0): 100, ("t", 1): 40},
        {"a.x": {("t", 0): 60, ("t", 1): 40}, "a.y": {("t", 0): 100}},
    )
    # A table that never saw a partition (absent) has nothing to read there yet.
    assert lag_of(metrics) == {
        ("a.x", "t", "0"): 40,
        ("a.x", "t", "1"): 0,
        ("a.y", "t", "0"): 0,
        ("a.y", "t", "1"): 0,
    }
    # This writer reads partition 1 no more (instance_count changed): its series go; a position
    # beyond the end (a recreated topic, until the writer stops on it) is no negative lag.
    metrics.show_lag("src", {("t", 0): 100}, {"a.x": {("t", 0): 120}, "a.y": {("t", 0): 90}})
    assert lag_of(metrics) == {("a.x", "t", "0"): 0, ("a.y", "t", "0"): 10}
    end = metrics.registry.get_sample_value(
        "icekeeper_writer_partition_end_offset", {"topic": "t", "partition": "0"}
    )
    assert end == 100


def test_a_table_shows_lag_only_on_the_topics_it_is_routed_from() -> None:
    """One source, one table per topic (seed 000's list of Debezium topics): each table's lag is
    on its own topic only (found by a review: every table had a series on every partition of
    every topic, 120,000 series for 200 tables of 3 partitions, each lagging where any did)."""
    metrics = WriterMetrics()
    ends = {("db.t1", 0): 100, ("db.t2", 0): 50}
    positions = {"a.t1": dict(ends), "a.t2": {("db.t1", 0): 100, ("db.t2", 0): 20}}
    metrics.show_lag("src", ends, positions, {"a.t1": {"db.t1"}, "a.t2": {"db.t2"}})
    assert lag_of(metrics) == {("a.t1", "db.t1", "0"): 0, ("a.t2", "db.t2", "0"): 30}


def test_failed_reads_from_kafka_are_told_from_other_failures() -> None:
    assert kafka_read_error(KafkaReadError("no records from t:0 in 30.0 s"))
    assert kafka_read_error(KafkaException(KafkaError(KafkaError._TRANSPORT)))
    # Through Spark: a task's Java error arrives as text, wrapped.
    java = RuntimeError(
        "An error occurred while calling o123.collectToPython.\n: org.apache.spark.SparkException:"
        " Job aborted ... org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms"
    )
    assert kafka_read_error(java)
    try:
        try:
            raise KafkaReadError("reading t:0: Broker: Unknown topic or partition")
        except KafkaReadError as error:
            raise RuntimeError("task failed") from error
    except RuntimeError as wrapped:
        assert kafka_read_error(wrapped)
    assert not kafka_read_error(ValueError("column qty: cannot cast"))
    assert not kafka_read_error(RuntimeError("catalog unavailable"))


def test_a_taken_port_is_one_line_naming_the_key(tmp_path) -> None:
    """A second writer on a host with the first's port: a one-line usage error naming
    `writer.http_port` (it was a traceback of `Address already in use`, exit 1)."""
    import socket

    import pytest

    from icekeeper.common.exit_codes import UsageError
    from icekeeper.writers.job import WriterJob
    from tests.support.shop_items import bookkeeper_config

    taken = socket.create_server(("127.0.0.1", 0))
    try:
        port = taken.getsockname()[1]
        job = WriterJob.__new__(WriterJob)  # no Spark: the port is bound before any batch
        job.config, job.metrics = bookkeeper_config(tmp_path), WriterMetrics()
        with pytest.raises(UsageError, match=f"writer.http_port {port} on 127.0.0.1 is taken"):
            job.serve_http(port)
    finally:
        taken.close()


def test_a_topic_leaving_a_pattern_is_no_error_but_a_named_one_is() -> None:
    """Under `topic_pattern` topics come and go: one no longer listed leaves the source quietly;
    a topic named in `topics` that vanishes (deleted, or its ACL lost) counts as a failed read
    and makes the writer unready until it is back (review of issue 29, F3)."""
    from types import SimpleNamespace

    from icekeeper.writers.job import WriterJob

    def job() -> WriterJob:
        writer = WriterJob.__new__(WriterJob)  # no Spark or Kafka: the topics' bookkeeping only
        writer.metrics, writer.writer_id = WriterMetrics(), "w"
        writer._seen_topics, writer._lost_topics, writer._absent_warned = {}, {}, set()
        return writer

    def errors(writer: WriterJob) -> float | None:
        return writer.metrics.registry.get_sample_value(
            "icekeeper_writer_kafka_read_errors_total", {"source": "s", "stage": "offsets"}
        )

    pattern = SimpleNamespace(name="s", topic_pattern="db\\..*", topics=[])
    by_pattern = job()
    by_pattern._note_topics(pattern, {"db.a", "db.b"}, {})
    by_pattern._note_topics(pattern, {"db.a"}, {})
    assert errors(by_pattern) is None and by_pattern._lost_topics == {"s": {}}

    named = SimpleNamespace(name="s", topic_pattern=None, topics=["db.a", "db.b", "db.c"])
    by_name = job()
    by_name._note_topics(named, {"db.a", "db.b"}, {"db.c": "not listed"})
    assert errors(by_name) is None  # db.c: not created yet
    by_name._note_topics(named, {"db.a"}, {"db.b": "not listed", "db.c": "not listed"})
    assert errors(by_name) == 1 and set(by_name._lost_topics["s"]) == {"db.b"}
    by_name._note_topics(named, {"db.a", "db.b"}, {"db.c": "not listed"})
    assert by_name._lost_topics["s"] == {}

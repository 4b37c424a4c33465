"""What operators see of a running bookkeeper: metrics, health, and commit reports."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.committed_state import committed_state
from icekeeper.common.transports import open_transport
from tests.support.shop_items import bookkeeper_config, make_moniker


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_metrics_health_and_commit_reports(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    port = bookkeeper.serve_http(port=0)
    try:
        assert bookkeeper.take_lease(timeout_s=2) == 1
        status, body = get(f"http://127.0.0.1:{port}/healthz")  # alive
        assert status == 200 and json.loads(body)["lease"] is True
        status, body = get(f"http://127.0.0.1:{port}/readyz")  # not ready before a cycle
        assert status == 503 and json.loads(body)["reason"] == "no cycle finished yet"
        transport.publish(make_moniker(config, 1, None, (0, 10)))
        transport.publish(make_moniker(config, 3, 2, (20, 30)))  # waits for seq 2
        bookkeeper.run_cycle()
        for endpoint in ("healthz", "readyz"):
            status, body = get(f"http://127.0.0.1:{port}/{endpoint}")
            assert status == 200 and json.loads(body)["ok"] is True, (endpoint, body)
        status, metrics = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert 'icekeeper_commits_total{table="shop.items"} 1.0' in metrics
        assert 'icekeeper_records_committed_total{table="shop.items"} 10.0' in metrics
        assert 'icekeeper_pending_monikers{table="shop.items"} 1.0' in metrics
        assert 'icekeeper_commit_latency_seconds_count{table="shop.items"} 1.0' in metrics
        assert (
            "icekeeper_freshness_lag_seconds" in metrics
            and "icekeeper_last_commit_age_seconds" in metrics
        )
    finally:
        bookkeeper.http.stop()
    [line] = Path(config.bookkeeper.commit_report_path).read_text().splitlines()
    report = json.loads(line)
    assert report["table"] == "shop.items" and report["records"] == 10 and report["files"] == 1
    assert (
        report["watermark_ms"] == 1_700_000_000_010
        and report["latency_ms"] > 0
        and report["snapshot_id"]
    )


def test_sigterm_like_stop_finishes_the_cycle_and_releases_the_lease(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path)
    open_transport(config).publish(make_moniker(config, 1, None, (0, 10)))
    bookkeeper = Bookkeeper(config)
    cycles = []
    thread = threading.Thread(
        target=bookkeeper.run,
        kwargs={"on_cycle": lambda r: (cycles.append(r), bookkeeper.stop.set())},
    )
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive() and cycles[0].committed_monikers == 1
    successor = Bookkeeper(config)
    assert successor.take_lease(timeout_s=2) == 2  # released on stop: no TTL wait


@pytest.mark.integration
def test_commit_reports_also_go_to_a_kafka_topic(local_stack, stack_config, tmp_path: Path) -> None:
    topic = f"commits.{uuid.uuid4().hex[:8]}"
    config = bookkeeper_config(
        tmp_path,
        bookkeeper__commit_report_topic=topic,
        sources__0__bootstrap_servers=stack_config.sources[0].bootstrap_servers,
    )
    open_transport(config).publish(make_moniker(config, 1, None, (0, 10)))
    Bookkeeper(config).run_cycle()
    consumer = Consumer(
        {
            "bootstrap.servers": config.sources[0].bootstrap_servers,
            "group.id": "reports",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign(
        [TopicPartition(topic, p, 0) for p in range(3)]
    )  # auto-created with the broker default of 3
    message = None
    for _ in range(20):
        message = consumer.poll(1)
        if message is not None and not message.error():
            break
    consumer.close()
    assert (
        message is not None
        and json.loads(message.value())["records"] == 10
        and message.key() == b"shop.items"
    )


def test_writers_wait_while_pending_work_is_over_the_bound(tmp_path: Path) -> None:
    """Backpressure: a writer reads nothing while monikers over `max_pending_bytes` wait."""
    from icekeeper.writers.job import WriterJob
    from icekeeper.writers.observability import WriterMetrics

    config = bookkeeper_config(tmp_path, writer__max_pending_bytes="1")
    open_transport(config).publish(make_moniker(config, 1, None, (0, 10)))
    job = WriterJob.__new__(WriterJob)  # no Spark needed: the check happens before any read
    job.config, job.writer_id, job.transport, job.tables, job.seq = (
        config,
        "w9",
        open_transport(config),
        {},
        None,
    )
    job.catalog = Bookkeeper(config).catalog
    job.templated = {}
    job.metrics = WriterMetrics()
    # No Kafka here: the throttled writer's look at the end offsets (for its lag) fails, logged.
    job.admins, job._throttled_look_failed_at = {}, {}
    report = job.run_batch()
    assert report.throttled and report.records_read == 0 and job.pending_bytes > 1


def test_empty_cycles_make_no_snapshot_unless_heartbeats_are_asked_for(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path)
    open_transport(config).publish(make_moniker(config, 1, None, (0, 10)))
    quiet = Bookkeeper(config)
    quiet.run_cycle()
    for _ in range(3):
        quiet.run_cycle()
    assert len(quiet.catalog.load_table("shop.items").snapshots()) == 1
    beating = Bookkeeper(bookkeeper_config(tmp_path, bookkeeper__heartbeat_every_empty_cycles="2"))
    for _ in range(4):
        beating.run_cycle()
    table = beating.catalog.load_table("shop.items")
    assert len(table.snapshots()) == 3
    summaries = [s.summary.additional_properties for s in table.snapshots()]
    assert len({s["icekeeper.commit-id"] for s in summaries}) == 3
    assert committed_state(table).offsets == {("items", 0): 10}


def test_a_release_that_fails_does_not_stop_the_cycle(tmp_path: Path) -> None:
    """Releasing waiting monikers only hurries them (a queue's visibility timeout brings them
    back): a release the transport refuses (throttling, a SAS without the update permission) is
    counted, and the cycle goes on with its other work."""
    config = bookkeeper_config(tmp_path, bookkeeper__max_files_per_commit="1")
    transport = open_transport(config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    transport.publish(make_moniker(config, 2, 1, (10, 20)))
    bookkeeper = Bookkeeper(config)

    def refuse(deliveries):
        raise PermissionError("this SAS cannot update messages")

    bookkeeper.transport.release = refuse
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 1 and report.pending == 1
    assert (
        bookkeeper.metrics.registry.get_sample_value(
            "icekeeper_errors_total", {"kind": "release-failed"}
        )
        == 1
    )
    assert bookkeeper.run_cycle().committed_monikers == 1


def test_a_long_step_is_not_a_stuck_loop(tmp_path: Path) -> None:
    """`/healthz` must not call a bookkeeper stuck in the middle of one long step (a key index
    rebuilt): the probe's restart would make its successor start the step over, for ever."""
    import time

    from icekeeper.bookkeeper.service import LIVENESS_GRACE_S

    bookkeeper = Bookkeeper(bookkeeper_config(tmp_path))
    bookkeeper.state = "active"
    bookkeeper._alive_at = time.monotonic() - 120  # a 2-minute step, 10 x 0.2 s + 30 s allowed
    assert bookkeeper.liveness()[0]
    bookkeeper._alive_at = time.monotonic() - LIVENESS_GRACE_S - 1
    assert not bookkeeper.liveness()[0]


@pytest.mark.integration
def test_waiting_monikers_are_released_a_writer_at_a_time(
    local_stack, tmp_path: Path, monkeypatch
) -> None:
    """On a queue, a moniker that waits is invisible for the visibility timeout unless the cycle
    releases it, and a cycle releases at most `RELEASED_PER_CYCLE`. Writer `a`'s chain waits for a
    predecessor still on its way (`RELEASED_PER_CYCLE` + 20 monikers, sorted first); writers `b`
    and `c` have three each, under a budget of two files a commit. Released in turn, `b`'s and
    `c`'s come back the next cycle and commit in seconds; released in `a`'s order first, they
    would be hidden for the visibility timeout (10 minutes here)."""
    import time

    from icekeeper.bookkeeper import service
    from tests.support.shop_items import azure_queue_settings

    # The cap made small, so that the backlog over it is quick to publish.
    monkeypatch.setattr(service, "RELEASED_PER_CYCLE", 40)

    config = bookkeeper_config(
        tmp_path,
        bookkeeper__max_files_per_commit="2",
        transport__visibility_timeout="600s",
        transport__journal_uri=str(tmp_path / "journal"),
        **azure_queue_settings(local_stack),
    )
    transport = open_transport(config)
    backlog = service.RELEASED_PER_CYCLE + 20
    # `a`'s seq 1 never arrives in this test: every later one waits on it.
    for seq in range(2, backlog + 2):
        transport.publish(make_moniker(config, seq, seq - 1, (seq * 10, seq * 10 + 1), "a", 0))
    for partition, writer in ((1, "b"), (2, "c")):
        for seq in range(1, 4):
            transport.publish(
                make_moniker(config, seq, seq - 1 or None, (seq, seq + 1), writer, partition)
            )
    bookkeeper = Bookkeeper(config)
    started = time.monotonic()
    committed = 0
    for _ in range(6):
        report = bookkeeper.run_cycle()
        committed += report.committed_monikers
        if committed == 6:
            break
    assert committed == 6, f"b's and c's monikers committed: {committed} of 6"
    assert time.monotonic() - started < 300

    seqs = committed_state(bookkeeper.catalog.load_table("shop.items")).writer_seqs
    assert (seqs.get("b"), seqs.get("c"), seqs.get("a")) == (3, 3, None)


@pytest.mark.integration
def test_a_cycle_releases_at_most_its_budget_across_tables_and_starves_none(
    local_stack, tmp_path: Path, monkeypatch
) -> None:
    """`RELEASED_PER_CYCLE` holds per cycle, all tables together (one queue call per release),
    and no table is starved: four tables each have a chain waiting on a predecessor still on its
    way, under a budget of three releases a cycle. The tables left out are received again after
    the visibility timeout and then go first, so within a few timeouts every table's waiting
    monikers were released; then the predecessors arrive and every table commits."""
    import time

    from icekeeper.bookkeeper import service
    from tests.support.shop_items import azure_queue_settings

    monkeypatch.setattr(service, "RELEASED_PER_CYCLE", 3)
    tables = [f"shop.t{index}" for index in range(4)]
    config = bookkeeper_config(
        tmp_path,
        tables="["
        + ", ".join(
            f"{{identifier: {table}, topics: [items], primary_key: [id], mode: changelog}}"
            for table in tables
        )
        + "]",
        transport__visibility_timeout="3s",
        transport__journal_uri=str(tmp_path / "journal"),
        **azure_queue_settings(local_stack),
    )
    transport = open_transport(config)
    # Each table's seq 1 is on its way: seqs 2 and 3 wait for it.
    for table in tables:
        for seq in (2, 3):
            transport.publish(
                make_moniker(config, seq, seq - 1, (seq * 10, seq * 10 + 5), table=table)
            )
    bookkeeper = Bookkeeper(config)
    calls: list[str] = []
    update_message = bookkeeper.transport.queue.update_message

    def counted(*args, **kwargs):
        calls.append(args[0] if args else kwargs.get("message"))
        return update_message(*args, **kwargs)

    monkeypatch.setattr(bookkeeper.transport.queue, "update_message", counted)
    released_tables: set[str] = set()
    release = bookkeeper.transport.release

    def noted(deliveries):
        released_tables.update(d.moniker.table for d in deliveries)
        release(deliveries)

    monkeypatch.setattr(bookkeeper.transport, "release", noted)
    per_cycle = []
    deadline = time.monotonic() + 20  # more than three visibility timeouts
    while time.monotonic() < deadline:
        calls.clear()
        report = bookkeeper.run_cycle()
        assert report.committed_monikers == 0
        per_cycle.append(len(calls))
        time.sleep(0.2)
    assert max(per_cycle) <= 3, f"queue releases per cycle: {per_cycle}"
    assert released_tables == set(tables), f"tables ever released: {sorted(released_tables)}"
    for table in tables:
        transport.publish(make_moniker(config, 1, None, (10, 15), table=table))
    committed, deadline = 0, time.monotonic() + 30
    while committed < 12 and time.monotonic() < deadline:
        committed += bookkeeper.run_cycle().committed_monikers
        time.sleep(0.2)
    assert committed == 12, f"{committed} of 12 monikers committed"

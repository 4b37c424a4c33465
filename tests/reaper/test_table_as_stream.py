"""Seed 001's point: an Iceberg table as an alternative to a Kafka topic. A Spark Structured
Streaming reader follows the table while the bookkeeper appends and the reaper compacts and
expires, and sees every committed record exactly once."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.catalog import open_catalog
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.transports import MonikerTransport, open_transport
from icekeeper.reaper.service import Reaper
from tests.support.pipeline import register_catalog
from tests.support.shop_items import bookkeeper_config, make_moniker, reaper_config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def table_with_a_first_commit(
    spark, config: IcekeeperConfig
) -> tuple[MonikerTransport, Bookkeeper, str, int]:
    """`shop.items` with one committed moniker (offsets 0..5): the transport and bookkeeper that
    commit it, the table's Spark catalog name, and a time just before its first snapshot."""
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    transport.publish(make_moniker(config, 1, None, (0, 5)))
    bookkeeper.run_cycle()
    catalog_name = register_catalog(spark, config)
    return (
        transport,
        bookkeeper,
        catalog_name,
        open_catalog(config).load_table("shop.items").current_snapshot().timestamp_ms - 1,
    )


def test_a_streaming_reader_sees_every_committed_record_once(spark, tmp_path: Path) -> None:
    # The reader must stay within the retained history: expiry keeps the newest 20 snapshots and
    # the reader polls every second while the bookkeeper commits a few times a second.
    config = reaper_config(tmp_path, reaper__retain_last="20")
    transport, bookkeeper, catalog_name, start_ms = table_with_a_first_commit(spark, config)
    query_name = f"stream_{uuid.uuid4().hex[:8]}"
    stream = (
        spark.readStream.format("iceberg")
        .option("stream-from-timestamp", str(start_ms))
        .load(f"{catalog_name}.shop.items")
        .select("_kfk_partition", "_kfk_offset")
    )
    query = (
        stream.writeStream.format("memory")
        .queryName(query_name)
        .trigger(processingTime="1 second")
        .start()
    )

    monikers = 40
    done = threading.Event()

    def keep_committing() -> None:
        for seq in range(2, monikers + 1):
            transport.publish(make_moniker(config, seq, seq - 1, ((seq - 1) * 5, seq * 5)))
            bookkeeper.run_cycle()
            time.sleep(0.2)  # pacing: a few commits a second, as the comment at the top says
        done.set()

    committer = threading.Thread(target=keep_committing)
    committer.start()
    try:
        # The stream has read small files the reaper will compact (it rewrites five or more).
        wait_until(
            lambda: spark.sql(f"SELECT count(*) FROM {query_name}").first()[0] >= 50,
            120,
            "the stream to read ten monikers",
            interval_s=0.2,
        )
        report = Reaper(config, spark=spark).run_pass()  # compacts and expires while both run
        committer.join(timeout=300)
        assert done.is_set()
        query.processAllAvailable()
        seen = Counter(
            tuple(row)
            for row in spark.sql(f"SELECT _kfk_partition, _kfk_offset FROM {query_name}").collect()
        )
    finally:
        query.stop()
    assert report.tables[0].files_compacted > 0, (
        "the reaper rewrote files the stream had already read"
    )
    table = open_catalog(config).load_table("shop.items")
    committed = Counter(
        zip(
            *(
                table.scan().to_arrow().column(c).to_pylist()
                for c in ("_kfk_partition", "_kfk_offset")
            )
        )
    )
    assert sum(committed.values()) == monikers * 5
    assert seen == committed and max(seen.values()) == 1


def test_a_streaming_reader_ten_minutes_behind_reads_every_later_row_once(
    spark, tmp_path: Path
) -> None:
    """At default settings (an hour of snapshots kept), a reader stopped for ten minutes resumes
    from its checkpoint and reads every row committed since, once. The ten minutes pass on the
    bookkeeper's clock, five seconds a commit (120 snapshots: six times what count-only
    expiry kept, and few enough for a quick test)."""
    config = bookkeeper_config(tmp_path, catalog__name=f"cat_{uuid.uuid4().hex[:8]}")
    assert config.bookkeeper.keep_snapshots_for == 3600 and config.bookkeeper.keep_snapshots == 20
    transport, bookkeeper, catalog_name, start_ms = table_with_a_first_commit(spark, config)
    output, checkpoint = tmp_path / "stream-out", tmp_path / "stream-checkpoint"

    def read_what_is_there() -> None:
        query = (
            spark.readStream.format("iceberg")
            .option("stream-from-timestamp", str(start_ms))
            .load(f"{catalog_name}.shop.items")
            .select("_kfk_partition", "_kfk_offset")
            .writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="1 second")
            .start()
        )
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    read_what_is_there()
    assert spark.read.parquet(str(output)).count() == 5
    commits, step_ms = 120, 5000
    for seq in range(2, commits + 2):
        commit_path = bookkeeper.committer.commit_path
        commit_path.now_ms = lambda seq=seq: int(time.time() * 1000) + (seq - 1) * step_ms
        transport.publish(make_moniker(config, seq, seq - 1, ((seq - 1) * 5, seq * 5)))
        assert bookkeeper.run_cycle().committed_monikers == 1
    table = open_catalog(config).load_table("shop.items")
    reader_at = table.snapshots()[0]
    assert (
        bookkeeper.committer.commit_path.now_ms() - reader_at.timestamp_ms >= 600_000
    )  # the reader's snapshot is ten minutes old
    # Count-only expiry (the newest 20) failed here: "Cannot load current offset at snapshot
    # <id>, the snapshot was expired or removed".
    read_what_is_there()
    assert len(table.snapshots()) == commits + 1  # nothing younger than an hour expired
    seen = Counter(tuple(row) for row in spark.read.parquet(str(output)).collect())
    assert sum(seen.values()) == (commits + 1) * 5 and max(seen.values()) == 1
    assert set(seen) == {(0, offset) for offset in range((commits + 1) * 5)}

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

from bookkeeper.service import Bookkeeper
from common.catalog import open_catalog
from common.transports import open_transport
from reaper.service import Reaper
from tests.bookkeeper.fixtures import make_moniker
from tests.conftest import register_catalog
from tests.reaper.test_reaper import reaper_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_a_streaming_reader_sees_every_committed_record_once(spark, tmp_path: Path) -> None:
    # The reader must stay within the retained history: expiry keeps the newest 20 snapshots and
    # the reader polls every second while the bookkeeper commits a few times a second.
    config = reaper_config(tmp_path, reaper__retain_last="20")
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    transport.publish(make_moniker(config, 1, None, (0, 5)))
    bookkeeper.run_cycle()
    catalog_name = register_catalog(spark, config)
    start_ms = open_catalog(config).load_table("shop.items").current_snapshot().timestamp_ms - 1
    query_name = f"stream_{uuid.uuid4().hex[:8]}"
    stream = (spark.readStream.format("iceberg").option("stream-from-timestamp", str(start_ms))
              .load(f"{catalog_name}.shop.items")
              .select("_kfk_partition", "_kfk_offset"))
    query = stream.writeStream.format("memory").queryName(query_name).trigger(processingTime="1 second").start()

    monikers = 40
    done = threading.Event()

    def keep_committing() -> None:
        for seq in range(2, monikers + 1):
            transport.publish(make_moniker(config, seq, seq - 1, ((seq - 1) * 5, seq * 5)))
            bookkeeper.run_cycle()
            time.sleep(0.2)
        done.set()

    committer = threading.Thread(target=keep_committing)
    committer.start()
    try:
        time.sleep(3)
        report = Reaper(config, spark=spark).run_pass()  # compacts and expires while both run
        committer.join(timeout=300)
        assert done.is_set()
        query.processAllAvailable()
        seen = Counter(tuple(row) for row in spark.sql(f"SELECT _kfk_partition, _kfk_offset FROM {query_name}").collect())
    finally:
        query.stop()
    assert report.tables[0].files_compacted > 0, "the reaper rewrote files the stream had already read"
    table = open_catalog(config).load_table("shop.items")
    committed = Counter(zip(*(table.scan().to_arrow().column(c).to_pylist() for c in ("_kfk_partition", "_kfk_offset"))))
    assert sum(committed.values()) == monikers * 5
    assert seen == committed and max(seen.values()) == 1

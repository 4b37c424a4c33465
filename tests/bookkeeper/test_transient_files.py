"""A file storage cannot serve for a while is waited
for, never taken for a broken one (issue 14, item 1).

The failure this guards against: one data file of a 20,000-record batch unreachable for a single
cycle got the whole moniker quarantined, its offsets committed, and its rows never reached the
table (the reaper later deleted its files as orphans).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.committed_state import committed_state
from icekeeper.common.transports import open_transport
from tests.support.shop_items import bookkeeper_config, make_moniker


def table_offsets(bookkeeper: Bookkeeper) -> list[int]:
    return sorted(
        bookkeeper.catalog.load_table("shop.items")
        .scan(selected_fields=("_kfk_offset",))
        .to_arrow()
        .column("_kfk_offset")
        .to_pylist()
    )


def errors_of_kind(bookkeeper: Bookkeeper, kind: str) -> float:
    return (
        bookkeeper.metrics.registry.get_sample_value("icekeeper_errors_total", {"kind": kind})
        or 0.0
    )


def test_a_file_unreachable_for_one_cycle_reaches_the_table_once_it_is_back(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    batch = make_moniker(config, 1, None, (0, 20_000), files=8)
    after = make_moniker(
        config, 2, 1, (20_000, 20_100)
    )  # the same writer's next batch waits behind it
    other = make_moniker(
        config, 1, None, (0, 50), writer_id="w2", partition=1
    )  # another writer does not
    for moniker in (batch, after, other):
        transport.publish(moniker)
    unreachable = Path(batch.files[3].path.removeprefix("file://"))
    hidden = unreachable.with_name(unreachable.name + ".away")
    unreachable.rename(hidden)
    bookkeeper = Bookkeeper(config)
    report = bookkeeper.run_cycle()
    [result] = report.tables
    assert report.dead_lettered == [] and result.quarantined == []
    assert [d.moniker.id for d, _ in result.unavailable] == [batch.id]
    assert "not found" in result.unavailable[0][1]
    assert {d.moniker.id for d in result.waiting} == {batch.id, after.id}
    assert table_offsets(bookkeeper) == list(range(50))  # w2's rows only
    state = committed_state(bookkeeper.catalog.load_table("shop.items"))
    assert (
        state.writer_seqs == {"w2": 1}
        and ("items", 0) not in state.offsets
        and state.quarantined_records == 0
    )
    assert (
        errors_of_kind(bookkeeper, "file-unavailable") == 1
        and errors_of_kind(bookkeeper, "quarantined") == 0
    )
    assert {m.id for m in transport.pending()} == {
        batch.id,
        after.id,
    }  # still pending: the reaper spares their files

    hidden.rename(unreachable)
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 2 and report.dead_lettered == []
    assert table_offsets(bookkeeper) == sorted(list(range(20_100)) + list(range(50)))
    assert transport.pending() == [] and transport.dead_letter_count() == 0


def test_a_file_missing_longer_than_the_timeout_is_quarantined(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path, bookkeeper__missing_file_timeout="1s")
    transport = open_transport(config)
    lost = make_moniker(config, 1, None, (0, 10))
    after = make_moniker(config, 2, 1, (10, 20))
    transport.publish(lost)
    transport.publish(after)
    Path(lost.files[0].path.removeprefix("file://")).unlink()
    bookkeeper = Bookkeeper(config)
    assert bookkeeper.run_cycle().dead_lettered == []  # first seen missing: waits
    time.sleep(1.1)  # the point: the file stays missing past the 1 s timeout
    report = bookkeeper.run_cycle()
    [(source, reason)] = report.dead_lettered
    assert "missing for" in reason and "missing_file_timeout" in reason
    # The writer's next batch no longer waits.
    assert table_offsets(bookkeeper) == list(range(10, 20))
    assert transport.dead_letter_count() == 1


def test_a_file_that_is_not_parquet_is_quarantined_without_waiting(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    moniker = make_moniker(config, 1, None, (0, 10))
    path = Path(moniker.files[0].path.removeprefix("file://"))
    path.write_bytes(b"x" * path.stat().st_size)  # same size, not Parquet
    transport.publish(moniker)
    started = time.monotonic()
    report = Bookkeeper(config).run_cycle()
    [(_, reason)] = report.tables[0].quarantined
    assert "unreadable" in reason and report.tables[0].unavailable == []
    assert time.monotonic() - started < 5


@pytest.mark.heavy
@pytest.mark.integration
def test_a_real_writers_batch_survives_one_file_unreachable_for_a_cycle(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    """The issue's reproduction: 20,000 records, one
    writer batch, one of its files away for one cycle."""
    from icekeeper.samples.produce import produce_synthetic
    from icekeeper.samples.synthetic import SyntheticSpec
    from icekeeper.writers.job import WriterJob
    from tests.support.pipeline import pipeline_config

    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
        },
    )
    produce_synthetic(
        config,
        SyntheticSpec(seed=14, keys=2000, events=20_000, schema_changes=0),
        topic=unique_topic,
        partitions=3,
        progress=lambda m: None,
    )
    job = WriterJob(config, spark=spark)
    job.run(max_batches=1)
    [moniker] = job.transport.pending()
    assert moniker.records == 20_000 and len(moniker.files) > 1
    unreachable = Path(moniker.files[-1].path.removeprefix("file://"))
    hidden = unreachable.with_name(unreachable.name + ".away")
    unreachable.rename(hidden)
    bookkeeper = Bookkeeper(config)
    report = bookkeeper.run_cycle()
    assert report.dead_lettered == [] and report.pending == 1
    hidden.rename(unreachable)
    assert bookkeeper.run_cycle().committed_monikers == 1
    table = bookkeeper.catalog.load_table("shop.orders")
    assert len(table.scan(selected_fields=("_kfk_offset",)).to_arrow()) == 20_000
    assert committed_state(table).quarantined_records == 0

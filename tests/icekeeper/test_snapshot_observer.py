"""The freshness bench's observer: a separate process that sees each snapshot as a reader would."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from icekeeper.bench.e2e import holds, window_figures
from icekeeper.bench.snapshot_observer import observe_snapshots, read_seen_snapshots
from icekeeper.common.catalog import open_catalog
from icekeeper.common.committed_state import KEY_STATE, CommittedState
from icekeeper.common.config import load_config
from tests.support.waiting import wait_until


def _seen_count(path: Path) -> int:
    return len(read_seen_snapshots(path)) if path.exists() else 0


def test_observer_records_when_each_commit_became_visible_and_the_offsets_it_covers(
    tmp_path: Path,
) -> None:
    config = load_config(None, environ={"ICEKEEPER__STATE_DIR": str(tmp_path)})
    catalog = open_catalog(config)
    catalog.create_namespace("bench")
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    table = catalog.create_table("bench.observed", schema=schema)
    seen_path = tmp_path / "seen.jsonl"
    context = multiprocessing.get_context("spawn")
    stop, ready = context.Event(), context.Event()
    observer = context.Process(
        target=observe_snapshots,
        args=(config, "bench.observed", str(seen_path), stop, ready, 0.05),
    )
    observer.start()
    try:
        assert ready.wait(60)
        windows = []
        for offset in (10, 25):
            before_ms = int(time.time() * 1000)
            state = CommittedState(
                offsets={("topic", 0): offset, ("topic", 1): offset * 2}, commit_id=f"c{offset}"
            )
            # As the bookkeeper commits: the summary names the commit, the property holds the
            # state, in one transaction.
            with table.transaction() as transaction:
                transaction.set_properties({KEY_STATE: state.to_property()})
                transaction.append(
                    pa.table({"id": pa.array([offset], pa.int64())}),
                    snapshot_properties=state.to_summary([]),
                )
            after_ms = int(time.time() * 1000)
            windows.append((before_ms, after_ms))
            wait_until(
                lambda: _seen_count(seen_path) >= len(windows),
                10,
                f"the observer to record snapshot {len(windows)}",
                interval_s=0.02,
            )
        seen = read_seen_snapshots(seen_path)
    finally:
        stop.set()
        observer.join(30)
    assert [s.offsets for s in seen] == [
        {("topic", 0): 10, ("topic", 1): 20},
        {("topic", 0): 25, ("topic", 1): 50},
    ]
    table.refresh()
    assert [s.snapshot_id for s in seen] == [s.snapshot_id for s in table.snapshots()]
    for snapshot, (before_ms, after_ms) in zip(seen, windows, strict=True):
        # Seen after the commit began, and within a few polls of its end (a loaded machine).
        assert before_ms <= snapshot.visible_ms <= after_ms + 2000


def test_a_window_holds_only_with_p99_under_five_seconds_and_throughput_keeping_up() -> None:
    produced = {"rate_per_s": 1000.0}
    fresh = [(1_000_000 + i, 0.5 + (i % 10) / 10) for i in range(1000)]
    figures = window_figures(fresh, 1000.0, produced)
    assert figures["freshness_p50_s"] == 0.95
    assert figures["freshness_max_s"] == 1.4
    # 1,000 records from their first Kafka timestamp to the last one visible (~2.4 s later).
    assert 400 < figures["records_per_s"] < 450
    assert not holds(figures)  # 420/s committed of 1,000/s produced
    slow = window_figures([(i, 6.0) for i in range(0, 60_000, 60)], 16.0, {"rate_per_s": 16.0})
    assert slow["freshness_p99_s"] == 6.0 and not holds(slow)
    steady = window_figures([(i, 1.0) for i in range(0, 60_000, 60)], 16.0, {"rate_per_s": 16.0})
    assert holds(steady)

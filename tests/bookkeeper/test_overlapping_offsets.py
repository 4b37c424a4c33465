"""Offsets already committed are never committed again under another writer id (issue 14, item 3).

Seq chains stop one writer from committing a batch twice; they cannot see two writer ids (a
writer restarted under a new id, two writers given the same partitions) covering the same
records. The committed offsets per partition can: a range that starts below them is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from bookkeeper.committer import overlapping_offsets, select_ready
from bookkeeper.service import Bookkeeper
from common.committed_state import CommittedState, committed_state
from common.transports import Delivery, open_transport
from tests.support.shop_items import bookkeeper_config, make_moniker


def table_offsets(bookkeeper: Bookkeeper) -> list[int]:
    return sorted(
        bookkeeper.catalog.load_table("shop.items")
        .scan(selected_fields=("_kfk_offset",))
        .to_arrow()
        .column("_kfk_offset")
        .to_pylist()
    )


def test_a_second_writer_id_over_committed_offsets_is_refused_and_dead_lettered(
    tmp_path: Path,
) -> None:
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    transport.publish(make_moniker(config, 1, None, (0, 100), writer_id="w1"))
    bookkeeper.run_cycle()
    # A writer restarted under a new id reads the same partition again, from 50.
    overlapping = make_moniker(config, 1, None, (50, 150), writer_id="w1-restarted")
    transport.publish(overlapping)
    report = bookkeeper.run_cycle()
    [(source, reason)] = report.dead_lettered
    assert "overlap" in reason and "items[0] 50..150" in reason and "below 100" in reason
    assert report.committed_monikers == 0
    assert table_offsets(bookkeeper) == list(range(100))  # nothing twice
    assert (
        bookkeeper.metrics.registry.get_sample_value(
            "icekeeper_errors_total", {"kind": "overlapping-offsets"}
        )
        == 1
    )
    dead = [
        json.loads(p.read_text()) for p in (tmp_path / "dead-letter" / "monikers").glob("*.reason")
    ]
    assert [d["reason"] for d in dead] == [reason]
    state = committed_state(bookkeeper.catalog.load_table("shop.items"))
    # The refused writer's chain moves on (its next
    # batch does not wait forever); the offsets do not.
    assert state.writer_seqs == {"w1": 1, "w1-restarted": 1} and state.offsets == {
        ("items", 0): 100
    }
    # Both go on without overlapping: everything lands once.
    transport.publish(make_moniker(config, 2, 1, (100, 120), writer_id="w1"))
    transport.publish(make_moniker(config, 2, 1, (120, 130), writer_id="w1-restarted"))
    assert bookkeeper.run_cycle().committed_monikers == 2
    assert table_offsets(bookkeeper) == list(range(130))


def test_two_writers_with_the_same_partition_in_one_cycle_commit_it_once(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    transport.publish(make_moniker(config, 1, None, (0, 40), writer_id="a"))
    transport.publish(
        make_moniker(config, 1, None, (0, 40), writer_id="b")
    )  # same records, another id
    transport.publish(
        make_moniker(config, 1, None, (0, 40), writer_id="c", partition=1)
    )  # another partition
    bookkeeper = Bookkeeper(config)
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 2 and len(report.dead_lettered) == 1
    assert table_offsets(bookkeeper) == sorted(list(range(40)) * 2)  # partitions 0 and 1, once each


def test_select_ready_refuses_ranges_below_the_committed_offsets(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path)
    state = CommittedState(writer_seqs={"w1": 3}, offsets={("items", 0): 100})
    after = make_moniker(config, 4, 3, (100, 110), writer_id="w1")
    contained = make_moniker(config, 1, None, (20, 60), writer_id="w2")
    straddling = make_moniker(config, 1, None, (90, 130), writer_id="w3")
    empty = make_moniker(config, 1, None, (40, 40), writer_id="w4", files=1)
    selection = select_ready(
        [Delivery(m, m.id) for m in (after, contained, straddling, empty)], state, 100, 1 << 40
    )
    assert [d.moniker.writer_id for d in selection.ready] == [
        "w1",
        "w4",
    ]  # an empty range adds nothing
    assert [d.moniker.writer_id for d, _ in selection.refused] == ["w2", "w3"]
    assert overlapping_offsets(after, {("items", 0): 100}) is None
    assert "records 90..100 would be added twice" in overlapping_offsets(
        straddling, {("items", 0): 100}
    )

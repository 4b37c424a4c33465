"""Offsets already committed are never committed again under another writer id (issue 14, item 3).

Seq chains stop one writer from committing a batch twice; they cannot see two writer ids (a
writer restarted under a new id, two writers given the same partitions) covering the same
records. The committed offsets per partition can: a range that starts below them is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from icekeeper.bookkeeper.exactly_once import overlapping_offsets, select_ready
from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.committed_state import CommittedState, Refusal, committed_state
from icekeeper.common.fencing import Fenced
from icekeeper.common.transports import Delivery, open_transport
from tests.support.shop_items import bookkeeper_config, make_moniker


def table_offsets(bookkeeper: Bookkeeper) -> list[int]:
    return sorted(
        bookkeeper.catalog.load_table("shop.items")
        .scan(selected_fields=("_kfk_offset",))
        .to_arrow()
        .column("_kfk_offset")
        .to_pylist()
    )


def test_a_second_writer_id_over_committed_offsets_is_refused_and_recorded(
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
    [(source, reason)] = report.refused
    assert "overlap" in reason and "items[0] 50..150" in reason and "below 100" in reason
    assert report.committed_monikers == 0 and report.dead_lettered == []
    assert table_offsets(bookkeeper) == list(range(100))  # nothing twice
    assert (
        bookkeeper.metrics.registry.get_sample_value(
            "icekeeper_errors_total", {"kind": "overlapping-offsets"}
        )
        == 1
    )
    assert transport.pending() == []  # acknowledged: its writer reads the records again
    state = committed_state(bookkeeper.catalog.load_table("shop.items"))
    # The refusal is recorded for its writer (which re-plans from it); the refused writer's
    # chain and the offsets do not move.
    assert state.writer_seqs == {"w1": 1} and state.offsets == {("items", 0): 100}
    assert state.refusals["w1-restarted"].seq == 1
    assert state.refusals["w1-restarted"].from_offsets == {("items", 0): 50}
    # A moniker the refused writer planned on the refused one is refused too; its re-planned
    # one (chained on its last committed seq: none) and w1's next one land, everything once.
    transport.publish(make_moniker(config, 2, 1, (150, 160), writer_id="w1-restarted"))
    transport.publish(make_moniker(config, 2, 1, (100, 120), writer_id="w1"))
    transport.publish(make_moniker(config, 3, None, (120, 160), writer_id="w1-restarted"))
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 2 and len(report.refused) == 1
    assert "planned on writer w1-restarted's refused seq 1" in report.refused[0][1]
    assert table_offsets(bookkeeper) == list(range(160))
    state = committed_state(bookkeeper.catalog.load_table("shop.items"))
    assert state.refusals == {} and state.writer_seqs == {"w1": 2, "w1-restarted": 3}


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
    assert report.committed_monikers == 2 and len(report.refused) == 1
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


def test_select_ready_refuses_what_was_planned_on_a_refused_moniker(tmp_path: Path) -> None:
    """A refusal is remembered in the state; the writer's monikers chained on a refused seq are
    refused (in the same cycle or a later one), its re-planned ones are not, and copies of one
    moniker in one receive are told apart from duplicates."""
    config = bookkeeper_config(tmp_path)
    state = CommittedState(writer_seqs={"w1": 3, "w2": 1}, offsets={("items", 0): 100})
    refused = make_moniker(config, 2, 1, (90, 130), writer_id="w2")
    planned_on_it = make_moniker(config, 3, 2, (130, 140), writer_id="w2")
    replanned = make_moniker(config, 4, 1, (100, 140), writer_id="w2")
    deliveries = [Delivery(m, m.id) for m in (refused, planned_on_it, replanned)]
    copy = Delivery(replanned, "copy")
    selection = select_ready([*deliveries, copy], state, 100, 1 << 40)
    assert [d.moniker.seq for d, _ in selection.refused] == [2, 3]
    assert [d.moniker.seq for d in selection.ready] == [4]
    assert selection.copies == [copy] and selection.duplicates == []

    # The next cycle, with the refusal recorded: a late one planned on it is refused, a copy of
    # the refused one is a duplicate, the re-planned one is ready.
    recorded = CommittedState(
        writer_seqs={"w1": 3, "w2": 1},
        offsets={("items", 0): 100},
        refusals={"w2": Refusal(2, {("items", 0): 90})},
    )
    selection = select_ready(deliveries, recorded, 100, 1 << 40)
    assert [d.moniker.seq for d in selection.duplicates] == [2]
    assert [d.moniker.seq for d, _ in selection.refused] == [3]
    assert [d.moniker.seq for d in selection.ready] == [4]


def test_a_refused_moniker_of_an_earlier_version_s_writer_is_set_aside_as_before(
    tmp_path: Path,
) -> None:
    """A writer that does not read refusals back (its monikers lack `rereads_refused`): its
    refused moniker is dead-lettered and its chain moves on, or its later batches would all be
    refused while it never reads them again."""
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    transport.publish(make_moniker(config, 1, None, (0, 100), writer_id="w1"))
    bookkeeper.run_cycle()
    old = make_moniker(config, 1, None, (50, 150), writer_id="old").model_copy(
        update={"rereads_refused": None}
    )
    transport.publish(old)
    report = bookkeeper.run_cycle()
    assert len(report.refused) == len(report.dead_lettered) == 1
    state = committed_state(bookkeeper.catalog.load_table("shop.items"))
    assert state.writer_seqs == {"w1": 1, "old": 1} and state.refusals == {}
    nxt = make_moniker(config, 2, 1, (150, 160), writer_id="old").model_copy(
        update={"rereads_refused": None}
    )
    transport.publish(nxt)
    assert bookkeeper.run_cycle().committed_monikers == 1


def test_a_bookkeeper_deposed_while_it_plans_records_no_refusal(tmp_path: Path) -> None:
    """A refusal is a verdict the writer acts on (it reads the refused offsets again): it is
    recorded only by the lease holder. A bookkeeper whose lease lapses while it plans a refusal
    (a long pause) and is taken over stops without recording it; the successor refuses the
    moniker under its own epoch."""
    config = bookkeeper_config(tmp_path, bookkeeper__lease_ttl="1")
    transport = open_transport(config)
    deposed = Bookkeeper(config)
    assert deposed.take_lease(timeout_s=5) == 1
    transport.publish(make_moniker(config, 1, None, (0, 100), writer_id="w1"))
    deposed.run_cycle()
    transport.publish(make_moniker(config, 1, None, (50, 150), writer_id="w1-restarted"))
    successor = Bookkeeper(config)
    describe = deposed.committer.footer_reader.describe

    def taken_over_while_planning(requests, properties, sizes):
        if successor.lease is None:  # the lease lapses, and the successor takes it
            assert successor.take_lease(timeout_s=10) == 2
        return describe(requests, properties, sizes)

    deposed.committer.footer_reader.describe = taken_over_while_planning
    with pytest.raises(Fenced):
        deposed.run_cycle()
    state = committed_state(deposed.catalog.load_table("shop.items"))
    assert state.refusals == {} and state.epoch == 1
    assert len(transport.pending()) == 1
    report = successor.run_cycle()
    assert len(report.refused) == 1 and report.committed_monikers == 0
    state = committed_state(successor.catalog.load_table("shop.items"))
    assert state.refusals["w1-restarted"].seq == 1 and state.epoch == 2
    assert table_offsets(successor) == list(range(100))

"""What a writer makes of a table's committed state and its own pending monikers (units)."""

from __future__ import annotations

from icekeeper.common.moniker import Moniker, OffsetRange, moniker_id
from icekeeper.writers.offsets import BatchPlan
from icekeeper.writers.progress import TableProgress, live_monikers, next_seq
from icekeeper.writers.table_batch import offset_only_monikers


def moniker(seq: int, prev_seq: int | None, start: int, until: int) -> Moniker:
    ranges = [OffsetRange(topic="t", partition=0, from_offset=start, until_offset=until)]
    return Moniker(
        id=moniker_id("w", "db.t", ranges),
        writer_id="w",
        seq=seq,
        prev_seq=prev_seq,
        table="db.t",
        schema={"type": "struct", "schema-id": 0, "fields": []},
        offsets=ranges,
        records=0,
    )


def test_pending_monikers_after_a_refusal_are_doomed_until_the_writer_re_plans() -> None:
    # Seq 5 was refused, so 4 (its predecessor) was committed before it was looked at.
    committed, refused_seq = 4, 5
    pending = [
        moniker(5, 4, 100, 150),  # the refused one, its acknowledgement on its way: doomed
        moniker(6, 5, 150, 160),  # chained on the refused 5: doomed
        moniker(7, 6, 160, 170),  # chained on a doomed one: doomed
        moniker(8, 4, 100, 170),  # re-planned on the last committed one: live
        moniker(9, 8, 170, 180),  # and the next: live
    ]
    live, doomed = live_monikers(pending, committed, refused_seq)
    assert [m.seq for m in live] == [8, 9] and [m.seq for m in doomed] == [5, 6, 7]
    # Without a refusal, every pending moniker above the committed seq is live.
    live, doomed = live_monikers(pending[:3], committed, None)
    assert [m.seq for m in live] == [5, 6, 7] and doomed == []
    # Committed ones (acknowledgement on its way) are neither.
    assert live_monikers([moniker(4, 3, 90, 100)], committed, None) == ([], [])


def test_a_writer_never_reuses_a_seq() -> None:
    progress = TableProgress(last_seq=3, highest_seq=9, positions={("t", 0): 100})
    tables = {"db.t": progress, "db.u": TableProgress(last_seq=4, positions={("t", 0): 170})}
    assert next_seq(tables, None) == 10  # above the refused seq 9, not the chain's head 3


def test_a_file_less_moniker_settles_a_refusal_only_for_the_source_s_own_tables() -> None:
    """A writer of two sources: the refused table belongs to the second; the first source's
    batch must not give it a moniker over the first source's partitions."""
    plan = BatchPlan(
        read_ranges={("shop", 0): (10, 20)}, table_starts={"db.orders": {("shop", 0): 10}}
    )
    tables = {
        "db.orders": TableProgress(last_seq=1),
        "web.clicks": TableProgress(last_seq=1, rereading=frozenset({("clicks", 0)})),
    }
    assert offset_only_monikers(None, "w", plan, 2, [], tables) == []

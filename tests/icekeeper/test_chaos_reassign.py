"""The chaos run's reassignment event, without services: the layouts it goes through, what it
waits for before the bookkeeper comes back, and how the run's records are spread over its steps.
The event itself runs in the heavy chaos test (`tests/test_chaos.py`)."""

from __future__ import annotations

from icekeeper.chaos_pacing import RecordGate
from icekeeper.chaos_reassign import (
    first_layout,
    last_seqs,
    moved_partitions,
    next_layout,
    pending_ends,
    pending_files,
    pending_monikers,
    reaching_past,
)
from icekeeper.common.moniker import FileEntry, Moniker, OffsetRange, moniker_id
from tests.support.moniker_values import SAMPLE_SCHEMA


def moniker(writer: str, seq: int, ranges: list[tuple[int, int, int]], table: str = "t") -> Moniker:
    """A moniker of `writer` over (partition, from, until) ranges of topic `k`, one file."""
    offsets = [
        OffsetRange(topic="k", partition=p, from_offset=a, until_offset=b) for p, a, b in ranges
    ]
    return Moniker(
        id=moniker_id(writer, table, offsets),
        writer_id=writer,
        seq=seq,
        prev_seq=seq - 1 if seq > 1 else None,
        table=table,
        schema=SAMPLE_SCHEMA,
        files=[FileEntry(path=f"file:///wh/{writer}-{seq}.parquet", size_bytes=1, record_count=1)],
        offsets=offsets,
        records=1,
    )


def test_layouts_scale_like_a_statefulset_and_move_partitions_to_new_and_staying_writers() -> None:
    first = first_layout(pointers=True)
    assert (first.count, first.writer_ids) == (2, ["w1", "w2"])
    second = next_layout(first)
    third = next_layout(second)
    assert [second.count, third.count, next_layout(third).count] == [3, 1, 2]
    # 2 -> 3: partition 2 goes from w1 to the new w3, partition 3 from w2 to w1 (which stays).
    assert moved_partitions(first, second, 4) == {"2": ["w1", "w3"], "3": ["w2", "w1"]}
    # 3 -> 1: w1 takes every partition of the writers that go.
    assert moved_partitions(second, third, 4) == {"1": ["w2", "w1"], "2": ["w3", "w1"]}
    # On the Azure queue w1, in every layout, sends its monikers as pointers; nobody else does.
    assert second.environ(0) == {
        "ICEKEEPER__WRITER__INSTANCE_INDEX": "0",
        "ICEKEEPER__WRITER__INSTANCE_COUNT": "3",
        "ICEKEEPER__TRANSPORT__MAX_INLINE_BYTES": "0",
    }
    assert "ICEKEEPER__TRANSPORT__MAX_INLINE_BYTES" not in second.environ(2)
    assert "ICEKEEPER__TRANSPORT__MAX_INLINE_BYTES" not in next_layout(
        first_layout(pointers=False)
    ).environ(0)
    assert second.describe(4)["partitions"] == {"w1": [0, 3], "w2": [1], "w3": [2]}


def test_the_bookkeeper_returns_once_a_new_writer_reaches_past_the_previous_writers_monikers() -> (
    None
):
    """The issue's case: w1's moniker for partition 2 covers 100..150 and waits; the partition goes
    to w3, which starts at the committed 100. Its 100..130 is still inside w1's range (refusing it
    loses nothing); its 130..200 reaches past 150 (refusing it loses 150..200)."""
    old, new = first_layout(pointers=False), next_layout(first_layout(pointers=False))
    at_switch = [
        moniker("w1", 4, [(0, 10, 20), (2, 100, 150)]),
        moniker("w2", 7, [(1, 5, 9), (3, 40, 60)]),
    ]
    ends = pending_ends(at_switch)
    seqs = last_seqs(at_switch)
    assert ends[("w1", "t", 2)] == 150 and seqs == {"w1": 4, "w2": 7}
    inside = [*at_switch, moniker("w3", 1, [(2, 100, 130)])]
    assert reaching_past(inside, ends, old, new, seqs) == []
    past = [*inside, moniker("w3", 2, [(2, 130, 200)])]
    assert reaching_past(past, ends, old, new, seqs) == [
        "t[2]: w3 seq 2 130..200 over w1's pending ..150"
    ]
    # w1 keeps partition 0: its new moniker there overlaps nobody else's.
    assert reaching_past([*at_switch, moniker("w1", 5, [(0, 15, 40)])], ends, old, new, seqs) == []
    # w1 takes partition 3 from w2, and a moniker it published before the switch does not count.
    taken = [*at_switch, moniker("w1", 5, [(3, 40, 70)])]
    assert reaching_past(taken, ends, old, new, seqs) == [
        "t[3]: w1 seq 5 40..70 over w2's pending ..60"
    ]
    assert pending_files(past) == {"t": 4} and pending_files(past, ["w1"]) == {"t": 1}
    assert pending_monikers(past, "w3") == {"t": 2}


def test_the_record_gate_sends_a_share_per_step_and_a_trickle_while_a_step_waits_on_records(
    monkeypatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr("icekeeper.chaos_pacing.time.monotonic", lambda: clock[0])
    gate = RecordGate(records=100, steps=4)
    assert gate(24) and not gate(25)
    gate.step_done()
    assert gate(49) and not gate(50)
    gate.step_done()
    # A trickle, even with a share unspent (it waits for later).
    with gate.trickling(per_s=4):
        assert not gate(50)
        clock[0] += 2.5
        assert gate(59) and not gate(60)
    assert gate(60) and gate(74) and not gate(75)
    # What trickled beyond the allowance is spent: the next share starts from there.
    with gate.trickling(per_s=4):
        clock[0] += 10
        assert gate(114) and not gate(115)
    assert not gate(115)
    gate.step_done()
    assert gate(139) and not gate(140)
    gate.release_all()
    assert gate(10_000)

"""Which mostly-deleted data files the bookkeeper purges after a commit
(`bookkeeper/purge_plan.py`), and the key index's counts it plans from; no services."""

from __future__ import annotations

from decimal import Decimal

import numpy as np

from icekeeper.bookkeeper.key_index import KeyIndex, pack
from icekeeper.bookkeeper.position_deletes import DataFileRef
from icekeeper.bookkeeper.purge_plan import FileLiveness, plan_purge

MIB = 1024 * 1024


def file(
    name: str,
    live: int,
    records: int = 100,
    size: int = MIB,
    partition: tuple = (),
    spec_id: int = 0,
) -> FileLiveness:
    return FileLiveness(name, spec_id, partition, records, size, live)


def paths(files) -> list[str]:
    return sorted(f.path for f in files)


def test_files_at_or_past_the_deleted_share_are_purged_the_others_stay() -> None:
    plan = plan_purge(
        [file("a", live=70), file("b", live=71), file("c", live=10), file("d", live=100)],
        deleted_share=0.3,
        max_file_bytes=64 * MIB,
        budget_bytes=64 * MIB,
    )
    assert paths(plan.replaced) == ["a", "c"]  # 30% and 90% deleted; 29% and 0% stay
    [group] = plan.groups
    assert group.live_rows == 80 and plan.bytes_read == 2 * MIB and not plan.deferred


def test_a_share_of_zero_turns_purges_off() -> None:
    plan = plan_purge([file("a", live=0), file("b", live=1)], 0, 64 * MIB, 64 * MIB)
    assert not plan and not plan.replaced


def test_files_over_the_size_cap_are_left_to_the_reaper() -> None:
    plan = plan_purge(
        [file("big", live=1, size=65 * MIB), file("small", live=1, size=64 * MIB)],
        deleted_share=0.3,
        max_file_bytes=64 * MIB,
        budget_bytes=1024 * MIB,
    )
    assert paths(plan.replaced) == ["small"] and not plan.deferred


def test_the_budget_takes_the_most_deleted_files_first_and_defers_the_rest() -> None:
    files = [
        file("a40", live=60, size=10 * MIB),
        file("b90", live=10, size=10 * MIB),
        file("c50", live=50, size=10 * MIB),
        file("d80", live=20, size=3 * MIB),
    ]
    plan = plan_purge(files, deleted_share=0.3, max_file_bytes=64 * MIB, budget_bytes=24 * MIB)
    # 90% (10 MiB), 80% (3 MiB), 50% (10 MiB) fit in 24 MiB; 40% would not
    assert paths(plan.replaced) == ["b90", "c50", "d80"]
    assert plan.deferred == 1 and plan.bytes_read == 23 * MIB
    # a smaller, less deleted file still fits after one that did not
    files = [file("a90", live=10, size=20 * MIB), file("b80", live=20, size=5 * MIB)]
    plan = plan_purge(files, 0.3, 64 * MIB, 10 * MIB)
    assert paths(plan.replaced) == ["b80"] and plan.deferred == 1


def test_files_with_no_live_row_just_leave_and_cost_no_budget() -> None:
    plan = plan_purge(
        [file("gone", live=0, size=50 * MIB), file("worn", live=5, size=2 * MIB)],
        deleted_share=0.3,
        max_file_bytes=64 * MIB,
        budget_bytes=2 * MIB,
    )
    assert paths(plan.emptied) == ["gone"]
    assert [paths(group.files) for group in plan.groups] == [["worn"]]
    assert plan.bytes_read == 2 * MIB and not plan.deferred
    only_empty = plan_purge([file("gone", live=0)], 0.3, 64 * MIB, 64 * MIB)
    assert only_empty and not only_empty.groups


def test_each_partition_and_spec_gets_its_own_files() -> None:
    plan = plan_purge(
        [
            file("p0-a", live=1, partition=(0,)),
            file("p1-a", live=1, partition=(1,)),
            file("p0-b", live=1, partition=(0,)),
            file("p0-old-spec", live=1, partition=(0,), spec_id=1),
            file("null", live=1, partition=(None,)),
        ],
        deleted_share=0.3,
        max_file_bytes=64 * MIB,
        budget_bytes=64 * MIB,
    )
    groups = {(g.spec_id, g.partition): paths(g.files) for g in plan.groups}
    assert groups == {
        (0, (0,)): ["p0-a", "p0-b"],
        (0, (1,)): ["p1-a"],
        (1, (0,)): ["p0-old-spec"],
        (0, (None,)): ["null"],
    }


def test_a_partitions_live_rows_are_cut_into_files_of_at_most_the_cap() -> None:
    # Each 40 MiB file is half deleted: about 20 MiB of live rows, three to a 64 MiB file.
    files = [file(f"f{n}", live=50, size=40 * MIB) for n in range(7)]
    plan = plan_purge(files, 0.3, max_file_bytes=64 * MIB, budget_bytes=1024 * MIB)
    assert [len(group.files) for group in plan.groups] == [3, 3, 1]
    assert sorted(f.path for g in plan.groups for f in g.files) == [f"f{n}" for n in range(7)]


def test_files_the_index_cannot_vouch_for_or_a_request_cannot_carry_are_skipped() -> None:
    plan = plan_purge(
        [
            file("more-live-than-rows", live=101),
            file("no-rows", live=0, records=0),
            file("decimal-partition", live=1, partition=(Decimal("1.5"),)),
            file("fine", live=1, partition=("x",)),
        ],
        deleted_share=0.3,
        max_file_bytes=64 * MIB,
        budget_bytes=64 * MIB,
    )
    assert paths(plan.replaced) == ["fine"]


def test_the_index_counts_live_rows_and_positions_per_file() -> None:
    index = KeyIndex(exact=True, recent_min=2)
    first = index.file_ordinal(DataFileRef("a", 0, ()))
    second = index.file_ordinal(DataFileRef("b", 0, ()))
    index.file_ordinal(DataFileRef("c", 0, ()))  # no live row
    keys = np.arange(6, dtype=np.uint64)
    locations = np.concatenate(
        [pack(first, np.array([0, 1, 2, 3])), pack(second, np.array([0, 1]))]
    )
    index.apply(index.plan(keys, np.zeros(6, np.uint64), locations), 1)
    # key 1 and key 4 move on: their rows in `a` and `b` are deleted; key 6 is new (recent set)
    moved = np.array([1, 4, 6], np.uint64)
    changes = index.plan(moved, np.zeros(3, np.uint64), pack(second, np.array([5, 6, 7])))
    index.apply(changes, 2)
    assert index.live_rows_per_file().tolist() == [3, 4, 0]
    found = index.live_positions([first, second, 2])
    assert found[first].tolist() == [0, 2, 3]
    assert found[second].tolist() == [1, 5, 6, 7]
    assert found[2].tolist() == []

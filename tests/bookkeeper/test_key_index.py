"""The key index plans each cycle's position deletes exactly, and hashes keys without collisions."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from icekeeper.bookkeeper.key_index import ABSENT, KeyIndex, pack, unpack
from icekeeper.bookkeeper.position_deletes import DataFileRef
from icekeeper.bookkeeper.row_keys import key_words


def _cycle(index: KeyIndex, events: list[tuple[int, int | None]], snapshot: int) -> set[int]:
    """Run one cycle of (key, location or None for a delete) events; the replaced locations."""
    hi = np.array([key for key, _ in events], np.uint64)
    lo = np.zeros(len(events), np.uint64)
    location = np.array([ABSENT if loc is None else loc for _, loc in events], np.uint64)
    changes = index.plan(hi, lo, location)
    index.apply(changes, snapshot)
    return {int(value) for value in changes.replaced}


@pytest.mark.parametrize(
    "recent_min", [65_536, 8]
)  # new keys merged into the main arrays never, or every few cycles
def test_random_cycles_match_a_reference_dict(recent_min: int) -> None:
    rng = random.Random(7)
    index = KeyIndex(exact=True, recent_min=recent_min)
    reference: dict[int, int] = {}
    next_location = 0
    for snapshot in range(200):
        events = []
        expected_replaced = set()
        shadow = dict(reference)
        for _ in range(rng.randint(0, 60)):
            key = rng.randint(0, 300)
            if rng.random() < 0.2:
                events.append((key, None))
                if key in shadow:
                    expected_replaced.add(shadow.pop(key))
            else:
                next_location += 1
                events.append((key, next_location))
                if key in shadow:
                    expected_replaced.add(shadow[key])
                shadow[key] = next_location
        assert _cycle(index, events, snapshot) == expected_replaced
        reference = shadow
        keys = np.array(sorted(range(0, 301)), np.uint64)
        found = index.locations_of(keys, np.zeros(len(keys), np.uint64))
        assert {int(k): int(v) for k, v in zip(keys, found) if v != ABSENT} == reference
        hi, lo, location = index.arrays()  # what is saved: one sorted set, the same answers
        assert np.all(hi[1:] >= hi[:-1])
        saved = KeyIndex(exact=True, hi=hi, lo=lo, location=location)
        assert saved.locations_of(keys, np.zeros(len(keys), np.uint64)).tolist() == found.tolist()
    assert index.snapshot_id == 199


def test_a_key_changed_twice_in_one_cycle_replaces_the_row_of_the_same_cycle() -> None:
    index = KeyIndex(exact=True)
    assert _cycle(index, [(1, 10)], 1) == set()
    # Two monikers of one cycle: key 1 updated in both; the second replaces the first's new row.
    assert _cycle(index, [(1, 20), (2, 21), (1, 30)], 2) == {10, 20}
    assert _cycle(index, [(1, None), (1, 40)], 3) == {30}
    assert index.locations_of(np.array([1, 2], np.uint64), np.zeros(2, np.uint64)).tolist() == [
        40,
        21,
    ]


def test_hashes_that_share_their_upper_word_stay_apart() -> None:
    index = KeyIndex(exact=False)
    hi = np.array([5, 5, 5], np.uint64)
    lo = np.array([1, 2, 3], np.uint64)
    index.apply(index.plan(hi, lo, np.array([100, 200, 300], np.uint64)), 1)
    changes = index.plan(
        np.array([5], np.uint64), np.array([2], np.uint64), np.array([ABSENT], np.uint64)
    )
    assert changes.replaced.tolist() == [200]
    index.apply(changes, 2)
    assert index.locations_of(hi, lo).tolist() == [100, int(ABSENT), 300]


def test_removed_keys_are_compacted_away() -> None:
    index = KeyIndex(exact=True)
    keys = np.arange(10_000, dtype=np.uint64)
    index.apply(index.plan(keys, np.zeros_like(keys), pack(0, np.arange(10_000))), 1)
    index.apply(
        index.plan(keys[:5000], np.zeros(5000, np.uint64), np.full(5000, ABSENT, np.uint64)), 2
    )
    assert len(index.hi) == 5000 and index.live_keys == 5000
    files, positions = unpack(index.locations_of(keys[5000:5003], np.zeros(3, np.uint64)))
    assert files.tolist() == [0, 0, 0] and positions.tolist() == [5000, 5001, 5002]


def test_composite_keys_hash_alike_across_int_widths_and_apart_otherwise() -> None:
    narrow = key_words([pa.array([1, 2], pa.int32()), pa.array(["a", "b"])], exact=False)
    wide = key_words([pa.array([1, 2], pa.int64()), pa.array(["a", "b"])], exact=False)
    other = key_words([pa.array([1, 2], pa.int64()), pa.array(["b", "a"])], exact=False)
    assert narrow[0].tolist() == wide[0].tolist() and narrow[1].tolist() == wide[1].tolist()
    assert set(zip(narrow[0].tolist(), narrow[1].tolist())).isdisjoint(
        zip(other[0].tolist(), other[1].tolist())
    )
    exact = key_words([pa.array([-1, 7], pa.int64())], exact=True)
    assert exact[0].view(np.int64).tolist() == [-1, 7] and exact[1].tolist() == [0, 0]


def test_the_index_bench_reports_its_figures_and_stays_within_64_bytes_a_key() -> None:
    from icekeeper.bench.key_index import run_key_index_bench

    result = run_key_index_bench(
        keys=100_000, cycle_changes=10_000, cycles=3, progress=lambda message: None
    )
    # 100k keys, then per cycle 2k new keys and ~1k deletes of random (possibly repeated) keys.
    assert 100_000 < result["keys"] <= 106_000
    assert (
        result["index_bytes_per_key"] <= 64
        and result["index_ops_per_s"] > 0
        and result["index_recovery_s"] >= 0
    )


@pytest.mark.parametrize("recent_min", [65_536, 8])
def test_files_without_live_keys_are_pruned_and_every_key_keeps_its_row(recent_min: int) -> None:
    """Random cycles, each writing its keys to a file of its own: pruning forgets the files no
    live key points into, and every key still finds its file and row (by path), before and after
    later cycles; a cycle planned before the pruning is refused."""
    rng = random.Random(26)
    index = KeyIndex(exact=True, recent_min=recent_min)
    reference: dict[int, tuple[str, int]] = {}
    for cycle in range(300):
        ref = DataFileRef(f"file:///t/data/{cycle}.parquet", 0, ())
        keys = rng.sample(range(200), rng.randint(1, 40))
        deleted = set(rng.sample(keys, len(keys) // 5))
        ordinal = index.file_ordinal(ref)
        events = [
            (key, None if key in deleted else int(pack(ordinal, np.array([row]))[0]))
            for row, key in enumerate(keys)
        ]
        _cycle(index, events, cycle)
        for row, key in enumerate(keys):
            if key in deleted:
                reference.pop(key, None)
            else:
                reference[key] = (ref.path, row)
        if cycle % 37 == 36:
            stale = index.plan(
                np.array([1], np.uint64), np.zeros(1, np.uint64), np.array([0], np.uint64)
            )
            before = len(index.files)
            dropped = index.prune_files()
            assert dropped > 0 and len(index.files) == before - dropped
            assert {ref.path for ref in index.files} == {path for path, _ in reference.values()}
            with pytest.raises(RuntimeError, match="plan it again"):
                index.apply(stale, cycle)
        keys_all = np.arange(200, dtype=np.uint64)
        found = index.locations_of(keys_all, np.zeros(200, np.uint64))
        ordinals, rows = unpack(found[found != ABSENT])
        assert {
            int(key): (index.files[int(o)].path, int(r))
            for key, o, r in zip(keys_all[found != ABSENT], ordinals, rows)
        } == reference
    assert index.prune_files() >= 0 and len(index.files) <= len(reference)
    assert index.live_rows_per_file().min() > 0


def test_the_index_files_bench_saves_fewer_files_once_pruned() -> None:
    from icekeeper.bench.key_index import run_key_index_files_bench

    result = run_key_index_files_bench(
        commits=600, keys=500, changes_per_commit=20, checkpoints=(300,), progress=lambda _: None
    )
    [first, last] = result["checkpoints"]
    assert (first["commits"], last["commits"]) == (300, 600)
    assert last["unpruned"]["files_listed"] == 600
    assert last["pruned"]["files_listed"] < 300
    assert last["pruned"]["index_file_bytes"] < last["unpruned"]["index_file_bytes"]

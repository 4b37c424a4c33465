"""The upsert key index on its own: look-ups and updates per second, memory per key, recovery time.

Issue 13's targets for the index: at least 300k look-ups-and-updates per second, at most 64 bytes
of memory per key at 10M keys, and a 10M-key index recovered within 30 s. This runs the index as
the bookkeeper does (`plan` a cycle, then `apply` it) on exact integer keys, with cycles of
`cycle_changes` changes (70% updates of existing keys, 10% deletes, 20% new keys), and times
saving and loading it through the same file format the bookkeeper uses.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from icekeeper.bookkeeper.key_index import ABSENT, KeyIndex, pack

Progress = Callable[[str], None]


def run_key_index_bench(
    keys: int = 10_000_000,
    cycle_changes: int = 100_000,
    cycles: int = 20,
    progress: Progress = print,
) -> dict[str, Any]:
    """Build an index of `keys` keys, run `cycles` cycles of changes, save and load it."""
    rng = np.random.default_rng(13)
    index = KeyIndex(exact=True)
    started = time.perf_counter()
    for first in range(0, keys, 1_000_000):
        batch = np.arange(first, min(keys, first + 1_000_000), dtype=np.uint64)
        index.apply(
            index.plan(
                batch, np.zeros_like(batch), pack(first // 1_000_000, np.arange(len(batch)))
            ),
            None,
        )
    build_s = time.perf_counter() - started
    progress(f"built {keys:,} keys in {build_s:.1f}s")
    next_key, ops, busy = keys, 0, 0.0
    for number in range(cycles):
        updates = rng.integers(0, keys, int(cycle_changes * 0.7), dtype=np.uint64)
        deletes = rng.integers(0, keys, int(cycle_changes * 0.1), dtype=np.uint64)
        inserts = np.arange(next_key, next_key + int(cycle_changes * 0.2), dtype=np.uint64)
        next_key += len(inserts)
        hi = np.concatenate([updates, deletes, inserts])
        locations = pack(1000 + number, np.arange(len(hi)))
        locations[len(updates) : len(updates) + len(deletes)] = ABSENT
        began = time.perf_counter()
        changes = index.plan(hi, np.zeros_like(hi), locations)
        index.apply(changes, number)
        busy += time.perf_counter() - began
        ops += len(hi)
    live = index.live_keys
    bytes_per_key = index.nbytes / max(live, 1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "key-index.parquet"
        began = time.perf_counter()
        pq.write_table(
            pa.table(dict(zip(("hi", "lo", "location"), index.arrays()))), path, compression="none"
        )
        save_s = time.perf_counter() - began
        began = time.perf_counter()
        loaded = pq.read_table(path)
        recovered = KeyIndex(
            exact=True,
            hi=loaded.column("hi").to_numpy(),
            lo=loaded.column("lo").to_numpy(),
            location=loaded.column("location").to_numpy().copy(),
        )
        recovery_s = time.perf_counter() - began
    assert recovered.live_keys == live
    result = {
        "keys": live,
        "cycle_changes": cycle_changes,
        "cycles": cycles,
        "index_ops_per_s": round(ops / busy),
        "index_bytes_per_key": round(bytes_per_key, 1),
        "index_save_s": round(save_s, 2),
        "index_recovery_s": round(recovery_s, 2),
        "build_s": round(build_s, 1),
    }
    progress(
        f"{result['index_ops_per_s']:,} look-ups-and-updates/s, {result['index_bytes_per_key']} "
        f"bytes/key, recovery {result['index_recovery_s']}s at {live:,} keys"
    )
    return result


SAVE_REPEATS = 3
"""Saves (and loads) timed per checkpoint and kind; the fastest is reported."""


def run_key_index_files_bench(
    commits: int = 100_000,
    keys: int = 100_000,
    changes_per_commit: int = 100,
    checkpoints: tuple[int, ...] = (1_000, 10_000, 100_000),
    progress: Progress = print,
) -> dict[str, Any]:
    """Save time of a table's key index after `commits` commits, with and without the pruning of
    data files no live key points into (`KeyIndex.prune_files`).

    Each commit writes one data file (a path as long as an ADLS one) holding `changes_per_commit`
    updates of random keys among `keys`, run through the index as the bookkeeper runs a cycle
    (`plan`, then `apply`). At each checkpoint the index is saved and loaded through the
    bookkeeper's own file format (`save_index_at`, `load_index_at`) as it is (every file ever
    committed in its list, as before pruning) and pruned (a copy), on the local disk, the best
    of `SAVE_REPEATS`.
    """
    from icekeeper.bookkeeper.key_index_store import load_index_at, save_index_at
    from icekeeper.bookkeeper.position_deletes import DataFileRef

    rng = np.random.default_rng(26)
    index = KeyIndex(exact=True)
    prefix = "abfss://warehouse@account.dfs.core.windows.net/warehouse/shop/items/data/w1"
    marks = sorted(set(c for c in checkpoints if c <= commits) | {commits})
    results: list[dict[str, Any]] = []
    busy = 0.0
    with tempfile.TemporaryDirectory() as folder:
        for commit in range(1, commits + 1):
            began = time.perf_counter()
            ref = DataFileRef(
                f"{prefix}/{commit:012d}-{rng.bytes(16).hex()}/part-00000-{rng.bytes(16).hex()}"
                "-c000.zstd.parquet",
                0,
                (),
            )
            changed = np.unique(rng.integers(0, keys, changes_per_commit, dtype=np.uint64))
            locations = pack(index.file_ordinal(ref), np.arange(len(changed)))
            index.apply(index.plan(changed, np.zeros_like(changed), locations), commit)
            busy += time.perf_counter() - began
            if commit not in marks:
                continue
            figures: dict[str, Any] = {"commits": commit, "live_keys": index.live_keys}
            for kind in ("unpruned", "pruned"):
                hi, lo, location = index.arrays()
                copy = KeyIndex(
                    exact=True,
                    files=list(index.files),
                    snapshot_id=index.snapshot_id,
                    hi=hi.copy(),
                    lo=lo.copy(),
                    location=location.copy(),
                )
                if kind == "pruned":
                    began = time.perf_counter()
                    copy.prune_files()
                    figures["prune_s"] = round(time.perf_counter() - began, 4)
                table_location = f"{folder}/{kind}"
                save_s = load_s = float("inf")
                for _ in range(SAVE_REPEATS):  # the best of a few: the machine is shared
                    began = time.perf_counter()
                    save_index_at(table_location, "bench", copy)
                    save_s = min(save_s, time.perf_counter() - began)
                    began = time.perf_counter()
                    loaded = load_index_at(table_location, "bench")
                    load_s = min(load_s, time.perf_counter() - began)
                assert loaded is not None and loaded.live_keys == index.live_keys
                saved = Path(table_location) / "icekeeper" / "key-index.parquet"
                figures[kind] = {
                    "files_listed": len(copy.files),
                    "save_s": round(save_s, 4),
                    "load_s": round(load_s, 4),
                    "index_file_bytes": saved.stat().st_size,
                }
            results.append(figures)
            progress(
                f"{commit:,} commits: {figures['unpruned']['files_listed']:,} files listed, "
                f"save {figures['unpruned']['save_s']:.3f}s; pruned: "
                f"{figures['pruned']['files_listed']:,} files, save "
                f"{figures['pruned']['save_s']:.3f}s"
            )
    return {
        "commits": commits,
        "keys": keys,
        "changes_per_commit": changes_per_commit,
        "commit_cycles_s": round(busy, 1),
        "checkpoints": results,
    }

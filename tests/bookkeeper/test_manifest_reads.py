"""A manifest merge on an object store reads the manifests it merges together, not one by one."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.manifest import ManifestContent, ManifestFile
from pyiceberg.table.update.snapshot import _ManifestMergeManager

from icekeeper.bookkeeper import manifest_reads
from icekeeper.bookkeeper.manifest_reads import merged_bins


class _Writer:
    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def add(self, entry: Any) -> None:
        pass

    existing = delete = add

    def to_manifest_file(self) -> ManifestFile:
        return _manifest("merged", 1, 0)


class _RecordingProducer:
    """What pyiceberg's merge manager asks of a snapshot producer, recording the manifests read."""

    snapshot_id = 1

    def __init__(self) -> None:
        self.read: list[str] = []
        self._lock = threading.Lock()

    def spec(self, spec_id: int) -> int:
        return spec_id

    def new_manifest_writer(self, spec: int) -> _Writer:
        return _Writer()

    def fetch_manifest_entry(self, manifest: ManifestFile, discard_deleted: bool) -> list:
        with self._lock:
            self.read.append(manifest.manifest_path)
        return []


def _manifest(path: str, length: int, spec_id: int) -> ManifestFile:
    return ManifestFile.from_args(
        manifest_path=path,
        manifest_length=length,
        partition_spec_id=spec_id,
        content=ManifestContent.DATA,
        sequence_number=1,
        min_sequence_number=1,
        added_snapshot_id=1,
    )


@pytest.mark.parametrize("seed", range(12))
def test_the_bins_fetched_ahead_are_the_manifests_pyiceberg_s_merge_reads(seed: int) -> None:
    """`merged_bins` packs as pyiceberg's merge manager does: across counts around the minimum,
    sizes around the target and two partition specs, it names exactly the manifests read."""
    draw = random.Random(seed)
    target, min_count = 10_000, draw.choice([2, 5, 100])
    manifests = [
        _manifest(
            f"s3://b/m{index}.avro",
            draw.choice([300, 900, 4_000, 9_000, 12_000]),
            draw.choice([0, 0, 1]),
        )
        for index in range(draw.randint(1, 140))
    ]
    producer = _RecordingProducer()
    _ManifestMergeManager(target, min_count, True, producer).merge_manifests(manifests)  # type: ignore[arg-type]
    fetched = [m.manifest_path for b in merged_bins(manifests, target, min_count) for m in b]
    assert sorted(fetched) == sorted(producer.read)


def test_a_merge_on_s3_fetches_its_manifests_together_and_keeps_every_live_file(
    tmp_path: Path, s3_storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the bookkeeper's own cycles on S3: the merge commit's manifests come from the fetch
    threads, several at once, each once; the merged table lists every file once and reads back
    every row."""
    from icekeeper.bookkeeper.service import Bookkeeper
    from icekeeper.common.transports import open_transport
    from tests.bookkeeper.test_fencing import s3_bookkeeper_config
    from tests.support.shop_items import make_moniker

    merge_at = 8
    config = s3_bookkeeper_config(
        tmp_path,
        s3_storage,
        tables=(
            "[{identifier: shop.items, topics: [items], primary_key: [id], mode: changelog, "
            f"properties: {{commit.manifest.min-count-to-merge: '{merge_at}'}}}}]"
        ),
    )
    fetched: list[tuple[str, str]] = []
    in_flight, most_in_flight = [0], [0]
    lock = threading.Lock()
    read_whole = manifest_reads._read_whole

    def watched(file_io: Any, location: str) -> bytes:
        with lock:
            fetched.append((threading.current_thread().name, location))
            in_flight[0] += 1
            most_in_flight[0] = max(most_in_flight[0], in_flight[0])
        try:
            return read_whole(file_io, location)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(manifest_reads, "_read_whole", watched)
    bookkeeper = Bookkeeper(config)  # configures this process's storage door for S3 first
    transport = open_transport(config)
    try:
        parents: set[str] = set()
        for seq in range(1, merge_at + 2):
            transport.publish(
                make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 10, seq * 10))
            )
            assert bookkeeper.run_cycle().committed_monikers == 1
            table = bookkeeper.catalog.load_table("shop.items")
            kept = {m.manifest_path for m in table.current_snapshot().manifests(table.io)}
            if len(kept) <= len(parents):  # this commit merged its parent's manifests
                break
            parents = kept
        merged = parents - kept
        assert len(merged) >= merge_at - 1, f"no merge in {seq} commits"
        locations = [location for _, location in fetched]
        assert merged <= set(locations) and len(locations) == len(set(locations))
        assert all(name.startswith("manifest-fetch") for name, _ in fetched)
        assert most_in_flight[0] > 1  # together, not one after another
        live = [
            entry.data_file.file_path
            for manifest in table.current_snapshot().manifests(table.io)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        ]
        assert len(live) == len(set(live)) == seq
        offsets = sorted(table.scan().to_arrow().column("_kfk_offset").to_pylist())
        assert offsets == list(range(seq * 10))
    finally:
        bookkeeper.committer.close(save_key_indexes=False)

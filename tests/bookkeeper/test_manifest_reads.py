"""A manifest merge on an object store reads the manifests it merges together, not one by one."""

from __future__ import annotations

import random
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import ManifestContent, ManifestFile
from pyiceberg.table.update.snapshot import _MergeAppendFiles

from icekeeper.bookkeeper import manifest_reads
from icekeeper.bookkeeper.manifest_reads import MergeReads, merged_bins
from icekeeper.common.door_fileio import DoorFileIO


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
    """What pyiceberg's merge append asks of itself while it merges (its settings, a spec, a
    manifest writer, the entries of a manifest), recording the manifests read."""

    snapshot_id = 1
    _merge_enabled = True

    def __init__(self, target_size_bytes: int, min_count_to_merge: int) -> None:
        self._target_size_bytes = target_size_bytes
        self._min_count_to_merge = min_count_to_merge
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


def _manifest(
    path: str, length: int, spec_id: int, content: ManifestContent = ManifestContent.DATA
) -> ManifestFile:
    return ManifestFile.from_args(
        manifest_path=path,
        manifest_length=length,
        partition_spec_id=spec_id,
        content=content,
        sequence_number=1,
        min_sequence_number=1,
        added_snapshot_id=1,
    )


@pytest.mark.parametrize("seed", range(12))
def test_the_bins_fetched_ahead_are_the_manifests_pyiceberg_s_merge_reads(seed: int) -> None:
    """`merged_bins` packs as pyiceberg's merge append does (its own `_process_manifests`, run on
    a recording stand-in): across counts around the minimum, sizes around the target, two
    partition specs and delete manifests among the data ones (first, too), it names exactly the
    manifests read."""
    draw = random.Random(seed)
    target, min_count = 10_000, draw.choice([2, 5, 100])
    manifests = [
        _manifest(
            f"s3://b/m{index}.avro",
            draw.choice([300, 900, 4_000, 9_000, 12_000]),
            draw.choice([0, 0, 1]),
            draw.choice([ManifestContent.DATA] * 3 + [ManifestContent.DELETES]),
        )
        for index in range(draw.randint(1, 140))
    ]
    producer = _RecordingProducer(target, min_count)
    _MergeAppendFiles._process_manifests(producer, manifests)  # type: ignore[arg-type]
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
    opened: list[tuple[str, str]] = []  # (thread, location) of every FileIO read
    for kind in (DoorFileIO, PyArrowFileIO):
        original = kind.new_input

        def recording(self: Any, location: str, original: Any = original) -> Any:
            opened.append((threading.current_thread().name, location))
            return original(self, location)

        monkeypatch.setattr(kind, "new_input", recording)
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
        # The merge decoded what was fetched: no merged manifest was opened again outside the
        # fetch threads (a fallback to the usual read would be).
        merged_reads = [name for name, location in opened if location in merged]
        assert merged_reads and all(name.startswith("manifest-fetch") for name in merged_reads)
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


def test_fetches_hold_at_most_the_bytes_allowed_and_stop_with_the_merge(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bin is fetched only while what is held leaves room for it (else read the usual way);
    after the merge closes nothing is fetched; a failed fetch is read the usual way and said
    once."""
    fetched: list[str] = []

    def fetch(file_io: Any, location: str) -> bytes:
        fetched.append(location)
        if "broken" in location:
            raise OSError("503 Slow Down")
        return location.encode()

    monkeypatch.setattr(manifest_reads, "_read_whole", fetch)
    monkeypatch.setattr(manifest_reads, "HELD_BYTES", 1_000)
    bins = [
        [_manifest(f"s3://b/{name}{i}.avro", 400, 0) for i in range(2)]
        for name in ("one", "two", "broken")
    ]
    reads = MergeReads(None, bins)  # type: ignore[arg-type]
    first = reads.input_file(bins[0][0])
    assert first is not None and first.open().read() == b"s3://b/one0.avro"
    # 400 bytes of the first bin still held: the second (800) would pass 1,000.
    assert reads.input_file(bins[1][0]) is None
    assert reads.input_file(bins[0][1]) is not None  # nothing held now
    assert reads.input_file(bins[1][1]) is None  # its bin was passed over: the usual read
    with caplog.at_level("WARNING", logger=manifest_reads.__name__):
        assert reads.input_file(bins[2][0]) is None and reads.input_file(bins[2][1]) is None
    assert len([r for r in caplog.records if "fetched ahead" in r.getMessage()]) == 1
    assert sorted(fetched) == sorted(m.manifest_path for b in (bins[0], bins[2]) for m in b)
    reads.close()
    again = MergeReads(None, bins)  # type: ignore[arg-type]
    again.close()
    assert again.input_file(bins[0][0]) is None  # closed: a late merge thread reads itself
    assert len(fetched) == 4


class _ThroughRelay:
    """The stack's S3 server as a client reaches it through a relay (`tests/support/relay.py`)."""

    def __init__(self, s3_storage: Any, relay: Any) -> None:
        self._storage, self._relay = s3_storage, relay

    def uri(self, key: str) -> str:
        return self._storage.uri(key)

    def pyiceberg_properties(self) -> dict[str, str]:
        return {**self._storage.pyiceberg_properties(), "s3.endpoint": self._relay.address}


def test_a_merge_whose_manifests_s3_will_not_serve_commits_nothing_then_everything_once(
    tmp_path: Path, s3_storage, caplog: pytest.LogCaptureFixture
) -> None:
    """Through the bookkeeper's own cycles, S3 refusing (503) the reads of a manifest a merge
    needs. First only the fetch ahead's (its three attempts): it fails and says so once, the
    merge reads the manifest the usual way, and the same cycle commits. At the next merge every
    read of the merged manifest: the cycle commits nothing and sets nothing aside (an outage, not
    bad input); once S3 serves it again, the next cycle commits the merge. Every moniker once,
    every row once."""
    from icekeeper.bookkeeper.service import Bookkeeper
    from icekeeper.common.transports import open_transport
    from tests.bookkeeper.test_fencing import s3_bookkeeper_config
    from tests.support.relay import Relay, refuse
    from tests.support.shop_items import make_moniker

    merge_at, attempts = 6, 3  # pyarrow's S3 client tries a request 3 times (its default)
    relay = Relay(s3_storage.pyiceberg_properties()["s3.endpoint"])
    config = s3_bookkeeper_config(
        tmp_path,
        _ThroughRelay(s3_storage, relay),
        tables=(
            "[{identifier: shop.items, topics: [items], primary_key: [id], mode: changelog, "
            f"properties: {{commit.manifest.min-count-to-merge: '{merge_at}'}}}}]"
        ),
    )
    bookkeeper = Bookkeeper(config)
    transport = open_transport(config)
    seq = 0

    def manifests() -> list[str]:
        table = bookkeeper.catalog.load_table("shop.items")
        return [m.manifest_path for m in table.current_snapshot().manifests(table.io)]

    def commit_until_a_merge_reads(manifest: str, times: int) -> tuple[Any, int]:
        """Commit a moniker a cycle, S3 refusing `times` reads of `manifest`, until a cycle
        read it (a merge): that cycle's report and the reads refused."""
        nonlocal seq
        key = manifest.split("://", 1)[1].split("/", 1)[1].encode()  # the path after the bucket
        reading = (rb"GET /[^ ]*" + re.escape(key) + rb" HTTP").lower()
        for _ in range(2 * merge_at):
            seq += 1
            transport.publish(
                make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 10, seq * 10))
            )
            faulted = relay.faulted
            relay.arm(lambda sent: re.search(reading, sent.lower()) is not None, refuse(503), times)
            with caplog.at_level("WARNING", logger=manifest_reads.__name__):
                report = bookkeeper.run_cycle()
            relay.arm(lambda sent: False, refuse(503))
            if relay.faulted > faulted:
                return report, relay.faulted - faulted
            assert report.committed_monikers == 1  # not a merge: it read no old manifest
        raise AssertionError(f"no merge read {manifest} in {2 * merge_at} commits")

    def fetched_ahead_failures() -> int:
        return len([r for r in caplog.records if "fetched ahead" in r.getMessage()])

    try:
        transport.publish(make_moniker(config, 1, None, (0, 10)))
        seq = 1
        assert bookkeeper.run_cycle().committed_monikers == 1
        [first] = manifests()
        report, refused = commit_until_a_merge_reads(first, attempts)
        assert refused == attempts and fetched_ahead_failures() == 1
        assert report.committed_monikers == 1, report  # read the usual way, in the same cycle
        merged = [path for path in manifests() if path != first]
        assert first not in manifests() and len(merged) < seq
        report, refused = commit_until_a_merge_reads(merged[-1], 10**6)
        assert refused >= 2 * attempts  # the fetch ahead and the usual read, each 3 times
        assert report.committed_monikers == 0 and not report.dead_lettered
        assert fetched_ahead_failures() == 2
        assert bookkeeper.run_cycle().committed_monikers == 1  # S3 serves it again
        table = bookkeeper.catalog.load_table("shop.items")
        kept = table.current_snapshot().manifests(table.io)
        assert merged[-1] not in [m.manifest_path for m in kept]
        live = [
            entry.data_file.file_path
            for manifest in kept
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        ]
        assert len(live) == len(set(live)) == seq
        offsets = sorted(table.scan().to_arrow().column("_kfk_offset").to_pylist())
        assert offsets == list(range(seq * 10))
        assert bookkeeper.run_cycle().committed_monikers == 0  # nothing left, nothing twice
    finally:
        bookkeeper.committer.close(save_key_indexes=False)
        relay.close()

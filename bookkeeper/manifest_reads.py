"""The parent's manifests a manifest merge reads, fetched in threads before their turn.

Every `commit.manifest.min-count-to-merge` commits (100 by default) pyiceberg's merge append
rewrites the small manifests of the table into one, reading them one after another: on an object
store each is a round trip or two (HEAD, GET), so a merge of 100 one-file manifests waited on 200
requests in a row, the slowest commit of an hour (issue 28's p99). Here the manifests of a bin
that pyiceberg will merge are fetched together by a thread pool the first time one of them is
read; the merge then decodes each from memory, in pyiceberg's order and code.

Which manifests a merge reads is pyiceberg's decision (`_ManifestMergeManager`); `merged_bins`
packs them the same way (pyiceberg 0.12, pinned) to know which to fetch. If it ever guessed
wrong, the result stays the same: a manifest not fetched ahead is read as before, one fetched in
vain is dropped with the commit. A fetch that fails is read again the usual way, which raises
the storage's error as before.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from pyiceberg.io import FileIO, InputFile, InputStream
from pyiceberg.manifest import ManifestFile
from pyiceberg.utils.bin_packing import ListPacker

from icekeeper.common.storage import is_local

FETCH_THREADS = 16
"""Manifests of one bin fetched at once: their requests wait with the GIL released."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _fetch_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="manifest-fetch")
        return _pool


def merged_bins(
    manifests: Sequence[ManifestFile], target_size_bytes: int, min_count_to_merge: int
) -> list[list[ManifestFile]]:
    """The bins of `manifests` pyiceberg's `_ManifestMergeManager.merge_manifests` rewrites (and
    so reads), packed as it packs them: per partition spec, `ListPacker.pack_end` by length; a
    bin of one is kept, and so is the bin holding the first (newest) manifest while it has fewer
    than `min_count_to_merge`."""
    if not manifests:
        return []
    first = manifests[0]
    by_spec: dict[int, list[ManifestFile]] = {}
    for manifest in manifests:
        by_spec.setdefault(manifest.partition_spec_id, []).append(manifest)
    merged = []
    for group in by_spec.values():
        packer: ListPacker[ManifestFile] = ListPacker(
            target_weight=target_size_bytes, lookback=1, largest_bin_first=False
        )
        for manifest_bin in packer.pack_end(group, lambda m: m.manifest_length):
            if len(manifest_bin) == 1:
                continue
            if first in manifest_bin and len(manifest_bin) < min_count_to_merge:
                continue
            merged.append(manifest_bin)
    return merged


class _FetchedInput(InputFile):
    """A manifest's bytes, fetched already, as the InputFile pyiceberg's Avro reader opens."""

    def __init__(self, location: str, data: bytes) -> None:
        super().__init__(location)
        self._data = data

    def __len__(self) -> int:
        return len(self._data)

    def exists(self) -> bool:
        return True

    def open(self, seekable: bool = True) -> InputStream:
        return io.BytesIO(self._data)


def _read_whole(file_io: FileIO, location: str) -> bytes:
    with file_io.new_input(location).open() as stream:
        return stream.read()


class MergeReads:
    """The manifests one merge will read, fetched a bin at a time (see the module docstring).

    Memory: a bin is at most `commit.manifest.target-size-bytes` (8 MB by default) of
    manifests, and pyiceberg merges at most as many bins at once as its executor has threads;
    each manifest's bytes are let go as the merge takes them."""

    def __init__(self, file_io: FileIO, bins: list[list[ManifestFile]]) -> None:
        self._io = file_io
        self._bin_of = {
            manifest.manifest_path: index
            for index, manifest_bin in enumerate(bins)
            for manifest in manifest_bin
        }
        self._bins = bins
        self._started: set[int] = set()
        self._fetches: dict[str, Future[bytes]] = {}
        self._lock = threading.Lock()

    def input_file(self, manifest: ManifestFile) -> InputFile | None:
        """The manifest's bytes as an InputFile, fetched with the rest of its bin; None when it
        is not one a merge reads, is on local disk, or its fetch failed (the caller reads it the
        usual way)."""
        path = manifest.manifest_path
        index = self._bin_of.get(path)
        if index is None or is_local(path):
            return None
        with self._lock:
            if index not in self._started:
                self._started.add(index)
                pool = _fetch_pool()
                for member in self._bins[index]:
                    location = member.manifest_path
                    self._fetches[location] = pool.submit(_read_whole, self._io, location)
            fetch = self._fetches.pop(path, None)
        if fetch is None:
            return None
        try:
            return _FetchedInput(path, fetch.result())
        except Exception:  # noqa: BLE001 - read again the usual way, which raises the storage's error
            return None

    def close(self) -> None:
        """Drop what was fetched and not taken (a merge that stopped early, a wrong guess)."""
        with self._lock:
            for fetch in self._fetches.values():
                fetch.cancel()
            self._fetches.clear()

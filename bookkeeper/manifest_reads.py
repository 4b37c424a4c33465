"""The parent's manifests a manifest merge reads, fetched in threads before their turn.

Every `commit.manifest.min-count-to-merge` commits (100 by default) pyiceberg's merge append
rewrites the small manifests of the table into one, reading them one after another: on an object
store each is a round trip or two (HEAD, GET), so a merge of 100 one-file manifests waited on 200
requests in a row, among the slowest commits of an hour (issue 28's p99). Here the manifests of
a bin that pyiceberg will merge are fetched together by a thread pool the first time one of them
is read; the merge then decodes each from memory, in pyiceberg's order and code.

Which manifests a merge reads is pyiceberg's decision (`_ManifestMergeManager`); `merged_bins`
packs them the same way (pyiceberg 0.12, pinned) to know which to fetch. If it ever guessed
wrong, the result stays the same: a manifest not fetched ahead is read as before, one fetched in
vain is dropped with the commit. A fetch that fails is read again the usual way, which raises
the storage's error as before.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future

from pyiceberg.io import FileIO, InputFile, InputStream
from pyiceberg.manifest import ManifestContent, ManifestFile
from pyiceberg.utils.bin_packing import ListPacker

from icekeeper.common.storage import is_local
from icekeeper.common.thread_pools import shared_thread_pool

FETCH_THREADS = 16
"""Manifests of one bin fetched at once: their requests wait with the GIL released."""

HELD_BYTES = 64 * 1024 * 1024
"""At most this many bytes of manifests fetched and not yet read, whatever the bins: pyiceberg
merges as many bins at once as its executor has threads (up to 32), each up to the table's
`commit.manifest.target-size-bytes` (8 MB by default). A bin that would go past it (unless
nothing is held) is read the usual way."""

log = logging.getLogger(__name__)


def merged_bins(
    manifests: Sequence[ManifestFile], target_size_bytes: int, min_count_to_merge: int
) -> list[list[ManifestFile]]:
    """The bins of `manifests` pyiceberg's `_MergeAppendFiles._process_manifests` rewrites (and
    so reads), packed as it packs them: data manifests only (delete manifests are kept as they
    are), per partition spec `ListPacker.pack_end` by length; a bin of one is kept, and so is the
    bin holding the first (newest) data manifest while it has fewer than `min_count_to_merge`.
    (pyiceberg 0.12, pinned and checked by `common/internals.py`; a wrong guess costs requests,
    never data: see the module docstring.)"""
    data = [manifest for manifest in manifests if manifest.content == ManifestContent.DATA]
    if not data:
        return []
    first = data[0]
    by_spec: dict[int, list[ManifestFile]] = {}
    for manifest in data:
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
    """The manifests one merge will read, fetched a bin at a time (see the module docstring);
    at most `HELD_BYTES` of them fetched and not yet taken."""

    def __init__(self, file_io: FileIO, bins: list[list[ManifestFile]]) -> None:
        self._io = file_io
        self._bin_of = {
            manifest.manifest_path: index
            for index, manifest_bin in enumerate(bins)
            for manifest in manifest_bin
        }
        self._bins = bins
        self._started: set[int] = set()
        self._fetches: dict[str, tuple[Future[bytes], int]] = {}
        self._held_bytes = 0
        self._closed = False
        self._failed = False
        self._lock = threading.Lock()

    def input_file(self, manifest: ManifestFile) -> InputFile | None:
        """The manifest's bytes as an InputFile, fetched with the rest of its bin; None when it
        is not one a merge reads, is on local disk, its bin was over the bytes held, the merge
        is over, or its fetch failed (the caller reads it the usual way)."""
        path = manifest.manifest_path
        index = self._bin_of.get(path)
        if index is None or is_local(path):
            return None
        with self._lock:
            if self._closed:
                return None
            if index not in self._started:
                self._started.add(index)
                self._start_bin(self._bins[index])
            fetch, length = self._fetches.pop(path, (None, 0))
            self._held_bytes -= length
        if fetch is None:
            return None
        try:
            return _FetchedInput(path, fetch.result())
        except Exception as error:  # noqa: BLE001 - read again the usual way, which raises the storage's error
            if not self._failed:  # once a merge: an outage fails every fetch of it
                self._failed = True
                log.warning(
                    "a manifest fetched ahead of its merge failed; reading it the usual way",
                    extra={"manifest": path, "error": repr(error)},
                )
            return None

    def _start_bin(self, manifest_bin: list[ManifestFile]) -> None:
        """Fetch the bin's manifests in the shared pool, unless that holds too much (caller has
        the lock)."""
        size = sum(manifest.manifest_length for manifest in manifest_bin)
        if self._held_bytes and self._held_bytes + size > HELD_BYTES:
            return
        pool = shared_thread_pool("manifest-fetch", FETCH_THREADS)
        for member in manifest_bin:
            location = member.manifest_path
            fetch = pool.submit(_read_whole, self._io, location)
            self._fetches[location] = (fetch, member.manifest_length)
            self._held_bytes += member.manifest_length

    def close(self) -> None:
        """Drop what was fetched and not taken (a merge that stopped early, a wrong guess); a
        merge thread still running after this reads the usual way."""
        with self._lock:
            self._closed = True
            for fetch, _ in self._fetches.values():
                fetch.cancel()
            self._fetches.clear()
            self._held_bytes = 0

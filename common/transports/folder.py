"""A folder of moniker files on any store the storage door opens (local, s3://, abfss://).

Layout: `<root>/<table>/<writer_id>/<seq:012d>-<moniker id>.json`. A file appears only whole
(`common/storage.py` `write_whole`: a hidden temporary file renamed into place on a local or
mounted folder, one PUT on an object store), and each name is written by one writer only, so
nothing here needs more from the store than whole writes and a consistent listing (S3 and Azure
Blob list what was written, at once). Sorting names orders a writer's monikers by `seq`.
"""

from __future__ import annotations

import json
import logging
import posixpath
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pyarrow import fs as pafs

from icekeeper.common.moniker import Moniker, MonikerError, decode_moniker, encode_moniker
from icekeeper.common.storage import (
    delete_files,
    is_local,
    make_folder,
    open_filesystem,
    path_segment,
    read_whole,
    write_whole,
)
from icekeeper.common.thread_pools import shared_thread_pool
from icekeeper.common.transports.base import Quarantined

log = logging.getLogger(__name__)
SUFFIX = ".json"
IO_THREADS = 16
"""Moniker files read at once on an object store, where each read is a round trip: a cycle of
1,000 monikers read them one after another (on AWS S3, ~20 ms each: 20 s)."""


@dataclass(frozen=True)
class StoredMoniker:
    """A moniker file: its location, and the moniker or why it could not be read."""

    path: str
    moniker: Moniker | None
    error: str | None = None


class MonikerFolder:
    """Read, write, list and delete moniker files under one root."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        if "://" not in uri:
            uri = pafs.LocalFileSystem().normalize_path(uri) if uri else uri
        self.filesystem, self.root = open_filesystem(uri)

    def path_for(self, moniker: Moniker) -> str:
        return posixpath.join(
            self.root,
            path_segment(moniker.table),
            path_segment(moniker.writer_id),
            f"{moniker.seq:012d}-{moniker.id}{SUFFIX}",
        )

    def write(self, moniker: Moniker) -> str:
        """Make `moniker` durable and visible as one whole file; returns its path."""
        final = self.path_for(moniker)
        make_folder(self.filesystem, posixpath.dirname(final))
        write_whole(self.filesystem, final, encode_moniker(moniker))
        return final

    def read(self, path: str) -> StoredMoniker:
        """The moniker at `path`, or why its bytes are not one. A file gone since it was listed
        is `unreadable`; any other I/O error (a disk error, a store throttling or down) is an
        outage and raised: the bytes may be a good moniker, which must not be dead-lettered."""
        try:
            data = read_whole(self.filesystem, path)
        except FileNotFoundError as error:
            return StoredMoniker(path, None, f"unreadable: {error}")
        try:
            return StoredMoniker(path, decode_moniker(data))
        except MonikerError as error:
            return StoredMoniker(path, None, str(error))

    def list_paths(self, table: str | None = None, writer_id: str | None = None) -> list[str]:
        """Paths of whole moniker files (temporary files skipped), sorted: per writer, by seq."""
        base = self.root
        if table is not None:
            base = posixpath.join(base, path_segment(table))
            if writer_id is not None:
                base = posixpath.join(base, path_segment(writer_id))
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        return sorted(
            info.path
            for info in self.filesystem.get_file_info(selector)
            if info.type == pafs.FileType.File
            and info.path.endswith(SUFFIX)
            and not posixpath.basename(info.path).startswith(".")
        )

    def list(self, table: str | None = None, writer_id: str | None = None) -> list[StoredMoniker]:
        """Every moniker file under the root (or a table's, a writer's), read as `read_all`
        reads them (on an object store several at a time: writers list what is pending before
        every batch); an outage on any one is raised, as a read's is."""
        stored = self.read_all(self.list_paths(table, writer_id))
        for outcome in stored:
            if isinstance(outcome, OSError):
                raise outcome
        return [outcome for outcome in stored if isinstance(outcome, StoredMoniker)]

    def read_all(self, paths: Sequence[str]) -> list[StoredMoniker | OSError]:
        """`read` of each path, in order, with an outage returned in the path's place instead of
        raised: what the store cannot serve now stays pending alone, the others are read. On an
        object store `IO_THREADS` at a time; on local disk one after another (a read there is a
        page-cache copy: threads would only add overhead)."""
        if self._local() or len(paths) < 2:
            return [self._read_or_outage(path) for path in paths]
        pool = shared_thread_pool("moniker-files", IO_THREADS)
        return list(pool.map(self._read_or_outage, paths))

    def _read_or_outage(self, path: str) -> StoredMoniker | OSError:
        try:
            return self.read(path)
        except OSError as error:
            return error

    def delete(self, path: str) -> None:
        try:
            self.filesystem.delete_file(path)
        except FileNotFoundError:
            pass

    def delete_all(self, paths: Sequence[str]) -> None:
        """`delete` of each path (a file already gone counts as deleted), as the store deletes
        many files best (`storage.delete_files`: S3 a thousand a request). Every path is tried;
        the first failure is raised after all were. Deletes are independent: any subset of them
        leaves the folder consistent."""
        failures = delete_files(self.filesystem, paths)
        if failures:  # whatever path the store named: a refusal is never let pass
            raise next(iter(failures.values()))

    def _local(self) -> bool:
        return isinstance(self.filesystem, pafs.LocalFileSystem) or is_local(self.uri)

    def write_bytes(self, relative: str, payload: bytes) -> str:
        """Write any file under the root (dead-letter copies and their reasons)."""
        path = posixpath.join(self.root, relative)
        make_folder(self.filesystem, posixpath.dirname(path))
        write_whole(self.filesystem, path, payload)
        return path

    def read_bytes(self, path: str) -> bytes:
        return read_whole(self.filesystem, path)


REASON_SUFFIX = ".reason"


class DeadLetterFolder:
    """The dead-letter place for monikers: `<ms>-<name>` holds the delivery's bytes (an encoded
    moniker, or whatever could not be read), `<ms>-<name>.reason` a JSON object with the reason
    and the source. The reason is written last: a copy without one is not listed (a crash while
    quarantining leaves the delivery pending, so it is quarantined again)."""

    def __init__(self, uri: str) -> None:
        self.folder = MonikerFolder(uri)

    def put(self, source: str, raw: bytes, reason: str) -> str:
        """Keep `raw` with `reason`; returns its name."""
        name = f"{int(time.time() * 1000)}-{posixpath.basename(source.rstrip('/')) or 'delivery'}"
        name = path_segment(name)
        self.folder.write_bytes(name, raw)
        # Whole or not at all: a listed reason must parse.
        write_whole(
            self.folder.filesystem,
            posixpath.join(self.folder.root, name + REASON_SUFFIX),
            json.dumps({"reason": reason, "source": source}).encode(),
        )
        return name

    def names(self) -> list[str]:
        """Names of the kept deliveries, oldest first."""
        selector = pafs.FileSelector(self.folder.root, recursive=False, allow_not_found=True)
        reasons = [
            posixpath.basename(info.path)
            for info in self.folder.filesystem.get_file_info(selector)
            if info.path.endswith(REASON_SUFFIX)
        ]
        return sorted(
            (name[: -len(REASON_SUFFIX)] for name in reasons),
            key=lambda name: (_stamp(name) or 0, name),
        )

    def read(self, name: str) -> Quarantined:
        base = posixpath.join(self.folder.root, name)
        facts = json.loads(self.folder.read_bytes(base + REASON_SUFFIX))
        try:
            raw = self.folder.read_bytes(base)
        except FileNotFoundError:
            raw = b""
        try:
            moniker = decode_moniker(raw)
        except MonikerError:
            moniker = None
        return Quarantined(
            name, facts.get("reason", ""), facts.get("source", ""), moniker, raw, _stamp(name)
        )

    def list(self) -> list[Quarantined]:
        return [self.read(name) for name in self.names()]

    def remove(self, name: str) -> None:
        """Reason first: a crash half way leaves a copy that is no longer listed, never a listed
        one without bytes."""
        base = posixpath.join(self.folder.root, name)
        self.folder.delete(base + REASON_SUFFIX)
        self.folder.delete(base)

    def count(self) -> int:
        return len(self.names())


def _stamp(name: str) -> int | None:
    """When a name was set aside (its millisecond prefix), if it has one."""
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() else None

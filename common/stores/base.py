"""What every store behind the storage door offers, and the one guarantee the door relies on.

Each store writes a file whole (no reader ever sees half of it) and creates a file only if it is
absent, atomically: of two writers that create one name at once, exactly one succeeds. That is
all the lease needs (`common/fencing.py`), and the only guarantee beyond a whole write that any
icekeeper file relies on (docs/operations.md, "Storage: what each file relies on").
`replace_if_unchanged` (a compare-and-swap on the version `read_versioned` returned) is offered
too, for callers that must not overwrite a change they have not seen.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from pyarrow import fs as pafs

from icekeeper.common.thread_pools import shared_thread_pool

DELETE_THREADS = 16
"""Files deleted at once on an object store where each delete is a request of its own."""


class ConditionalWritesUnsupported(RuntimeError):
    """The store cannot create or replace a file conditionally (say, gs:// or hdfs:// here):
    leases cannot live on it."""


@dataclass(frozen=True)
class Versioned:
    """A file's bytes and the version they are (an S3 or Azure ETag, a local file's identity)."""

    body: bytes
    version: str


class Store(ABC):
    """One kind of store: its pyarrow filesystem and its conditional writes. Paths are those of
    the pyarrow filesystem (`bucket/key`, `container/blob`, `/local/path`)."""

    kind: str
    filesystem: pafs.FileSystem

    def write_whole(self, path: str, body: bytes, durable: bool = True) -> None:
        """Replace the file at `path` whole. Object stores make one PUT visible at once, and
        durable (`durable` matters on local folders only)."""
        with self.filesystem.open_output_stream(path) as out:
            out.write(body)

    @abstractmethod
    def create_if_absent(self, path: str, body: bytes) -> bool:
        """Write `body` at `path` whole unless a file is there; False if one was (atomic)."""

    @abstractmethod
    def read_versioned(self, path: str) -> Versioned | None:
        """The file's bytes and version, None when there is no file."""

    @abstractmethod
    def replace_if_unchanged(self, path: str, body: bytes, version: str) -> bool:
        """Replace the file whole only while it is still at `version`; False if it changed (or is
        gone)."""

    def warm_up(self) -> None:
        """Make the clients conditional writes use now, so a caller timing one (the lease: its
        expiry counts from before the write) does not count their making. Local folders and
        plain stores have none to make."""
        return None

    def exists(self, path: str) -> bool:
        return self.filesystem.get_file_info(path).type == pafs.FileType.File

    def delete_files(self, paths: Sequence[str]) -> dict[str, OSError]:
        """Delete each file that is there (one already gone counts as deleted); returns why each
        path that could not be deleted was not. Every path is tried. On local disk one after
        another; elsewhere, each delete being a round trip, `DELETE_THREADS` at a time."""

        def delete(path: str) -> OSError | None:
            try:
                self.filesystem.delete_file(path)
            except FileNotFoundError:
                return None
            except OSError as error:
                return error
            return None

        if isinstance(self.filesystem, pafs.LocalFileSystem) or len(paths) < 2:
            results = [delete(path) for path in paths]
        else:
            results = list(shared_thread_pool("store-deletes", DELETE_THREADS).map(delete, paths))
        return {path: error for path, error in zip(paths, results) if error is not None}


class PlainStore(Store):
    """A store pyarrow opens but icekeeper knows no conditional writes for (gs://, hdfs://):
    files are written whole as pyarrow writes them; leases cannot live here."""

    kind = "plain"

    def __init__(self, filesystem: pafs.FileSystem) -> None:
        self.filesystem = filesystem

    def _unsupported(self) -> ConditionalWritesUnsupported:
        return ConditionalWritesUnsupported(
            f"{self.filesystem.type_name}: no conditional writes here; put leases on a local or "
            "mounted folder, s3:// or abfss://"
        )

    def create_if_absent(self, path: str, body: bytes) -> bool:
        raise self._unsupported()

    def read_versioned(self, path: str) -> Versioned | None:
        raise self._unsupported()

    def replace_if_unchanged(self, path: str, body: bytes, version: str) -> bool:
        raise self._unsupported()

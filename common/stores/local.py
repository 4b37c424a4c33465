"""Local (or mounted POSIX) folders: whole writes by rename, create-if-absent by `link`.

A file is written under a hidden temporary name in its folder and then renamed over its name
(`rename` is atomic on POSIX), or linked to it (`link` fails if the name exists: the atomic
create-if-absent, with the content complete before the name appears, which `O_EXCL` alone does
not give: a reader could see the empty file; where `link` is refused, as on vfat, SMB and many
FUSE mounts, `O_EXCL` it is). Replace-if-unchanged holds an exclusive `flock` on
a hidden lock file beside the file while it compares and renames, so it is atomic among the
processes of the machines that share the folder's locks (one machine, or NFSv4). A version is the
file's inode and modification time: every write renames a new inode into place.
"""

from __future__ import annotations

import errno
import fcntl
import os
import posixpath
import uuid

from pyarrow import fs as pafs

from icekeeper.common.stores.base import Store, Versioned


class LocalStore(Store):
    kind = "local"

    def __init__(self) -> None:
        self.filesystem = pafs.LocalFileSystem()

    def write_whole(self, path: str, body: bytes, durable: bool = True) -> None:
        """Rename a temporary file over `path`; `durable`: synced before the rename, and the
        folder after (`sync_file`), else left to the kernel (`storage.write_file`)."""
        temporary = _temporary_beside(path)
        _write_new(temporary, body, sync=durable)
        os.replace(temporary, path)
        if durable:
            sync_folder(posixpath.dirname(path))

    def create_if_absent(self, path: str, body: bytes) -> bool:
        temporary = _temporary_beside(path)
        _write_new(temporary, body, sync=True)
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        except OSError as error:
            if error.errno not in _NO_HARD_LINKS:
                raise
            return _create_exclusive(path, body)
        finally:
            os.unlink(temporary)
        sync_folder(posixpath.dirname(path))
        return True

    def read_versioned(self, path: str) -> Versioned | None:
        try:
            with open(path, "rb") as handle:
                # The version of the inode read: a rename after `open` does not change either.
                version = _version(os.fstat(handle.fileno()))
                return Versioned(handle.read(), version)
        except FileNotFoundError:
            return None

    def replace_if_unchanged(self, path: str, body: bytes, version: str) -> bool:
        lock_path = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.lock")
        descriptor = os.open(lock_path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            try:
                current = _version(os.stat(path))
            except FileNotFoundError:
                return False
            if current != version:
                return False
            temporary = _temporary_beside(path)
            _write_new(temporary, body, sync=True)
            os.replace(temporary, path)
            return True
        finally:
            os.close(descriptor)  # releases the lock


_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS}
"""What `link` answers on a filesystem without hard links (vfat/exFAT, SMB and Azure Files
mounts, many FUSE filesystems)."""


def _create_exclusive(path: str, body: bytes) -> bool:
    """Create-if-absent where `link` is refused: `O_EXCL` is atomic too, but the name appears
    before its content, so a reader can see the file empty or partly written for a moment (the
    lease reads such a file as being created, held). A write that fails takes its name back."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        os.unlink(path)
        raise
    sync_folder(posixpath.dirname(path))
    return True


def _temporary_beside(path: str) -> str:
    return posixpath.join(
        posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}.tmp"
    )


def _write_new(path: str, body: bytes, sync: bool) -> None:
    with open(path, "xb") as out:
        out.write(body)
        if sync:
            out.flush()
            os.fsync(out.fileno())


def sync_file(path: str) -> None:
    """Make a written file's bytes durable before its name is published: a rename is atomic but
    not durable, and after a power cut a file renamed into place unsynced can come back empty
    (a moniker read as unreadable, then dead-lettered, its records never committed)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def sync_folder(folder: str) -> None:
    """Make a new name durable (the folder's entry), as a lease must be before it is used."""
    try:
        descriptor = os.open(folder or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems refuse fsync on folders; the rename is still atomic
    finally:
        os.close(descriptor)


def _version(stat: os.stat_result) -> str:
    return f"{stat.st_ino}-{stat.st_mtime_ns}-{stat.st_size}"

"""Open a storage URI or a local path with pyarrow's filesystems: the one place that knows how."""

from __future__ import annotations

import posixpath
import uuid

from pyarrow import fs as pafs

from icekeeper.common.locations import normalize_location


def open_filesystem(uri_or_path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding `uri_or_path` and the path within it. A bare path is local, and so
    is Java's `file:/x` (Iceberg's Spark actions write data file paths that way)."""
    if uri_or_path.startswith("file:") or "://" not in uri_or_path:
        return pafs.LocalFileSystem(), normalize_location(uri_or_path)
    return pafs.FileSystem.from_uri(uri_or_path)


def write_whole(filesystem: pafs.FileSystem, path: str, body: bytes) -> None:
    """Replace the file at `path` whole, so no reader ever sees it half written: one PUT on object
    stores, a hidden temporary file renamed over it elsewhere."""
    if filesystem.type_name in ("s3", "gcs"):
        with filesystem.open_output_stream(path) as out:
            out.write(body)
        return
    temporary = posixpath.join(
        posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}.tmp"
    )
    with filesystem.open_output_stream(temporary) as out:
        out.write(body)
    filesystem.move(temporary, path)


def delete_folder(uri_or_path: str) -> None:
    """Delete a folder and everything in it, if it is there."""
    filesystem, path = open_filesystem(uri_or_path)
    try:
        filesystem.delete_dir(path)
    except FileNotFoundError:
        pass


def path_segment(name: str) -> str:
    """A folder or file name made from a table, writer
    or group name: no separators, no leading dot."""
    cleaned = "".join(char if char.isalnum() or char in "._-" else "_" for char in name)
    return cleaned.lstrip(".") or "_"

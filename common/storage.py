"""Open a storage URI or a local path with pyarrow's filesystems: the one place that knows how."""

from __future__ import annotations

from pyarrow import fs as pafs

from common.locations import normalize_location


def open_filesystem(uri_or_path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding `uri_or_path` and the path within it. A bare path is local, and so
    is Java's `file:/x` (Iceberg's Spark actions write data file paths that way)."""
    if uri_or_path.startswith("file:") or "://" not in uri_or_path:
        return pafs.LocalFileSystem(), normalize_location(uri_or_path)
    return pafs.FileSystem.from_uri(uri_or_path)

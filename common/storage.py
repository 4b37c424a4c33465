"""Open a storage URI or a local path with pyarrow's filesystems: the one place that knows how."""

from __future__ import annotations

from pyarrow import fs as pafs


def open_filesystem(uri_or_path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding `uri_or_path` and the path within it (a bare path is local)."""
    return pafs.FileSystem.from_uri(uri_or_path if "://" in uri_or_path else f"file://{uri_or_path}")

"""One spelling per file location, so sets of paths from Java, pyiceberg and pyarrow compare."""

from __future__ import annotations


def normalize_location(path: str) -> str:
    """`file:/x`, `file:///x` and `/x` name the same local file (Java writes the first form)."""
    if path.startswith("file:"):
        path = "/" + path[len("file:"):].lstrip("/")
    return path.rstrip("/")

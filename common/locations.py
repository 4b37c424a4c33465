"""One spelling per file location, so sets of paths from Java, pyiceberg and pyarrow compare."""

from __future__ import annotations


def normalize_location(path: str) -> str:
    """`file:/x`, `file:///x` and `/x` name the same local file (Java writes the first form)."""
    if path.startswith("file:"):
        path = "/" + path[len("file:") :].lstrip("/")
    return path.rstrip("/")


TABLE_STATE_FOLDER = "icekeeper"
"""Under a table's location: icekeeper's own state of the table (the upsert key index). The
reaper's orphan removal never deletes in it."""


def table_state_folder(table_location: str) -> str:
    """The normalized folder of icekeeper's own state of the table at `table_location`."""
    return normalize_location(f"{table_location.rstrip('/')}/{TABLE_STATE_FOLDER}")

"""One spelling per file location, so sets of paths from Java, pyiceberg and pyarrow compare."""

from __future__ import annotations

import posixpath
import re


def normalize_location(path: str) -> str:
    """`file:/x`, `file:///x` and `/x` name the same local file (Java writes the first form)."""
    if path.startswith("file:"):
        path = "/" + path[len("file:") :].lstrip("/")
    return path.rstrip("/")


def _split_authority(path: str) -> tuple[str, str]:
    """(`scheme://authority`, the path after it) of a URI; ("", path) of a plain path."""
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/]*)(.*)$", path)
    return (match.group(1), match.group(2)) if match else ("", path)


def resolved_location(path: str) -> str:
    """`normalize_location`, with duplicate slashes collapsed and `.` and `..` segments resolved in
    the path (never in a URI's scheme or authority): the spelling to tell which folder holds a
    file by. A string prefix alone would take `<table>/../other/x.parquet` for a file of the
    table."""
    prefix, rest = _split_authority(normalize_location(path))
    if not rest:
        return prefix
    rest = posixpath.normpath(re.sub("/+", "/", rest))
    return prefix + ("" if rest == "." else rest)


def names_parent_folder(path: str) -> bool:
    """Whether `path` has a `..` segment: object stores take it as a literal name where a local
    filesystem climbs out of the folder, so no file icekeeper commits may be named that way."""
    return ".." in _split_authority(normalize_location(path))[1].split("/")


def is_within(path: str, folder: str) -> bool:
    """Whether `path` names something inside `folder`, both resolved (`resolved_location`)."""
    return resolved_location(path).startswith(resolved_location(folder).rstrip("/") + "/")


def table_data_folder(table_location: str) -> str:
    """Where a table's data files go (`<location>/data`, Iceberg's default): writers' batches,
    the reaper's compactions and the bookkeeper's purges all write under it."""
    return f"{table_location.rstrip('/')}/data"


def batch_folder_of(table_location: str, writer_id: str, seq: int) -> str:
    """Where the folders of writer `writer_id`'s batch `seq` are named: `<location>/data/<writer>/
    <seq:012d>`, which the writer follows with a random suffix (`writers/files.py`
    `batch_folder`, whose spelling of the writer id this repeats; tests/common/test_locations.py
    keeps the two one)."""
    writer = "".join(char if char.isalnum() or char in "._-" else "_" for char in writer_id)
    return f"{table_data_folder(table_location)}/{writer}/{seq:012d}"


def is_in_batch_folder(path: str, table_location: str, writer_id: str, seq: int) -> bool:
    """Whether `path` lies in a folder of writer `writer_id`'s batch `seq` (`batch_folder_of`,
    with or without the writer's suffix), both resolved (`resolved_location`). The bookkeeper
    holds a moniker's deleted-keys files to it: they belong to the batch, and one named in
    another batch's folder would delete that batch's keys, and be removed with this batch's files
    while the other batch still needs it."""
    batch = batch_folder_of(table_location, writer_id, seq)
    writer_folder = resolved_location(batch.rsplit("/", 1)[0]).rstrip("/") + "/"
    resolved = resolved_location(path)
    if not resolved.startswith(writer_folder):
        return False
    folder, separator, rest = resolved[len(writer_folder) :].partition("/")
    name = batch.rsplit("/", 1)[1]
    return bool(separator and rest) and (folder == name or folder.startswith(name + "-"))


ICEKEEPER_DATA_FOLDERS = ("icekeeper-deletes", "icekeeper-rewrites")
"""Folders under a table's `data/` that only icekeeper writes: the bookkeeper's position deletes
(`bookkeeper/position_deletes.py` `DELETES_FOLDER`) and the reaper's compacted files
(`common/rewrites.py` `output_folder`); tests/common/test_locations.py keeps them one."""

_BATCH_FOLDER = re.compile(r"^[0-9]{12}(-[0-9a-f]+)?$")


def is_written_by_icekeeper(path: str, table_location: str) -> bool:
    """Whether `path` is a data or delete file icekeeper's roles write into the table at
    `table_location` (a writer's batch folder `data/<writer>/<seq:012d>-<suffix>/`, the
    bookkeeper's deletes, the reaper's compactions), which reach the table with a moniker or a
    rewrite request, never as a file of its own (an Event Grid `BlobCreated` announces them
    too)."""
    data = resolved_location(table_data_folder(table_location)).rstrip("/") + "/"
    resolved = resolved_location(path)
    if not resolved.startswith(data):
        return False
    segments = resolved[len(data) :].split("/")
    if segments[0] in ICEKEEPER_DATA_FOLDERS:
        return True
    # A writer's folder name never holds `=` (`path_segment`); a partition folder's does.
    return len(segments) >= 3 and "=" not in segments[0] and bool(_BATCH_FOLDER.match(segments[1]))


TABLE_STATE_FOLDER = "icekeeper"
"""Under a table's location: icekeeper's own state of the table (the upsert key index). The
reaper's orphan removal never deletes in it."""


def table_state_folder(table_location: str) -> str:
    """The normalized folder of icekeeper's own state of the table at `table_location`."""
    return normalize_location(f"{table_location.rstrip('/')}/{TABLE_STATE_FOLDER}")

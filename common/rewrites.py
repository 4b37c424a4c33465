"""Rewrite requests: how the reaper's compaction of an upsert table reaches the bookkeeper.

Compacting an upsert table replaces data files that the bookkeeper keeps adding position deletes
to. Iceberg's own rewrite refuses to commit when a replaced file got new deletes after the
rewrite started (they would be lost), so while updates continue it never lands. Here the reaper
writes the compacted files (the live rows of the replaced files as of a base snapshot) but does
not commit them: it leaves a request in the table's state folder, and the bookkeeper, the one
that knows every key's row, commits it. Rows updated or deleted since the base snapshot are
deleted again in the new files in the same commit, so nothing is lost or resurrected.

The bookkeeper hands itself requests the same way when it purges an upsert table's mostly-deleted
data files after a commit (`bookkeeper/purges.py`, `origin: bookkeeper`): written and published
before the commit, so a bookkeeper that dies in between leaves a request its successor commits or
refuses, never files a snapshot half names.

A request lives at `<table>/icekeeper/rewrites/<id>.json` until the bookkeeper commits it (its
snapshot carries `icekeeper.rewrite-id`) or refuses it (then `<id>.refused.json` says why, and the
files it names are their writer's to delete: nothing will ever commit them; the reaper deletes its
own, the bookkeeper its purges' at once, `discard_rewrite`). The reaper's orphan removal spares the
folders of pending requests.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pyarrow import fs as pafs
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.locations import normalize_location, table_state_folder
from common.moniker import FileEntry
from common.storage import delete_folder, open_filesystem, write_whole

REWRITE_ID_PROPERTY = "icekeeper.rewrite-id"
"""Snapshot summary property naming the rewrite request a snapshot committed."""
REWRITE_ORIGIN_PROPERTY = "icekeeper.rewrite-origin"
"""Snapshot summary property saying who wrote a rewrite's files (`RewriteRequest.origin`): a
reaper's compaction or a bookkeeper's purge."""
_REFUSED = ".refused.json"


class RewriteRequest(BaseModel):
    """Compacted files that replace `replaced` data files, written from snapshot
    `base_snapshot_id`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    table: str
    base_snapshot_id: int
    replaced: list[str] = Field(description="Data file paths, as the table's manifests spell them.")
    files: list[FileEntry] = Field(
        description="The new data files (all rows of `replaced` live at the base snapshot)."
    )
    schema_: dict[str, Any] = Field(
        alias="schema",
        description="Iceberg schema (pyiceberg JSON) the new files were written with.",
    )
    output_folder: str
    created_ms: int = Field(default_factory=lambda: int(time.time() * 1000))
    origin: Literal["reaper", "bookkeeper"] = Field(
        "reaper",
        description="Who wrote the files and deletes them if the request is refused: the reaper "
        "(a compaction it waits for) or the bookkeeper (a purge of mostly-deleted files).",
    )


def rewrites_folder(table_location: str) -> str:
    return f"{table_state_folder(table_location)}/rewrites"


def output_folder(table_location: str, request_id: str) -> str:
    """Where the reaper writes a request's files: under `data/`, like every data file."""
    return f"{table_location.rstrip('/')}/data/icekeeper-rewrites/{request_id}"


def publish_rewrite(table_location: str, request: RewriteRequest) -> None:
    filesystem, folder = open_filesystem(rewrites_folder(table_location))
    filesystem.create_dir(folder, recursive=True)
    write_whole(
        filesystem, f"{folder}/{request.id}.json", request.model_dump_json(by_alias=True).encode()
    )


def pending_rewrites(table_location: str) -> list[RewriteRequest | tuple[str, str]]:
    """Requests waiting for the bookkeeper, oldest
    first; an unreadable one as (its id, the reason)."""
    filesystem, folder = open_filesystem(rewrites_folder(table_location))
    try:
        listed = filesystem.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    except FileNotFoundError:
        return []
    found: list[RewriteRequest | tuple[str, str]] = []
    for info in sorted(listed, key=lambda info: info.mtime_ns or 0):
        name = info.base_name
        if (
            info.type != pafs.FileType.File
            or not name.endswith(".json")
            or name.endswith(_REFUSED)
            or name.startswith(".")
        ):
            continue
        try:
            with filesystem.open_input_stream(info.path) as stream:
                found.append(RewriteRequest.model_validate_json(stream.read()))
        except FileNotFoundError:
            continue  # committed or refused meanwhile
        except (OSError, ValidationError) as error:
            found.append((name.removesuffix(".json"), f"unreadable rewrite request: {error}"))
    return found


def pending_rewrite_folders(table_location: str) -> set[str]:
    """The output folders of pending requests (normalized), which orphan removal must spare."""
    return {
        normalize_location(request.output_folder)
        for request in pending_rewrites(table_location)
        if isinstance(request, RewriteRequest)
    }


def finish_rewrite(table_location: str, request_id: str) -> None:
    """Drop a request the bookkeeper committed (its snapshot names it)."""
    _delete(table_location, f"{request_id}.json")


def refuse_rewrite(table_location: str, request_id: str, reason: str) -> None:
    """Mark a request refused with `reason` (the refusal
    first, so a crash between leaves it refused)."""
    filesystem, folder = open_filesystem(rewrites_folder(table_location))
    write_whole(filesystem, f"{folder}/{request_id}{_REFUSED}", reason.encode())
    finish_rewrite(table_location, request_id)


def discard_rewrite(table_location: str, request: RewriteRequest) -> None:
    """Drop a request that cannot be committed, and its files, for a writer that does not wait
    for a refusal (the bookkeeper's purges): nothing will ever commit them. The request first: a
    crash between leaves files no pending request names, which orphan removal takes after its
    grace."""
    finish_rewrite(table_location, request.id)
    delete_folder(request.output_folder)


def refusal(table_location: str, request_id: str) -> str | None:
    """Why the bookkeeper refused request `request_id`, None if it did not (yet)."""
    filesystem, folder = open_filesystem(rewrites_folder(table_location))
    try:
        with filesystem.open_input_stream(f"{folder}/{request_id}{_REFUSED}") as stream:
            return stream.read().decode()
    except FileNotFoundError:
        return None


def forget_refusal(table_location: str, request_id: str) -> None:
    _delete(table_location, f"{request_id}{_REFUSED}")


def _delete(table_location: str, name: str) -> None:
    """Delete file `name` of the table's rewrites folder, if it is there."""
    filesystem, folder = open_filesystem(rewrites_folder(table_location))
    try:
        filesystem.delete_file(f"{folder}/{name}")
    except FileNotFoundError:
        pass


def is_pending(table_location: str, request_id: str) -> bool:
    filesystem, folder = open_filesystem(rewrites_folder(table_location))
    return filesystem.get_file_info(f"{folder}/{request_id}.json").type == pafs.FileType.File

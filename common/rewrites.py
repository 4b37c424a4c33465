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

Before its commit the bookkeeper writes `<id>.committing`, removed only once the request is
finished (or the compare-and-swap definitely lost): the one trace of a commit that outlives the
snapshot that made it. A request found with it that is neither in the table's history nor has a
file in the current snapshot may have been committed and its snapshot expired since; refused then,
its files are nobody's to delete (orphan removal, which knows every snapshot's files, takes them
once no snapshot names them).

A request that cannot proceed (its files missing past `bookkeeper.missing_file_timeout`, or not a
readable request) is set aside, whole, with the reason at `<rewrites>/set-aside/<id>.json`: the
operator's dead letter (`icekeeper dead-letters list --rewrites`, `replay` publishes it again).
Orphan removal spares its folder as a pending request's.

Every file here is written whole under a name only one role writes (the request by its writer,
the marks and the refusal by the bookkeeper), through the storage door on any store; a stale
bookkeeper that writes a mark after its successor did writes the same facts again.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pyarrow import fs as pafs
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from icekeeper.common.locations import normalize_location, table_state_folder
from icekeeper.common.moniker import FileEntry
from icekeeper.common.storage import (
    delete_folder,
    make_folder,
    open_filesystem,
    read_whole,
    write_whole,
)

REWRITE_ID_PROPERTY = "icekeeper.rewrite-id"
"""Snapshot summary property naming the rewrite request a snapshot committed."""
REWRITE_ORIGIN_PROPERTY = "icekeeper.rewrite-origin"
"""Snapshot summary property saying who wrote a rewrite's files (`RewriteRequest.origin`): a
reaper's compaction or a bookkeeper's purge."""
_REFUSED = ".refused.json"
_COMMITTING = ".committing"
SET_ASIDE_FOLDER = "set-aside"


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
    make_folder(filesystem, folder)
    write_whole(
        filesystem, f"{folder}/{request.id}.json", request.model_dump_json(by_alias=True).encode()
    )


@dataclass(frozen=True)
class UnreadableRewrite:
    """A pending request that could not be read: why, and its bytes when storage served them
    (None: storage failed to, an outage, and it stays pending; else it is not a request)."""

    request_id: str
    reason: str
    content: bytes | None


def pending_rewrites(table_location: str) -> list[RewriteRequest | UnreadableRewrite]:
    """Requests waiting for the bookkeeper, oldest first; unreadable ones as `UnreadableRewrite`."""
    filesystem, folder = open_filesystem(rewrites_folder(table_location))
    try:
        listed = filesystem.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    except FileNotFoundError:
        return []
    found: list[RewriteRequest | UnreadableRewrite] = []
    for info in sorted(listed, key=lambda info: info.mtime_ns or 0):
        name = info.base_name
        if (
            info.type != pafs.FileType.File
            or not name.endswith(".json")
            or name.endswith(_REFUSED)
            or name.startswith(".")
        ):
            continue
        request_id = name.removesuffix(".json")
        try:
            content = read_whole(filesystem, info.path)
        except FileNotFoundError:
            continue  # committed or refused meanwhile
        except OSError as error:
            found.append(UnreadableRewrite(request_id, f"storage error: {error}", None))
            continue
        try:
            found.append(RewriteRequest.model_validate_json(content))
        except ValidationError as error:
            found.append(
                UnreadableRewrite(request_id, f"unreadable rewrite request: {error}", content)
            )
    return found


def pending_rewrite_folders(table_location: str) -> set[str]:
    """The output folders (normalized) of pending requests and of those set aside, which orphan
    removal must spare: the first are still to be committed, the second wait for the operator.
    A pending request storage could not serve (an outage: no bytes) names a folder that cannot
    be known, so this raises `OSError` and orphan removal is skipped, rather than deleting the
    files the bookkeeper will commit once storage answers."""
    pending = pending_rewrites(table_location)
    unserved = [
        request
        for request in pending
        if isinstance(request, UnreadableRewrite) and request.content is None
    ]
    if unserved:
        raise OSError(
            f"rewrite request {unserved[0].request_id} could not be read "
            f"({unserved[0].reason}); its output folder is unknown"
        )
    return {
        normalize_location(request.output_folder)
        for request in pending
        if isinstance(request, RewriteRequest)
    } | {
        normalize_location(entry.request.output_folder)
        for entry in set_aside_rewrites(table_location)
        if entry.request is not None
    }


def mark_commit_attempt(table_location: str, request_id: str) -> None:
    """Record, durably and before the commit, that request `request_id` is being committed: what
    says "maybe committed" once the snapshot that committed it has expired."""
    filesystem, folder = open_filesystem(rewrites_folder(table_location))
    write_whole(
        filesystem,
        f"{folder}/{request_id}{_COMMITTING}",
        json.dumps({"attempted_ms": int(time.time() * 1000)}).encode(),
    )


def commit_attempted(table_location: str, request_id: str) -> bool:
    """Whether a commit of request `request_id` was attempted with an outcome never settled (or
    it landed and the request is not finished yet): see `mark_commit_attempt`."""
    filesystem, folder = open_filesystem(rewrites_folder(table_location))
    return filesystem.get_file_info(f"{folder}/{request_id}{_COMMITTING}").type == (
        pafs.FileType.File
    )


def clear_commit_attempt(table_location: str, request_id: str) -> None:
    """Forget a commit attempt that definitely did not land (its compare-and-swap lost)."""
    _delete(table_location, f"{request_id}{_COMMITTING}")


def finish_rewrite(table_location: str, request_id: str) -> None:
    """Drop a request the bookkeeper committed (its snapshot names it), then its attempt mark."""
    _delete(table_location, f"{request_id}.json")
    clear_commit_attempt(table_location, request_id)


def refuse_rewrite(table_location: str, request_id: str, reason: str) -> None:
    """Mark a request refused with `reason` (the refusal first, so a crash between leaves it
    refused). An attempt mark stays: the writer must not delete the files then
    (`commit_attempted`), and `forget_refusal` drops it."""
    filesystem, folder = open_filesystem(rewrites_folder(table_location))
    write_whole(filesystem, f"{folder}/{request_id}{_REFUSED}", reason.encode())
    _delete(table_location, f"{request_id}.json")


def discard_rewrite(table_location: str, request: RewriteRequest) -> None:
    """Drop a request that cannot be committed, and its files, for a writer that does not wait
    for a refusal (the bookkeeper's purges): nothing will ever commit them. The request first: a
    crash between leaves files no pending request names, which orphan removal takes after its
    grace. Only for a request whose commit was never attempted (`commit_attempted`)."""
    finish_rewrite(table_location, request.id)
    delete_folder(request.output_folder)


class SetAsideRewrite(BaseModel):
    """A request the bookkeeper set aside: why, when, and the request (or the bytes that were not
    one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str
    reason: str
    set_aside_ms: int = Field(default_factory=lambda: int(time.time() * 1000))
    request: RewriteRequest | None = None
    content: str | None = Field(None, description="An unreadable request's text, as it was.")


def set_aside_rewrite(
    table_location: str,
    request_id: str,
    reason: str,
    request: RewriteRequest | None = None,
    content: bytes | None = None,
) -> None:
    """Move a pending request out of the queue with `reason`, keeping it whole (and its files):
    the copy first, so a crash between leaves it pending, set aside again by the next poll. An
    attempt mark stays with it."""
    entry = SetAsideRewrite(
        request_id=request_id,
        reason=reason,
        request=request,
        content=content.decode("utf-8", "replace") if content is not None else None,
    )
    filesystem, folder = open_filesystem(f"{rewrites_folder(table_location)}/{SET_ASIDE_FOLDER}")
    make_folder(filesystem, folder)
    write_whole(
        filesystem, f"{folder}/{request_id}.json", entry.model_dump_json(by_alias=True).encode()
    )
    _delete(table_location, f"{request_id}.json")


def set_aside_rewrites(table_location: str) -> list[SetAsideRewrite]:
    """The requests set aside for table `table_location`, oldest first."""
    filesystem, folder = open_filesystem(f"{rewrites_folder(table_location)}/{SET_ASIDE_FOLDER}")
    try:
        listed = filesystem.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    except FileNotFoundError:
        return []
    found = []
    for info in sorted(listed, key=lambda info: info.mtime_ns or 0):
        if info.type != pafs.FileType.File or not info.base_name.endswith(".json"):
            continue
        if info.base_name.startswith("."):
            continue
        try:
            found.append(SetAsideRewrite.model_validate_json(read_whole(filesystem, info.path)))
        except FileNotFoundError:
            continue  # replayed meanwhile
    return found


def set_aside_reason(table_location: str, request_id: str) -> str | None:
    """Why request `request_id` was set aside, None if it was not."""
    filesystem, folder = open_filesystem(f"{rewrites_folder(table_location)}/{SET_ASIDE_FOLDER}")
    try:
        stored = read_whole(filesystem, f"{folder}/{request_id}.json")
        return SetAsideRewrite.model_validate_json(stored).reason
    except FileNotFoundError:
        return None


def replay_set_aside(table_location: str, entry: SetAsideRewrite) -> None:
    """Publish a set-aside request again (once its cause is fixed), then drop the set-aside copy
    (a crash between leaves both: the next bookkeeper poll sets it aside again if it still cannot
    proceed, or commits it, and a replay after it finds the request pending). Its attempt mark,
    if any, stays: the request may have been committed."""
    if entry.request is None:
        raise ValueError(f"{entry.request_id}: not a readable request; nothing to replay")
    publish_rewrite(table_location, entry.request)
    filesystem, folder = open_filesystem(f"{rewrites_folder(table_location)}/{SET_ASIDE_FOLDER}")
    try:
        filesystem.delete_file(f"{folder}/{entry.request_id}.json")
    except FileNotFoundError:
        pass


def refusal(table_location: str, request_id: str) -> str | None:
    """Why the bookkeeper refused request `request_id`, None if it did not (yet)."""
    filesystem, folder = open_filesystem(rewrites_folder(table_location))
    try:
        return read_whole(filesystem, f"{folder}/{request_id}{_REFUSED}").decode()
    except FileNotFoundError:
        return None


def forget_refusal(table_location: str, request_id: str) -> None:
    """Drop a refusal its writer has acted on, then the request's attempt mark."""
    _delete(table_location, f"{request_id}{_REFUSED}")
    clear_commit_attempt(table_location, request_id)


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

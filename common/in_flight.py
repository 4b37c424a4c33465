"""Claims on the batch folders a writer is still filling, so orphan removal leaves them alone.

Orphan removal deletes files that no snapshot reaches and that are older than a grace period.
Files named by a published moniker are spared by name, but a batch's first files exist before
its moniker does: a batch that outlives the grace (a slow partition, memory pressure, many
tables in one batch) had files that were old, unreferenced and not yet pending. The long chaos
run found it: a 138 s batch against a 120 s grace lost a file the bookkeeper then committed.

The protocol, on any store the storage door opens (each claim is written whole under a name of
its own, and listed with its modification time: no store guarantee beyond that is needed):
- a writer claims `<table location>/data/_in_flight/<name>.json` (naming the batch folder)
  before it writes there, rewrites the claim every heartbeat while the batch runs, and releases
  it once the batch's moniker is published (or the batch is given up);
- the reaper reads live claims (rewritten within the grace) *before* it reads pending monikers,
  and those before Iceberg lists what snapshots reach. Whatever a file's moniker did meanwhile,
  one of the three covers it: claimed at the first read, or pending at the second, or committed
  by the third; a claim made after the first read is younger than the grace, and so is its file.
A writer that dies leaves a claim that stops being rewritten; after the grace its folder is
orphaned like any other, and the reaper deletes the stale claim.
"""

from __future__ import annotations

import json
import logging
import posixpath
import threading
import time
import uuid
from dataclasses import dataclass

from pyarrow import fs as pafs

from icekeeper.common.locations import normalize_location
from icekeeper.common.storage import (
    delete_file,
    open_filesystem,
    read_whole,
    write_file,
    write_whole,
)

log = logging.getLogger(__name__)

CLAIMS_FOLDER = "_in_flight"
"""Under the table's `data/` folder; hidden (leading `_`) like Spark's `_temporary`."""


def claims_folder(table_location: str) -> str:
    return f"{table_location.rstrip('/')}/data/{CLAIMS_FOLDER}"


@dataclass
class _Claim:
    path: str
    body: bytes


class InFlightClaims:
    """A writer's claims, refreshed by a daemon thread every `heartbeat_s` until released."""

    def __init__(self, writer_id: str, heartbeat_s: float) -> None:
        self.writer_id = writer_id
        self.heartbeat_s = heartbeat_s
        self._claims: dict[str, _Claim] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def claim(self, table_location: str, batch_folder: str) -> None:
        """Claim `batch_folder` before writing into it; raises if the claim cannot be written,
        since files written without one could be taken for orphans."""
        name = f"{posixpath.basename(batch_folder.rstrip('/'))}-{uuid.uuid4().hex[:8]}.json"
        path_uri = f"{claims_folder(table_location)}/{name}"
        body = json.dumps({"folder": batch_folder, "writer": self.writer_id}).encode()
        # Not synced (`durable=False`): a claim protects a folder while its writer lives, and a
        # power cut ends both. A sync is a journal commit, which on a busy disk waits for every
        # other process's writes (issue 27: 10-17 ms a sync on average under load, two per batch
        # and table). A claim a power cut left empty pauses orphan removal until it goes stale
        # (`live_claimed_folders`).
        write_file(path_uri, body, durable=False)
        with self._lock:
            self._claims[batch_folder] = _Claim(path_uri, body)
        self._start()

    def release(self, batch_folders: list[str]) -> None:
        """Drop the claims on these folders (their moniker is published, or they were discarded)."""
        with self._lock:
            released = [
                self._claims.pop(folder) for folder in batch_folders if folder in self._claims
            ]
        for claim in released:
            try:
                delete_file(claim.path)
            except OSError as error:
                # Harmless: a claim no one rewrites goes stale and the reaper removes it.
                log.warning(
                    "could not release an in-flight claim",
                    extra={"claim": claim.path, "error": str(error)},
                )

    def held(self) -> list[str]:
        with self._lock:
            return list(self._claims)

    def close(self) -> None:
        self._stop.set()
        self.release(self.held())

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._refresh_loop, name="in-flight-claims", daemon=True
            )
            self._thread.start()

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with self._lock:
                claims = list(self._claims.values())
            for claim in claims:
                try:
                    write_file(claim.path, claim.body, durable=False)
                except OSError as error:
                    log.warning(
                        "could not refresh an in-flight claim",
                        extra={"claim": claim.path, "error": str(error)},
                    )
            # A claim released while being rewritten would be re-created: delete it again.
            with self._lock:
                current = {claim.path for claim in self._claims.values()}
            for claim in claims:
                if claim.path not in current:
                    try:
                        delete_file(claim.path)
                    except OSError:
                        pass


def live_claimed_folders(
    table_location: str, grace_s: float, remove_stale: bool = True
) -> set[str]:
    """Batch folders claimed by a claim rewritten within `grace_s` (normalized: no scheme for
    local paths, no trailing slash). Stale claims are deleted unless `remove_stale` is False."""
    filesystem, folder = open_filesystem(claims_folder(table_location))
    listed_at = time.time()
    listed = [
        info
        for info in filesystem.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        if info.type == pafs.FileType.File and info.path.endswith(".json")
    ]
    if listed and remove_stale:
        listed_at = _store_clock(filesystem, folder)
    folders: set[str] = set()
    for info in listed:
        age_s = listed_at - info.mtime.timestamp() if info.mtime is not None else 0.0
        if age_s > grace_s:
            if remove_stale:
                try:
                    filesystem.delete_file(info.path)
                except (FileNotFoundError, OSError):
                    pass
            continue
        try:
            claimed = json.loads(read_whole(filesystem, info.path))["folder"]
        except FileNotFoundError:
            continue  # released since the listing
        except (OSError, ValueError, KeyError) as error:
            # Half-written or unreadable: it cannot say which folder it protects, so nothing is
            # deleted this pass rather than guessing.
            raise RuntimeError(
                f"in-flight claim {info.path} is unreadable ({error}); orphan removal skipped"
            ) from error
        folders.add(normalize_location(claimed))
    return folders


def _store_clock(filesystem: pafs.FileSystem, folder: str) -> float:
    """The store's time now, as the modification time of a file written there now.

    A claim's age is its modification time, which the store stamps with its own clock (S3's,
    Azure's); measured against this node's clock, a reaper running ahead of the store by more
    than the grace less a heartbeat took live claims for stale and deleted them, and orphan
    removal then deleted the files of batches still being written. Against the store's clock the
    reaper's own is out of it. A dry run writes nothing, and reads the reaper's clock instead."""
    probe = f"{folder}/.clock-{uuid.uuid4().hex[:12]}"
    write_whole(filesystem, probe, b"")
    try:
        stamped = filesystem.get_file_info(probe).mtime
    finally:
        try:
            filesystem.delete_file(probe)
        except OSError:
            pass  # a leftover probe is not a claim (not `.json`); the next pass's may go
    if stamped is None:
        return time.time()
    return stamped.timestamp()


def under_any(location: str, folders: set[str]) -> bool:
    """Whether the normalized `location` lies inside one of `folders`."""
    path = normalize_location(location)
    return any(path.startswith(folder + "/") for folder in folders)

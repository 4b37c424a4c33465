"""Leases and epochs: at most one active bookkeeper per group, and a stale one can never commit.

A lease is a file `lease-<epoch>.json` in a folder. Acquiring one creates the file for the next
epoch, exclusively, once the current holder's lease has expired; the holder renews it by
rewriting its own file. The epoch is also written into every snapshot the bookkeeper commits,
and each commit is a compare-and-swap on the snapshot its state was read from, so a bookkeeper
paused past its lease (SIGSTOP, a long GC) that wakes up and commits either finds a newer epoch
in the table and stops, or commits on top of the newest state (exactly-once still holds); its
next lease check then sees the newer lease and stops it with a clear log line. Iceberg's Kafka
Connect sink lacks this and loses data to zombie coordinators (apache/iceberg#17551).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from icekeeper.common.storage import path_segment

log = logging.getLogger(__name__)
_LEASE_NAME = re.compile(r"^lease-(\d{12})\.json$")


class Fenced(RuntimeError):
    """Another bookkeeper holds a newer lease: this one must stop committing."""


@dataclass(frozen=True)
class LeaseRecord:
    epoch: int
    owner: str
    renewed_ms: int
    ttl_ms: int

    def expired(self, now_ms: int) -> bool:
        return now_ms - self.renewed_ms > self.ttl_ms


class Lease:
    """The lease of one bookkeeper group (or its reaper), in a local (or mounted) folder."""

    def __init__(
        self,
        folder: str,
        group: str,
        ttl_s: float,
        owner: str | None = None,
        role: str = "bookkeeper",
    ) -> None:
        self.role = role
        self.folder = Path(folder) / path_segment(group)
        self.ttl_ms = int(ttl_s * 1000)
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.epoch: int | None = None

    def acquire(
        self,
        timeout_s: float | None = None,
        poll_s: float = 0.5,
        stop: threading.Event | None = None,
        on_wait: Callable[[LeaseRecord], None] | None = None,
    ) -> int | None:
        """Wait until the lease is free (or expired), take it with the next epoch; returns the
        epoch, or None once `stop` is set (a standby told to stop must not wait for the lease:
        SIGTERM ends it at once). `on_wait` hears of the current holder at every poll while this
        one stands by."""
        self.folder.mkdir(parents=True, exist_ok=True)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        announced = False
        while stop is None or not stop.is_set():
            current = _newest_lease(self.folder, self.ttl_ms)
            now = _now_ms()
            if current is None or current.expired(now):
                epoch = (current.epoch if current else 0) + 1
                if self._create(epoch):
                    self.epoch = epoch
                    # A bookkeeper taking over matters to operators; a reaper's pass does not.
                    log.log(
                        logging.WARNING if self.role == "bookkeeper" else logging.INFO,
                        f"{self.role} lease acquired",
                        extra={"epoch": epoch, "owner": self.owner, "group": self.folder.name},
                    )
                    return epoch
            else:
                if not announced:
                    log.warning(
                        f"another {self.role} holds the lease; standing by",
                        extra={"holder": current.owner, "epoch": current.epoch},
                    )
                    announced = True
                if on_wait is not None:
                    on_wait(current)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"lease of {self.folder.name} still held by {current.owner if current else '?'}"
                )
            if stop is None:
                time.sleep(poll_s)
            else:
                stop.wait(poll_s)
        return None

    def renew(self) -> None:
        """Extend the lease; raises `Fenced` if a newer epoch exists."""
        self.check()
        assert self.epoch is not None
        self._write(
            self.folder / _name(self.epoch),
            LeaseRecord(self.epoch, self.owner, _now_ms(), self.ttl_ms),
            exclusive=False,
        )

    def check(self) -> None:
        """Raise `Fenced` when a newer lease exists (or ours expired and was taken)."""
        if self.epoch is None:
            raise Fenced("no lease held")
        newest = _newest_lease(self.folder, self.ttl_ms)
        if newest is not None and newest.epoch > self.epoch:
            raise Fenced(
                f"{self.role} epoch {self.epoch} is stale: {newest.owner} holds epoch "
                f"{newest.epoch}; stopping without committing"
            )

    def release(self) -> None:
        """Expire our lease now so a successor does not wait for the TTL."""
        if self.epoch is None:
            return
        path = self.folder / _name(self.epoch)
        try:
            record = _read(path)
            if record is not None and record.owner == self.owner:
                self._write(
                    path, LeaseRecord(self.epoch, self.owner, 0, self.ttl_ms), exclusive=False
                )
        except OSError:
            pass

    def _create(self, epoch: int) -> bool:
        return self._write(
            self.folder / _name(epoch),
            LeaseRecord(epoch, self.owner, _now_ms(), self.ttl_ms),
            exclusive=True,
        )

    @staticmethod
    def _write(path: Path, record: LeaseRecord, exclusive: bool) -> bool:
        payload = json.dumps(record.__dict__).encode()
        if exclusive:
            try:
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(descriptor, "wb") as out:
                out.write(payload)
                out.flush()
                os.fsync(out.fileno())
            return True
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:6]}")
        temporary.write_bytes(payload)
        os.replace(temporary, path)
        return True


def live_lease(folder: str, group: str) -> LeaseRecord | None:
    """The lease of `group` in `folder` while someone holds it, None when it is free, expired or
    released. A bookkeeper renews its lease every cycle, so a live lease is how another process
    (the reaper) tells that the group's bookkeeper is running, and who it is."""
    newest = _newest_lease(Path(folder) / path_segment(group), ttl_ms=1000)
    return newest if newest is not None and not newest.expired(_now_ms()) else None


def _newest_lease(folder: Path, ttl_ms: int) -> LeaseRecord | None:
    """The lease of the highest epoch in `folder`, None if there is none; one being created (not
    readable yet) as held for `ttl_ms` from now."""
    epochs = sorted(
        (int(m.group(1)) for p in folder.glob("lease-*.json") if (m := _LEASE_NAME.match(p.name))),
        reverse=True,
    )
    for epoch in epochs:
        record = _read(folder / _name(epoch))
        if record is not None:
            return record
        # A lease file being created right now: treat it as held, fresh.
        return LeaseRecord(epoch, "(being created)", _now_ms(), ttl_ms)
    return None


def _read(path: Path) -> LeaseRecord | None:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return LeaseRecord(
            int(raw["epoch"]), str(raw["owner"]), int(raw["renewed_ms"]), int(raw["ttl_ms"])
        )
    except (OSError, ValueError, KeyError):
        return None


def _name(epoch: int) -> str:
    return f"lease-{epoch:012d}.json"


def _now_ms() -> int:
    return int(time.time() * 1000)

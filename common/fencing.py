"""Leases and epochs: at most one active bookkeeper per group, and a stale one can never commit.

A lease is a file `lease-<epoch>.json` in the group's folder of `group.lease_uri`, on any store
the storage door opens: a local or mounted folder, `s3://`, `abfss://`. It relies on one guarantee
only, the store's atomic create-if-absent (`common/storage.py`: `link` on a local folder,
`If-None-Match: *` on S3 and Azure Blob): of two bookkeepers creating the file of one epoch, exactly
one succeeds. So no shared POSIX volume is needed, and nothing relies on renames, `O_EXCL` or a
compare-and-swap of one object (which s3proxy, for one, does not make atomic).

- Acquire: once the newest lease has expired (or was released), create the next epoch's file. The
  creator holds the lease with that epoch; a loser reads the new lease and stands by.
- Renew: rewrite the holder's own file (no one else writes it), after checking that the next
  epoch's file does not exist. A holder that did not renew within half its TTL (paused, a long
  GC, a slow store) may have been taken over: it creates the next epoch's file itself, and holds
  the lease with that epoch if it succeeds; if a standby created it first, the holder is fenced.
- Check (before every commit): the next epoch's file exists -> fenced; one read, no listing.

The epoch is also written into every snapshot the bookkeeper commits, and each commit is a
compare-and-swap on the snapshot its state was read from, so a bookkeeper paused between its last
check and its commit (SIGSTOP, a long GC) that wakes up and commits either finds a newer epoch in
the table and stops, or commits on top of the newest state (exactly-once still holds); its next
check then sees the newer lease and stops it with a clear log line. Iceberg's Kafka Connect sink
lacks this and loses data to zombie coordinators (apache/iceberg#17551). Whether a lease expired
is judged by the reader's wall clock against the holder's: nodes need clocks within a fraction of
the TTL of each other (NTP), and a skew beyond it costs a takeover, never a double commit. A
standby that has seen the same lease unrenewed for its TTL by its own monotonic clock takes it as
well, so a dead holder whose clock ran ahead (or a lease file left unreadable) does not keep the
group without a bookkeeper for the skew (or for ever).

Stopping (SIGTERM) never waits on the lease's store. A store that accepts the connection and
never answers (a hung S3 server, a proxy holding the request) keeps one call for its client's
timeouts and retries (botocore: 3 attempts of 30 s, up to two minutes), and a bookkeeper must stop
within a second in every state. So each call a `Lease` makes to its store runs in a daemon thread
of its own, and the caller waits for it or for its `stop` flag: once `stop` is set, a call not
answered within `STOP_GRACE_S` is abandoned and the caller hears `Stopped`. On a store that
answers (milliseconds), every call completes as before, so a cycle under way when the signal came
still finishes. Why this is safe: the `Lease`'s state (`epoch`, the attempt it remembers) changes
only on the caller's thread, from answers it received; an abandoned call's answer is never read.
What an abandoned call does may still land on the store: a create of the next epoch, a renewal.
That file is nobody's: the process stops and never learns it landed (`acquire` returns None, so
the bookkeeper never takes the `Lease` as held; once it gave up a call, a `Lease` is abandoned:
every later call raises `Stopped` and `release` does nothing). It expires after its TTL, which a
successor waits out as after a kill (`SIGKILL`, a lost node); until then a reader that tells from
the lease whether a bookkeeper runs (the reaper's compaction wait, `icekeeper status`) takes it
for one, as after a kill too. Nothing commits under it: commits carry the epoch of a lease their
bookkeeper holds, and this process holds none.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from icekeeper.common.storage import (
    ConditionalWritesUnsupported,
    create_if_absent,
    file_exists,
    list_files,
    path_segment,
    prepare_conditional_writes,
    read_file,
    write_file,
)

log = logging.getLogger(__name__)
_LEASE_NAME = re.compile(r"^lease-(\d{12})\.json$")
_BEING_CREATED = "(being created)"
_T = TypeVar("_T")

STOP_GRACE_S = 0.5
"""How long a call to the lease's store may still take once the lease's owner is told to stop:
a store that answers does so in milliseconds; one that did not by then is abandoned (`Stopped`)."""


class Fenced(RuntimeError):
    """Another bookkeeper holds a newer lease: this one must stop committing."""


class Stopped(RuntimeError):
    """The lease's owner was told to stop (its `stop` flag: SIGTERM) while the lease's store did not
    answer a call: the call was abandoned, and the lease with it (see the module docstring). Not
    fenced and not an outage: the owner stops as it would have anyway, without the lease."""


@dataclass(frozen=True)
class LeaseRecord:
    epoch: int
    owner: str
    renewed_ms: int
    ttl_ms: int

    def expired(self, now_ms: int) -> bool:
        return now_ms - self.renewed_ms > self.ttl_ms


class Lease:
    """The lease of one bookkeeper group (or its reaper), in a folder of any store."""

    def __init__(
        self,
        folder: str,
        group: str,
        ttl_s: float,
        owner: str | None = None,
        role: str = "bookkeeper",
        stop: threading.Event | None = None,
    ) -> None:
        """`stop`: the owner's stop flag (set by its SIGTERM handler); once set, `acquire` stops
        waiting and no call waits on a store that does not answer (`STOP_GRACE_S`)."""
        self.role = role
        self.stop = stop
        self.group = group
        self.folder = group_folder(folder, group)
        self.ttl_ms = int(ttl_s * 1000)
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.epoch: int | None = None
        self._written_at = 0.0
        """When (monotonic) this holder's last write of its lease began."""
        self._tried: tuple[int, float] | None = None
        """The epoch this one last tried to create, and when (monotonic) the attempt began."""
        self.abandoned = False
        """Whether a call to the store was given up while stopping: the lease is nobody's then."""

    def acquire(
        self,
        timeout_s: float | None = None,
        poll_s: float = 0.5,
        on_wait: Callable[[LeaseRecord], None] | None = None,
        on_outage: Callable[[Exception], None] | None = None,
    ) -> int | None:
        """Wait until the lease is free (or expired), take it with the next epoch; returns the
        epoch, or None once the lease's `stop` is set (a standby told to stop must not wait for
        the lease, nor for a poll its store does not answer: SIGTERM ends it at once). `on_wait`
        hears of the current holder at every poll while this one stands by, `on_outage` of each
        poll the lease's store did not answer."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        announced = False
        stop = self.stop
        unchanged = _Unchanged()
        known: int | None = None
        failures = 0
        try:
            self._call(prepare_conditional_writes, self.folder)
        except Stopped:
            return None
        while stop is None or not stop.is_set():
            try:
                epoch, current = self._poll(known, unchanged)
            except Stopped:
                return None  # whatever the abandoned poll does, this one never holds the lease
            except ConditionalWritesUnsupported:
                # Not an outage: the configured store cannot hold a lease at all (gs://, hdfs://).
                # Waiting would keep the group without a bookkeeper for good, saying only that
                # the store does not answer.
                raise
            except Exception as error:  # the lease's store not answering now
                # A standby (or a bookkeeper starting) outlives an outage of the lease's store:
                # it cannot take the lease meanwhile, and nothing else depends on it; ended, it
                # would leave the group without a standby until someone restarted it.
                failures += 1
                wait_s = min(30.0, poll_s * 2 ** min(failures, 6))
                log.warning(
                    f"{self.role} lease store not answering; trying again",
                    extra={"group": self.group, "error": repr(error), "retry_in_s": wait_s},
                )
                if on_outage is not None:
                    on_outage(error)
                if deadline is not None and time.monotonic() > deadline:
                    raise
                if stop is None:
                    time.sleep(wait_s)
                else:
                    stop.wait(wait_s)
                continue
            failures = 0
            if epoch is not None:
                return epoch
            if current is None:
                continue  # another took this epoch first: read its lease now
            known = current.epoch
            if not announced:
                log.warning(
                    f"another {self.role} holds the lease; standing by",
                    extra={"holder": current.owner, "epoch": current.epoch},
                )
                announced = True
            if on_wait is not None:
                on_wait(current)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"lease of {self.group} still held by {current.owner}")
            if stop is None:
                time.sleep(poll_s)
            else:
                stop.wait(poll_s)
        return None

    def _poll(
        self, known: int | None, unchanged: _Unchanged
    ) -> tuple[int | None, LeaseRecord | None]:
        """One look at the lease: (the epoch taken, None) when this one took it; (None, the
        holder's lease) while another holds it; (None, None) when another took the epoch this
        one tried first (look again at once)."""
        # Standing by, each poll reads the known newest lease and probes for the next one (a
        # read and a HEAD); listing every lease file (never deleted: 3,000 of them take 0.85 s
        # to list and read on s3proxy) is left to the first poll and to a lease that looks
        # free, so that the decision to take one rests on a full listing.
        current = self._call(_newest_lease, self.folder, self.ttl_ms, known)
        if known is not None and _free(current, unchanged):
            current = self._call(_newest_lease, self.folder, self.ttl_ms)
        if current is not None and self._tried is not None and self._own_attempt(current):
            # This one's own create, which landed though the call failed (an SDK that gave up
            # after its retries, the answer lost): held since the attempt began. Read as
            # another's, it kept the group without a bookkeeper until it expired.
            self.epoch, self._written_at = current.epoch, self._tried[1]
            self._log_acquired(current.epoch)
            return current.epoch, None
        if not _free(current, unchanged):
            return None, current
        epoch = (current.epoch if current else 0) + 1
        if not self._create(epoch):
            return None, None
        self.epoch = epoch
        self._log_acquired(epoch)
        return epoch, None

    def _own_attempt(self, lease: LeaseRecord) -> bool:
        """Whether `lease` is what this one's last attempt to create an epoch created."""
        return self._tried is not None and (lease.epoch, lease.owner) == (
            self._tried[0],
            self.owner,
        )

    def _log_acquired(self, epoch: int) -> None:
        self._tried = None  # nothing of an earlier attempt left to take
        # A bookkeeper taking over matters to operators; a reaper's pass does not.
        log.log(
            logging.WARNING if self.role == "bookkeeper" else logging.INFO,
            f"{self.role} lease acquired",
            extra={"epoch": epoch, "owner": self.owner, "group": self.group},
        )

    def renew(self) -> None:
        """Extend the lease; raises `Fenced` if a newer epoch exists. May move to the next epoch
        (see `check`): read `epoch` after it."""
        self.check()
        assert self.epoch is not None
        self._written_at = time.monotonic()
        self._call(
            write_file,
            self._uri(self.epoch),
            _encode(LeaseRecord(self.epoch, self.owner, _now_ms(), self.ttl_ms)),
        )

    def check(self) -> None:
        """Raise `Fenced` when a newer lease exists (or ours lapsed and was taken). A lease not
        renewed within half its TTL is taken again with the next epoch before going on, so a
        standby that judged it expired can no longer take that epoch."""
        if self.epoch is None:
            raise Fenced("no lease held")
        following = self.epoch + 1
        if self._call(file_exists, self._uri(following)):
            newest = self._call(_newest_lease, self.folder, self.ttl_ms)
            if newest is not None and self._tried is not None and self._own_attempt(newest):
                # Its own take of the next epoch (below), which landed though the call failed:
                # held since the attempt began, not a newer holder's (it fenced itself).
                log.warning(
                    f"{self.role} lease not renewed within half its TTL; taken again",
                    extra={
                        "epoch": newest.epoch,
                        "previous_epoch": self.epoch,
                        "group": self.group,
                    },
                )
                self.epoch, self._written_at = newest.epoch, self._tried[1]
                self._tried = None
                self.check()  # the epoch after it, and its age
                return
            holder = newest.owner if newest is not None else "another"
            raise Fenced(
                f"{self.role} epoch {self.epoch} is stale: {holder} holds epoch "
                f"{newest.epoch if newest is not None else following}; stopping without committing"
            )
        if time.monotonic() - self._written_at > self.ttl_ms / 2000:
            started = time.monotonic()
            if not self._create(following):
                raise Fenced(
                    f"{self.role} epoch {self.epoch} lapsed and another took epoch {following}; "
                    "stopping without committing"
                )
            log.warning(
                f"{self.role} lease not renewed within half its TTL; taken again",
                extra={"epoch": following, "previous_epoch": self.epoch, "group": self.group},
            )
            self.epoch = following
            self._written_at = started
            self._tried = None

    def release(self) -> None:
        """Expire our lease now so a successor does not wait for the TTL. Stopping, a store that
        does not answer within `STOP_GRACE_S` leaves it to expire (as a kill does)."""
        if self.epoch is None or self.abandoned:
            return
        try:
            record = self._call(_read, self._uri(self.epoch))
            if record is not None and record.owner == self.owner:
                self._call(
                    write_file,
                    self._uri(self.epoch),
                    _encode(LeaseRecord(self.epoch, self.owner, 0, self.ttl_ms)),
                )
        except Stopped:
            log.warning(
                f"{self.role} lease not released: its store did not answer; a successor takes it "
                "once its TTL has passed",
                extra={"epoch": self.epoch, "group": self.group},
            )
        except OSError:
            pass

    def _call(self, action: Callable[..., _T], *args: Any) -> _T:
        """`action(*args)`, a call to the lease's store, run in a daemon thread of its own so that
        the owner's `stop` ends the wait for a store that does not answer: `STOP_GRACE_S` after
        `stop` is seen, the call is abandoned (`Stopped`), and its answer, whenever it comes, is
        never read. Without a `stop` flag, called here as before."""
        if self.abandoned:
            raise Stopped(f"{self.role} lease abandoned while stopping")
        if self.stop is None:
            return action(*args)
        call = _Call(action, args)
        threading.Thread(target=call.run, name=f"{self.role}-lease-store", daemon=True).start()
        stopping_since: float | None = None
        while not call.done.wait(0.05):
            if not self.stop.is_set():
                continue
            if stopping_since is None:
                stopping_since = time.monotonic()
            elif time.monotonic() - stopping_since >= STOP_GRACE_S:
                self.abandoned = True
                call.abandon()
                raise Stopped(
                    f"{self.role} told to stop while the lease's store did not answer "
                    f"({getattr(action, '__name__', action)})"
                )
        return call.outcome()

    def _uri(self, epoch: int) -> str:
        return f"{self.folder}/{_name(epoch)}"

    def _create(self, epoch: int) -> bool:
        started = time.monotonic()
        if self._tried is None or self._tried[0] != epoch:
            self._tried = (epoch, started)  # the first attempt at an epoch: the earliest write
        record = LeaseRecord(epoch, self.owner, _now_ms(), self.ttl_ms)
        if not self._call(create_if_absent, self._uri(epoch), _encode(record)):
            # An SDK that sent the create again after its answer was lost (a dropped connection,
            # a timeout: botocore retries) hears "already there" of its own file: the owner,
            # unique to this Lease, tells whether this holder or another created it.
            theirs = self._call(_read, self._uri(epoch))
            if theirs is None or theirs.owner != self.owner:
                return False
        self._written_at = started
        return True


def store_calls_abandoned() -> int:
    """Calls to a lease's store given up while stopping (`Stopped`) that have not ended yet. A
    process that ends with such a call under way must not wait for it at its exit: pyarrow's S3
    finalizer, run by the interpreter's exit, waits for every S3 call in flight (a listing of a
    store that does not answer: 11 s of the SDK's timeouts and retries), so the CLI ends such a
    process at once (`icekeeper/cli.py`)."""
    with _ABANDONED_LOCK:
        return len(_ABANDONED)


_ABANDONED: set[_Call] = set()
_ABANDONED_LOCK = threading.Lock()


class _Call:
    """One call to the lease's store, run on a thread of its own (`Lease._call`)."""

    def __init__(self, action: Callable[..., Any], args: tuple) -> None:
        self.action, self.args = action, args
        self.done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            self._result = self.action(*self.args)
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
            self._error = error
        finally:
            with _ABANDONED_LOCK:
                self.done.set()
                _ABANDONED.discard(self)

    def abandon(self) -> None:
        """The caller stopped waiting: counted in `store_calls_abandoned` until it ends."""
        with _ABANDONED_LOCK:
            if not self.done.is_set():
                _ABANDONED.add(self)

    def outcome(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._result


class _Unchanged:
    """How long (by this node's monotonic clock) a standby has seen the same lease unrenewed.

    A lease is expired once its holder's `renewed_ms` is older than its TTL by the standby's wall
    clock; but a holder whose clock runs ahead writes times in the standby's future, which alone
    would keep its lease held for the skew after it died (an hour ahead: an hour with no
    bookkeeper), and a lease file that cannot be read (a crash between its `O_EXCL` create and its
    write) is read as held from now, for ever. Either is expired too once this standby has seen
    it unchanged for its TTL: the holder has not written it for at least that long."""

    def __init__(self) -> None:
        self._seen: tuple[int, str, int] | None = None
        self._since = 0.0

    def for_its_ttl(self, lease: LeaseRecord) -> bool:
        unreadable = lease.owner == _BEING_CREATED
        seen = (lease.epoch, lease.owner, 0 if unreadable else lease.renewed_ms)
        if seen != self._seen:
            self._seen, self._since = seen, time.monotonic()
            return False
        return (time.monotonic() - self._since) * 1000 > lease.ttl_ms


def _free(lease: LeaseRecord | None, unchanged: _Unchanged) -> bool:
    """Whether a standby may take the next epoch after `lease` (the newest)."""
    return lease is None or lease.expired(_now_ms()) or unchanged.for_its_ttl(lease)


def group_folder(folder: str, group: str) -> str:
    """The folder (URI or path) of `group`'s lease files in `folder` (`group.lease_uri`)."""
    return f"{folder.rstrip('/')}/{path_segment(group)}"


def current_lease(folder: str, group: str) -> LeaseRecord | None:
    """The newest lease of `group` in `folder`, held, expired or released; None if there is none."""
    return _newest_lease(group_folder(folder, group), ttl_ms=1000)


def live_lease(folder: str, group: str) -> LeaseRecord | None:
    """The lease of `group` in `folder` while someone holds it, None when it is free, expired or
    released. A bookkeeper renews its lease every cycle, so a live lease is how another process
    (the reaper) tells that the group's bookkeeper is running, and who it is."""
    newest = current_lease(folder, group)
    return newest if newest is not None and not newest.expired(_now_ms()) else None


def _newest_lease(folder: str, ttl_ms: int, after: int | None = None) -> LeaseRecord | None:
    """The lease of the highest epoch in `folder`, None if there is none; one that cannot be read
    (an `O_EXCL` file being written) as held for `ttl_ms` from now. Given `after`, an epoch known
    to exist, the epochs after it are probed one by one instead of listing the folder."""
    if after is not None:
        epoch = after
        while file_exists(f"{folder}/{_name(epoch + 1)}"):
            epoch += 1
        epochs = [epoch]
    else:
        epochs = sorted(
            (
                int(match.group(1))
                for info in list_files(folder)
                if (match := _LEASE_NAME.match(posixpath.basename(info.path)))
            ),
            reverse=True,
        )
    for epoch in epochs:
        record = _read(f"{folder}/{_name(epoch)}")
        if record is not None:
            return record
        return LeaseRecord(epoch, _BEING_CREATED, _now_ms(), ttl_ms)
    return None


def _encode(record: LeaseRecord) -> bytes:
    return json.dumps(record.__dict__).encode()


def _read(uri: str) -> LeaseRecord | None:
    try:
        raw = json.loads(read_file(uri))
        return LeaseRecord(
            int(raw["epoch"]), str(raw["owner"]), int(raw["renewed_ms"]), int(raw["ttl_ms"])
        )
    except (OSError, ValueError, KeyError):
        return None


def _name(epoch: int) -> str:
    return f"lease-{epoch:012d}.json"


def _now_ms() -> int:
    return int(time.time() * 1000)

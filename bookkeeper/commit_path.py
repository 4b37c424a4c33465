"""The one commit path: every snapshot the bookkeeper makes goes through `CommitPath.commit`.

What a snapshot adds, removes and says is a producer's business, one producer per commit kind
(as pyiceberg's `_SnapshotProducer` subclasses are: merge append, overwrite, delete): moniker
appends (`moniker_append.py`, with the upsert row delta of `row_delta.py`), Event Grid files
(`event_grid_files.py`), rewrites (`rewrites.py`) and heartbeats (`heartbeats.py`). A producer
plans on the table as it is now and returns `SnapshotChanges`, or None when it has nothing to
commit; it never commits. The path does the rest, the same for every kind:

1. load the table and its committed state, refusing to go on (`StaleEpoch`) when a bookkeeper
   with a newer epoch committed it (and, before a snapshot that records a refusal, `Fenced` when
   another bookkeeper holds the lease: `fence`);
2. let the producer plan on them (the producer's exactly-once check runs here, in every attempt:
   another bookkeeper, a paused one waking up, say, may have committed in between);
3. stage one transaction: snapshot expiry (so the history kept stays bounded without a commit of
   its own), the schema change if any, and the snapshot, with a fresh commit id and this
   bookkeeper's epoch in its summary, and the whole committed state in the table property
   `icekeeper.committed-state` (`common/committed_state.py`);
4. commit it in a single compare-and-swap on the snapshot the state was read from. pyiceberg's
   own retry loop is bypassed on purpose: it rebuilds the snapshot on the refreshed table without
   giving the caller a chance to re-check (pyiceberg 0.12 `Transaction.commit_transaction`). A
   lost swap goes back to 1, at most `MAX_ATTEMPTS` times;
5. settle a commit of unknown outcome (the catalog's answer lost) by reading the table back for
   the commit id: found, it landed; not found, it did not, and it is planned again as after a
   lost swap;
6. tell the producer its snapshot is durable (its key index moves, its request is finished).
   The caller acknowledges what the outcome says only after this returns.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from pyiceberg.catalog import Catalog, MetastoreCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AssertCurrentSchemaId,
    AssertDefaultSpecId,
    AssertLastAssignedFieldId,
    AssertTableUUID,
    SetCurrentSchemaUpdate,
)
from pyiceberg.table.update.snapshot import ExpireSnapshots

from icekeeper.bookkeeper.datafiles import InvalidFile
from icekeeper.bookkeeper.hive_locks import settle_locks
from icekeeper.bookkeeper.manifests import merge_append, rewrite_files
from icekeeper.common.catalog import load_table_or_none
from icekeeper.common.committed_state import (
    KEY_COMMIT_ID,
    KEY_STATE,
    CommittedState,
    committed_state,
    expirable_snapshots,
)
from icekeeper.common.config.model import BookkeeperConfig
from icekeeper.common.internals import (
    UncopiedTransaction,
    commit_once,
    release_snapshot_producers,
    stage_updates,
)
from icekeeper.common.retries import retry
from icekeeper.common.transports.base import Delivery

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
"""Commit attempts per table and cycle: each one that loses its compare-and-swap plans again."""
SETTLE_READ_ATTEMPTS = 10
"""Reads of a table (a second apart) to settle a commit of unknown outcome, then it fails."""


class StaleEpoch(RuntimeError):
    """The table was committed by a bookkeeper with a newer epoch: this one must stop."""


class CommitConflict(Exception):
    """An attempt's compare-and-swap lost to another commit (or a commit of unknown outcome turned
    out not to have landed): the attempt is planned again on the refreshed table."""


@dataclass
class TableCommit:
    """Outcome of one commit of one table; the service acknowledges only after this returns."""

    table: str
    committed: list[Delivery] = field(default_factory=list)
    duplicates: list[Delivery] = field(default_factory=list)
    copies: list[Delivery] = field(default_factory=list)
    """Second deliveries of a moniker in the same receive: only the delivery is dropped."""
    quarantined: list[tuple[Delivery, str]] = field(default_factory=list)
    refused: list[tuple[Delivery, str]] = field(default_factory=list)
    """Monikers whose offsets overlap what the table committed, or that were planned on such a
    one: their records are not added; the refusal is in the committed state, and their writer
    reads the offsets again."""
    waiting: list[Delivery] = field(default_factory=list)
    unavailable: list[tuple[Delivery, str]] = field(default_factory=list)
    """Monikers left pending because storage could not
    serve one of their files (also in `waiting`)."""
    snapshot_id: int | None = None
    records: int = 0
    files: int = 0
    bytes: int = 0
    watermark_ms: int | None = None
    attempts: int = 0
    seconds: float = 0.0
    schema_changes: list[str] = field(default_factory=list)
    rows_replaced: int = 0
    """Upsert tables: earlier rows this snapshot position-deleted (updated or deleted keys)."""
    refusal: str | None = None
    """Rewrites: why the bookkeeper refused the request (nothing was committed)."""
    set_aside: str | None = None
    """Rewrites: why the request was set aside (`set_aside_rewrite`): nothing committed, nothing
    deleted."""


@dataclass
class SnapshotChanges:
    """What one snapshot adds, removes and says, as a producer planned it for one attempt."""

    table: Table
    """The table the snapshot goes on: the one planned on (or the one the producer created)."""
    state: CommittedState
    """The committed state the snapshot carries; the commit path gives it a new commit id and
    this bookkeeper's epoch."""
    moniker_ids: list[str] = field(default_factory=list)
    """The monikers this snapshot commits (in its summary)."""
    data_files: list[DataFile] = field(default_factory=list)
    delete_files: list[DataFile] = field(default_factory=list)
    """Position-delete files added: the snapshot is an `overwrite` (Iceberg's `RowDelta`)."""
    removed_files: list[DataFile] = field(default_factory=list)
    """Data and delete files that leave with this snapshot."""
    removed_from: set[str] | None = None
    """The table's manifests that hold `removed_files`, when the producer knows them."""
    replace: bool = False
    """A `replace` snapshot (Iceberg's `RewriteFiles`: the same rows in other files)."""
    new_schema: Schema | None = None
    """The schema this snapshot's files need, with field ids already chosen (`evolution.py`)."""
    properties: dict[str, str] = field(default_factory=dict)
    """Summary properties of the commit kind's own, beside the committed state."""
    expire_snapshots: bool = True
    """Whether the same transaction expires old snapshots (`CommitPath._expirable`). A rewrite
    does not: it is found committed by its snapshot, so its own commit leaves the history be."""
    sent: bool = False
    """Set by `CommitPath.compare_and_swap` once the snapshot is built and the swap goes to the
    catalog: an error before that is no commit of unknown outcome (nothing reached the catalog)."""


class SnapshotProducer:
    """One kind of commit: what its snapshot holds, planned again in every attempt.

    Subclasses implement `plan` and, for what must follow a durable commit, `committed`; the
    commit path calls them (see the module docstring) and nothing else commits."""

    what = "commit"
    """Names the commit in logs."""

    def plan(
        self, table: Table | None, state: CommittedState, outcome: TableCommit
    ) -> SnapshotChanges | None:
        """The snapshot to commit on `table` (None: it does not exist yet) with committed state
        `state`, both as they are now; None when there is nothing to commit. Fills in `outcome`
        (what waits, what is a duplicate, what was quarantined, counts). Planning must not
        change anything that a lost compare-and-swap would have to undo."""
        raise NotImplementedError

    def before_swap(self, changes: SnapshotChanges) -> None:
        """Before the snapshot is staged and swapped in: what must be durable in case the commit
        lands and this process dies before `committed` (a rewrite's `.committing` marker)."""

    def swap_lost(self, changes: SnapshotChanges) -> None:
        """The compare-and-swap definitely lost (it is planned again, or given up)."""

    def committed(self, changes: SnapshotChanges, snapshot_id: int, outcome: TableCommit) -> None:
        """The snapshot is durable: follow it (key indexes, caches, requests) and complete
        `outcome`."""


def records_refusal(read: CommittedState, written: CommittedState) -> bool:
    """Whether a snapshot that carries `written`, planned on `read`, records a new refusal."""
    return any(read.refusals.get(writer) != refusal for writer, refusal in written.refusals.items())


Outcome = TypeVar("Outcome")


def attempt_until_committed(
    identifier: str, attempt: Callable[[int], Outcome], what: str
) -> Outcome:
    """`attempt(number)` again after a `CommitConflict`, at once (it re-reads the table), at most
    `MAX_ATTEMPTS` times; then `CommitFailedException`. `what` names the commit in logs."""
    try:
        return retry(
            attempt,
            attempts=MAX_ATTEMPTS,
            what=f"{what} conflict, re-checking the refreshed table",
            retry_on=lambda error: isinstance(error, CommitConflict),
            log_extra={"table": identifier},
        )
    except CommitConflict as error:
        raise CommitFailedException(
            f"{identifier}: {what} gave up after {MAX_ATTEMPTS} conflicting attempts"
        ) from error


class CommitPath:
    """Commits producers' snapshots into the tables of one catalog, exactly as planned, once."""

    def __init__(self, catalog: Catalog, settings: BookkeeperConfig, epoch: int = 0) -> None:
        self.catalog = catalog
        self.settings = settings
        self.epoch = epoch
        """This bookkeeper's epoch (set when it takes the lease): written into every snapshot."""
        self.now_ms: Callable[[], int] = lambda: int(time.time() * 1000)
        """The clock snapshot ages are measured against (tests move it forward)."""
        rest = not isinstance(catalog, MetastoreCatalog)
        self.reuse_committed_tables = rest
        """Whether a table's next commit is planned on the table as the last one left it (see
        `current_table`): a REST catalog answers a commit with the new metadata, and loading the
        table again costs a request whose answer grows with the history kept."""
        self._committed: dict[str, Table] = {}
        self.fence: Callable[[], None] | None = None
        """Raises (`Fenced`) once another bookkeeper holds the lease (`Lease.check`): called
        before a snapshot that records a refusal is swapped in. None without a lease."""

    def commit(self, identifier: str, producer: SnapshotProducer) -> TableCommit:
        """Plan `producer`'s snapshot on table `identifier` as it is now, commit it in one
        compare-and-swap, and plan again after a conflict (see the module docstring). Raises
        `StaleEpoch` when a newer bookkeeper committed the table, `CommitFailedException` after
        `MAX_ATTEMPTS` lost swaps, and what the producer or the catalog raise."""
        started = time.monotonic()

        def attempt(number: int) -> TableCommit:
            outcome = TableCommit(identifier, attempts=number)
            # A first attempt may plan on the table as the last commit left it; every later one
            # (after a lost swap, or an unknown outcome) on the table loaded afresh.
            kept = self._committed.pop(identifier, None) if number == 1 else None
            if kept is not None and self._expirable(kept):
                # Expiry is decided on the table as it is now: refs another engine added since
                # (a tag on an old snapshot) are not in the kept table, and would be expired.
                kept = None
            table = kept if kept is not None else load_table_or_none(self.catalog, identifier)
            state = self.checked_state(identifier, table)
            changes = producer.plan(table, state, outcome)
            if changes is None and kept is not None:
                # Nothing to commit: no compare-and-swap would find the kept table stale, so what
                # the plan decided (monikers waiting, duplicates acknowledged, a newer epoch not
                # seen) is decided again on the table as it is now.
                outcome = TableCommit(identifier, attempts=number)
                table = load_table_or_none(self.catalog, identifier)
                state = self.checked_state(identifier, table)
                changes = producer.plan(table, state, outcome)
            if changes is None:
                return outcome
            if self.fence is not None and records_refusal(state, changes.state):
                # A refusal is a verdict on the committed offsets, and the writer acts on it
                # (it reads those offsets again): only the lease holder records one, on state
                # read under its epoch. A deposed bookkeeper stops here, nothing recorded.
                self.fence()
            changes.state = dataclasses.replace(
                changes.state, commit_id=uuid.uuid4().hex, epoch=max(self.epoch, state.epoch)
            )
            outcome.snapshot_id = self._settled(identifier, producer, changes)
            current = changes.table.current_snapshot()
            if (
                self.reuse_committed_tables
                and current
                and current.snapshot_id == outcome.snapshot_id
            ):
                # The catalog's answer carried the new metadata (an outcome settled by reading
                # the table back left `changes.table` as it was: not kept).
                self._committed[identifier] = changes.table
            outcome.watermark_ms = changes.state.watermark_ms
            producer.committed(changes, outcome.snapshot_id, outcome)
            return outcome

        outcome = attempt_until_committed(identifier, attempt, producer.what)
        outcome.seconds = time.monotonic() - started
        return outcome

    def current_table(self, identifier: str) -> Table | None:
        """Table `identifier` as this bookkeeper's last commit left it (REST catalogs), else as
        loaded now. It may be stale (another engine committed since): a commit planned on it is
        a compare-and-swap on its snapshot, which then fails and is planned again on the table
        loaded afresh."""
        table = self._committed.get(identifier)
        return table if table is not None else load_table_or_none(self.catalog, identifier)

    def checked_state(self, identifier: str, table: Table | None) -> CommittedState:
        """`table`'s committed state (empty before the table exists), once it is clear that no
        bookkeeper with a newer epoch committed it: else `StaleEpoch`, and this one must stop."""
        state = committed_state(table) if table is not None else CommittedState()
        if state.epoch > self.epoch:
            raise StaleEpoch(
                f"{identifier} was committed by epoch {state.epoch}; "
                f"this bookkeeper has epoch {self.epoch}"
            )
        return state

    def _settled(
        self, identifier: str, producer: SnapshotProducer, changes: SnapshotChanges
    ) -> int:
        """One commit attempt: the new snapshot id, or `CommitConflict` (the caller re-checks the
        refreshed table). An unknown outcome is settled by reading the table back."""
        producer.before_swap(changes)  # its failure is no commit: raised as it is
        try:
            return self.compare_and_swap(changes)
        except CommitFailedException as error:
            producer.swap_lost(changes)
            raise CommitConflict(str(error)) from error
        except (StaleEpoch, InvalidFile):
            raise
        except Exception as error:
            if not changes.sent:
                # Building the snapshot failed: nothing reached the catalog, nothing to settle or
                # plan again. Raised as it is, for the caller to judge (a rewrite request counts
                # it towards being set aside); as a lost swap it would become a "conflict" after
                # MAX_ATTEMPTS identical failures, and an outage.
                raise
            # The outcome is unknown: read the table back, never assume.
            snapshot_id = self._settle_unknown(identifier, changes.state.commit_id, error)
            settle_locks(self.catalog, landed=snapshot_id is not None)
            if snapshot_id is None:
                raise CommitConflict(
                    f"the commit of unknown outcome did not land ({error!r})"
                ) from error
            return snapshot_id

    def compare_and_swap(self, changes: SnapshotChanges) -> int:
        """One transaction, one compare-and-swap: expiry, the schema change (if any) and the
        snapshot, atomically; returns the new snapshot's id."""
        table = changes.table
        transaction = UncopiedTransaction(table)
        try:
            return self._staged_and_swapped(changes, transaction)
        finally:
            # Also when staging failed before the swap (a storage error writing a manifest).
            release_snapshot_producers(transaction)

    def _staged_and_swapped(self, changes: SnapshotChanges, transaction: Transaction) -> int:
        """`compare_and_swap`'s work: stage every change on `transaction`, then swap once."""
        table = changes.table
        expired = self._expirable(table) if changes.expire_snapshots else []
        if expired:
            # Files stay: the reaper deletes unreachable ones.
            ExpireSnapshots(transaction).by_ids(expired).commit()
        if changes.new_schema is not None:
            stage_updates(  # explicit field ids: see evolution.py
                transaction,
                (AddSchemaUpdate(schema=changes.new_schema), SetCurrentSchemaUpdate(schema_id=-1)),
                (
                    AssertCurrentSchemaId(current_schema_id=table.schema().schema_id),
                    # The new schema's ids were checked against this last-column-id: an engine
                    # that added and dropped a column meanwhile leaves the schema id as it was.
                    AssertLastAssignedFieldId(last_assigned_field_id=table.metadata.last_column_id),
                ),
            )
        properties = {**changes.state.to_summary(changes.moniker_ids), **changes.properties}
        # The whole state goes in the table property, once per metadata file; the summary only
        # names the commit (`common/committed_state.py`): in the same transaction, so the
        # property and the snapshot it belongs to land together or not at all.
        transaction.set_properties({KEY_STATE: changes.state.to_property()})
        if changes.replace:
            snapshot = rewrite_files(
                transaction, properties, changes.removed_files, changes.delete_files
            )
        else:
            snapshot = merge_append(
                transaction,
                properties,
                changes.delete_files,
                changes.removed_files,
                changes.removed_from,
            )
        with snapshot as producer:
            for data in changes.data_files:
                producer.append_data_file(data)
        # A single attempt; the snapshot producer's AssertRefSnapshotId makes it a CAS on the
        # snapshot our state was read from.
        changes.sent = True
        # What the plan relied on besides the snapshot: the schema and the partition spec it
        # judged the files by. Another engine's schema or spec change adds no snapshot, so the
        # snapshot's CAS alone would not see it on a table kept from the last commit (REST).
        commit_once(
            transaction,
            (
                AssertTableUUID(uuid=table.metadata.table_uuid),
                AssertCurrentSchemaId(current_schema_id=table.schema().schema_id),
                AssertDefaultSpecId(default_spec_id=table.spec().spec_id),
            ),
        )
        return table.current_snapshot().snapshot_id

    def _expirable(self, table: Table) -> list[int]:
        """Snapshots to expire with this commit: beyond the newest `keep_snapshots` (the commit
        adds one) and older than `keep_snapshots_for`, so that a streaming reader lagging by less
        than that keeps its place.

        Looked for only once the oldest snapshot is a tenth of that age (at most a minute) past
        it: choosing them reads every snapshot's summary (~20 ms at 1,000 snapshots), so at a
        commit a second, with an hour kept, expiry runs about once a minute, not every commit."""
        settings = self.settings
        keep_for_ms = int(settings.keep_snapshots_for * 1000)
        older_than_ms = self.now_ms() - keep_for_ms
        snapshots = table.metadata.snapshots
        if len(snapshots) < settings.keep_snapshots:
            return []
        # Snapshots are listed in commit order: the first is
        # the oldest (a skewed clock only delays expiry).
        if snapshots[0].timestamp_ms >= older_than_ms - min(keep_for_ms // 10, 60_000):
            return []
        return expirable_snapshots(table, settings.keep_snapshots - 1, older_than_ms=older_than_ms)

    def _settle_unknown(
        self, identifier: str, commit_id: str | None, error: Exception
    ) -> int | None:
        """The id of the snapshot that carries `commit_id`, read back from the table; None when
        none does (the commit did not land). Raises `error` when the table cannot be read."""
        log.warning(
            "commit outcome unknown, reading the table back",
            extra={"table": identifier, "error": repr(error)},
        )
        try:
            table = retry(
                lambda _: self.catalog.load_table(identifier),
                attempts=SETTLE_READ_ATTEMPTS,
                what="could not read the table back, reading it again",
                retry_on=lambda _: True,  # the catalog may still be unreachable
                wait_s=(1.0,),
                log_extra={"table": identifier},
            )
        except Exception as unreachable:
            raise error from unreachable
        for snapshot in table.snapshots():
            properties = snapshot.summary.additional_properties if snapshot.summary else {}
            if properties.get(KEY_COMMIT_ID) == commit_id:
                return snapshot.snapshot_id
        # Not listed: it did not land, or (a catalog that serves only the current snapshot,
        # Nessie) another commit came after it. Either way it is planned again on the committed
        # state, which the table's `KEY_STATE` property carries there: what landed is found
        # committed, as duplicates.
        return None

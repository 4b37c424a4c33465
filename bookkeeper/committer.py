"""Commit a table's ready monikers as one snapshot, exactly once.

Which monikers are ready follows from the table's committed state (see `common/moniker.py`):
a writer's moniker is committed when its `prev_seq` is the writer's last committed seq; one
with a seq already committed is a duplicate. The check runs again on the refreshed table in
every attempt, because another bookkeeper (a paused one waking up, say) may have committed in
between. Each attempt is a single compare-and-swap on the table's current snapshot: pyiceberg's
own retry loop is bypassed on purpose, since it rebuilds the snapshot on the refreshed table
without giving the caller a chance to re-check (pyiceberg 0.12 `Transaction.commit_transaction`).
A commit whose outcome is unknown is settled by reading the table back for its commit id.

Two things keep a moniker out of a commit without losing it. A file storage cannot serve now
(not found yet, a network error, throttling) is retried with backoff within the cycle, then the
moniker is left pending, and with it its writer's later monikers (they wait, as for ordering);
only a file missing for `bookkeeper.missing_file_timeout`, or definitely not what the moniker
says (not Parquet, size or field ids differ), quarantines it. And a moniker whose offsets start
below what the table committed for a partition (a writer restarted under a new id, two writers
given the same partitions) is refused: committing it would add those records twice.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    TableAlreadyExistsError,
)
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AssertCurrentSchemaId,
    AssertLastAssignedFieldId,
    AssertTableUUID,
    SetCurrentSchemaUpdate,
)
from pyiceberg.table.update.snapshot import ExpireSnapshots

from icekeeper.bookkeeper.datafiles import (
    Described,
    FileUnavailable,
    FooterFacts,
    FooterReader,
    InvalidFile,
    ParsedSchemas,
    data_file,
    validate,
)
from icekeeper.bookkeeper.evolution import IncompatibleSchema, plan_evolution
from icekeeper.bookkeeper.manifests import merge_append
from icekeeper.bookkeeper.upserts import MonikerKeys, UpsertCycle, UpsertKeeper
from icekeeper.common.catalog import load_table_or_none, table_properties
from icekeeper.common.committed_state import (
    KEY_COMMIT_ID,
    QUARANTINED_MONIKERS_KEPT,
    CommittedState,
    Refusal,
    committed_state,
    expirable_snapshots,
)
from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.common.file_events import location_key
from icekeeper.common.internals import UncopiedTransaction, commit_once, stage_updates
from icekeeper.common.moniker import FileEntry, Moniker, OffsetRange
from icekeeper.common.partitioning import partition_spec
from icekeeper.common.retries import retry
from icekeeper.common.transports.base import Delivery

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
"""Commit attempts per table and cycle: each one that loses its compare-and-swap plans again."""
FILE_RETRY_DELAYS_S = (0.2, 0.5, 1.0)
"""Waits before re-reading files storage could not serve, within one cycle (then: next cycle)."""
SETTLE_READ_ATTEMPTS = 10
"""Reads of a table (a second apart) to settle a commit of unknown outcome, then it fails."""


class StaleEpoch(RuntimeError):
    """The table was committed by a bookkeeper with a newer epoch: this one must stop."""


class CommitConflict(Exception):
    """An attempt's compare-and-swap lost to another commit (or a commit of unknown outcome turned
    out not to have landed): the attempt is planned again on the refreshed table."""


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


@dataclass
class TableCommit:
    """Outcome of one table's cycle; the service acknowledges only after this returns."""

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


@dataclass
class _Selection:
    ready: list[Delivery]
    duplicates: list[Delivery]
    """Deliveries of monikers the table has already settled (committed, quarantined or refused)."""
    waiting: list[Delivery]
    refused: list[tuple[Delivery, str]] = field(default_factory=list)
    copies: list[Delivery] = field(default_factory=list)
    """Second deliveries of a moniker delivered once more in the same receive (a writer re-sent
    its journal while the first message still waited): only the copy's delivery may go, the
    moniker itself is still pending through the first."""


def select_ready(
    deliveries: list[Delivery], state: CommittedState, max_files: int, max_bytes: int
) -> _Selection:
    """Ready monikers in commit order, duplicates, copies, those waiting for a predecessor, and
    those refused.

    A moniker is refused when an offset range starts below what is committed (or what a moniker
    before it in this commit covers) for its partition: the records below are in the table
    already, and a moniker cannot be trimmed (its files hold the rows). A refusal does not move
    its writer's chain: it is recorded in the state (`Refusal`), and the writer's later monikers
    planned on top of the refused one (their `prev_seq` is a refused seq) are refused too, since
    they assume its ranges were committed. The writer reads the refusal back and re-plans from the
    committed offsets, chaining its next moniker on its last committed one (`writers/progress.py`):
    so records past the committed offset come again, from the writer that read them.

    A moniker the table quarantined (its id in `state.quarantined_monikers`) that comes again is a
    replay: ready whatever its writer's seq has become, once (the commit takes its id off the list).
    """
    by_writer: dict[str, list[Delivery]] = {}
    duplicates: list[Delivery] = []
    copies: list[Delivery] = []
    replays: list[Delivery] = []
    seen: set[tuple[str, int]] = set()
    for delivery in deliveries:
        moniker = delivery.moniker
        assert moniker is not None
        # By seq too: an id is made of the writer, table and offsets only, and a writer that
        # reads a range again after a refusal publishes it under a new seq.
        if (moniker.id, moniker.seq) in seen:
            copies.append(delivery)
            continue
        seen.add((moniker.id, moniker.seq))
        if moniker.id in state.quarantined_monikers:
            replays.append(delivery)
            continue
        committed_seq = state.writer_seqs.get(moniker.writer_id)
        refusal = state.refusals.get(moniker.writer_id)
        if (committed_seq is not None and moniker.seq <= committed_seq) or (
            refusal is not None and moniker.seq <= refusal.seq
        ):
            duplicates.append(delivery)
            continue
        by_writer.setdefault(moniker.writer_id, []).append(delivery)
    ready: list[Delivery] = []
    waiting: list[Delivery] = []
    refused: list[tuple[Delivery, str]] = []
    covered = dict(state.offsets)
    files = size = 0
    for writer_id, chain in sorted(by_writer.items()):
        chain.sort(key=lambda d: d.moniker.seq)
        expected = state.writer_seqs.get(writer_id)
        refusal = state.refusals.get(writer_id)
        refused_through = refusal.seq if refusal is not None else None
        for delivery in chain:
            moniker = delivery.moniker
            if (
                refused_through is not None
                and moniker.prev_seq is not None
                and (expected is None or moniker.prev_seq > expected)
                and moniker.prev_seq <= refused_through
            ):
                # Chained on a seq past the last committed one and not above the highest refused:
                # only a refused moniker has such a seq (the writer's re-planned monikers chain
                # on its last committed one, and their seqs are above every refused seq).
                refused.append(
                    (
                        delivery,
                        f"planned on writer {writer_id}'s refused seq {moniker.prev_seq}: "
                        "the writer reads its offsets again",
                    )
                )
                refused_through = moniker.seq
                continue
            over_budget = ready and (
                files + len(moniker.files) > max_files or size + moniker.bytes > max_bytes
            )
            if moniker.prev_seq != expected or over_budget:
                waiting.append(delivery)
                continue
            overlap = overlapping_offsets(moniker, covered)
            if overlap is not None:
                refused.append((delivery, overlap))
                if moniker.rereads_refused:
                    refused_through = max(refused_through or moniker.seq, moniker.seq)
                else:
                    # A writer of an earlier version never reads a refusal back: its chain moves
                    # on as before, or its later monikers would all be refused.
                    expected = moniker.seq
                continue
            expected = moniker.seq
            ready.append(delivery)
            files += len(moniker.files)
            size += moniker.bytes
            for offset_range in moniker.offsets:
                key = (offset_range.topic, offset_range.partition)
                covered[key] = next_committed_offset(covered, offset_range)
    for delivery in replays:
        moniker = delivery.moniker
        if ready and (files + len(moniker.files) > max_files or size + moniker.bytes > max_bytes):
            waiting.append(delivery)
            continue
        ready.append(delivery)
        files += len(moniker.files)
        size += moniker.bytes
    return _Selection(ready, duplicates, waiting, refused, copies)


def overlapping_offsets(
    moniker: Moniker, committed_offsets: dict[tuple[str, int], int]
) -> str | None:
    """Why `moniker` would add records the table holds already, or None: a non-empty offset range
    that starts below the next offset committed for its topic-partition."""
    for offset_range in moniker.offsets:
        committed = committed_offsets.get((offset_range.topic, offset_range.partition))
        if (
            offset_range.count
            and committed is not None
            and offset_range.from_offset < committed
            and not offset_range.topic_reset  # a recreated topic starts below the old offsets
        ):
            return (
                f"offsets overlap the committed ones: writer {moniker.writer_id} seq {moniker.seq} "
                f"covers {offset_range.topic}[{offset_range.partition}] "
                f"{offset_range.from_offset}..{offset_range.until_offset}, the table has "
                f"everything below {committed} (records "
                f"{offset_range.from_offset}..{min(committed, offset_range.until_offset)} would be "
                "added twice)"
            )
    return None


def next_committed_offset(
    committed_offsets: dict[tuple[str, int], int], offset_range: OffsetRange
) -> int:
    """The partition's committed offset once `offset_range` is committed: the later of the two,
    or, for a range that starts a recreated topic (`OffsetRange.topic_reset`), its end: the old
    topic's offsets mean nothing for the new one."""
    key = (offset_range.topic, offset_range.partition)
    if offset_range.topic_reset:
        return offset_range.until_offset
    return max(committed_offsets.get(key, 0), offset_range.until_offset)


class Committer:
    """Commits monikers into the tables of one catalog."""

    def __init__(self, config: IcekeeperConfig, catalog: Catalog, epoch: int = 0) -> None:
        self.config = config
        self.catalog = catalog
        self.epoch = epoch
        self.now_ms: Callable[[], int] = lambda: int(time.time() * 1000)
        """The clock snapshot ages are measured against (tests move it forward)."""
        self._footers: dict[str, Described] = {}
        """File path -> what reading its footer found, until its moniker is committed,
        quarantined or found a duplicate."""
        self._schemas = ParsedSchemas()
        """Monikers' schemas, parsed once for every cycle (see `ParsedSchemas`)."""
        self._missing_since: dict[str, float] = {}
        """File path -> when (monotonic) storage first said
        it does not exist; cleared once it is read."""
        self.footer_reader = FooterReader(config.bookkeeper.footer_workers or os.cpu_count() or 2)
        self.upserts = UpsertKeeper(
            config.bookkeeper.footer_workers or os.cpu_count() or 2,
            config.bookkeeper.key_index_save_interval,
        )

    def close(self, save_key_indexes: bool = True) -> None:
        """Stop the footer readers; save the upsert tables'
        key indexes, the next bookkeeper's start."""
        self.footer_reader.close()
        if save_key_indexes:
            try:
                tables = {
                    identifier: table
                    for identifier in self.upserts.identifiers()
                    if (table := load_table_or_none(self.catalog, identifier))
                }
                self.upserts.save_all(tables)
            except Exception as error:  # noqa: BLE001 - a stop must not fail: the next bookkeeper catches up or rebuilds
                log.warning("could not save the key indexes", extra={"error": repr(error)})

    def commit_table(self, identifier: str, deliveries: list[Delivery]) -> TableCommit:
        """Commit what is ready for `identifier`; never acknowledges anything itself."""
        return self._commit_attempts(
            identifier, lambda result: self._plan_monikers(identifier, deliveries, result)
        )

    def commit_files(self, identifier: str, deliveries: list[Delivery]) -> TableCommit:
        """Commit Parquet files announced by Event Grid (no moniker), exactly once by file.

        The table must exist and be unpartitioned (an event carries no partition values), and the
        files must carry Iceberg field ids from the table's schema; others are quarantined with the
        reason. Exactly-once: the keys of files committed this way
        travel in the snapshot summary (the newest `EVENT_FILES_KEPT`), and a redelivered event
        for one of them is acknowledged without committing it again.
        """
        return self._commit_attempts(
            identifier, lambda result: self._plan_files(identifier, deliveries, result)
        )

    def heartbeat(self, identifier: str) -> TableCommit:
        """A snapshot with no files that carries the
        committed state forward (liveness for schedulers)."""
        started = time.monotonic()
        table = self.catalog.load_table(identifier)
        state = self.checked_state(identifier, table)
        new_state = dataclasses.replace(
            state, commit_id=uuid.uuid4().hex, epoch=max(self.epoch, state.epoch)
        )
        snapshot_id = self._commit_once(table, _Plan(table=table), new_state)
        return TableCommit(
            identifier,
            snapshot_id=snapshot_id,
            watermark_ms=new_state.watermark_ms,
            attempts=1,
            seconds=time.monotonic() - started,
        )

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

    # -- the commit attempts ---------------------------------------------------------------------

    def _commit_attempts(
        self, identifier: str, plan_attempt: Callable[[TableCommit], _Plan | None]
    ) -> TableCommit:
        """Plan on the table as it is now, commit the plan in one compare-and-swap, and plan again
        after a conflict. `plan_attempt` fills in the attempt's result (duplicates, waiting,
        quarantined; records and bytes of a plan) and returns the plan, or None when there is
        nothing to commit."""
        started = time.monotonic()

        def attempt(number: int) -> TableCommit:
            result = TableCommit(identifier, attempts=number)
            plan = plan_attempt(result)
            if plan is None:
                return result
            assert plan.table is not None and plan.new_state is not None
            result.snapshot_id = self._commit_settled(plan.table, plan, plan.new_state)
            if plan.upsert is not None:
                self.upserts.committed(plan.upsert, result.snapshot_id, plan.table)
                result.rows_replaced = plan.upsert.rows_replaced
            result.committed = list(plan.committed)
            result.files = len(plan.data_files)
            result.watermark_ms = plan.new_state.watermark_ms
            self._forget_files(plan.committed + [q for q, _ in plan.quarantined])
            return result

        result = attempt_until_committed(identifier, attempt, "commit")
        # A duplicate's files may have been read in an earlier cycle (its moniker waited, then
        # another bookkeeper committed it): nothing reads them again.
        self._forget_files(result.duplicates)
        result.seconds = time.monotonic() - started
        return result

    def _forget_files(self, deliveries: list[Delivery]) -> None:
        """Drop what is cached about the files of monikers that are done with (committed,
        quarantined, duplicates), so the caches hold only pending monikers' files."""
        for delivery in deliveries:
            # Data and deleted-keys files alike (pop is a no-op for a file never read).
            for entry in _checked_files(delivery.moniker, True) if delivery.moniker else ():
                self._footers.pop(entry.path, None)
                self._missing_since.pop(entry.path, None)

    def _plan_monikers(
        self, identifier: str, deliveries: list[Delivery], result: TableCommit
    ) -> _Plan | None:
        """The commit of the monikers ready on the table as it is now (see `_commit_attempts`)."""
        table = load_table_or_none(self.catalog, identifier)
        state = self.checked_state(identifier, table)
        selection = select_ready(
            deliveries,
            state,
            self.config.bookkeeper.max_files_per_commit,
            self.config.bookkeeper.max_bytes_per_commit,
        )
        result.duplicates, result.copies, result.waiting, result.refused = (
            selection.duplicates,
            selection.copies,
            selection.waiting,
            selection.refused,
        )
        if not selection.ready and not selection.refused:
            return None
        plan = self._prepare(table, identifier, selection.ready, result)
        if plan is None:
            # Nothing was committed to move the refused
            # monikers' writers on: they are refused next time.
            result.waiting.extend(d for d, _ in result.refused)
            result.refused = []
            return None
        plan.refused = result.refused
        if not (plan.committed or plan.quarantined or plan.refused):
            return None  # every ready moniker waits for a file
        plan.new_state = _advance(state, plan, self.epoch)
        result.records = sum(d.moniker.records for d in plan.committed)
        result.bytes = sum(d.moniker.bytes for d in plan.committed)
        return plan

    def _plan_files(
        self, identifier: str, deliveries: list[Delivery], result: TableCommit
    ) -> _Plan | None:
        """The commit of Event Grid's files new to the table as it is now (see `commit_files`)."""
        table = self.catalog.load_table(identifier)
        state = self.checked_state(identifier, table)
        done = set(state.event_files)
        fresh, seen = [], set()
        for delivery in deliveries:
            key = delivery.file_event.container_path
            if key in done or key in seen:
                result.duplicates.append(delivery)
            else:
                seen.add(key)
                fresh.append(delivery)
        if not fresh:
            return None
        if table.spec().fields:
            result.quarantined = [
                (d, f"{identifier} is partitioned; files need a moniker with partition values")
                for d in fresh
            ]
            fresh = []
        schema = table.schema()
        schema_json = schema.model_dump_json()
        facts = self.footer_reader.describe(
            [
                (_local_or_url(d.file_event.url, table.location()), schema, schema_json)
                for d in fresh
            ],
            table.properties,
        )
        plan = _Plan(table=table)
        for delivery in fresh:
            path = _local_or_url(delivery.file_event.url, table.location())
            described = facts[path]
            if isinstance(described, FileUnavailable):
                # Not acknowledged: the queue delivers the event again after its visibility timeout.
                result.waiting.append(delivery)
                result.unavailable.append((delivery, str(described)))
                continue
            problem = described if isinstance(described, InvalidFile) else None
            if problem is None and delivery.file_event.size_bytes not in (
                None,
                described.size_bytes,
            ):
                problem = InvalidFile(
                    f"{path}: {described.size_bytes} bytes, "
                    f"the event says {delivery.file_event.size_bytes}"
                )
            if problem is None and not described.field_ids:
                problem = InvalidFile(
                    f"{path}: no Iceberg field ids in the Parquet schema "
                    "(write it with the table's schema)"
                )
            if problem is None and described.field_ids - schema.field_ids:
                problem = InvalidFile(
                    f"{path}: field ids {sorted(described.field_ids - schema.field_ids)} "
                    "are not in the table's schema"
                )
            if problem is not None:
                result.quarantined.append((delivery, str(problem)))
                continue
            entry = FileEntry(
                path=path, size_bytes=described.size_bytes, record_count=described.num_rows
            )
            plan.data_files.append(data_file(entry, described, table.spec()))
            plan.committed.append(delivery)
        if plan.committed and self.config.table(identifier).upsert:
            # Files written by others into an upsert table replace the rows of their keys too.
            self._plan_upserts(
                plan,
                [(d, [data], []) for d, data in zip(list(plan.committed), list(plan.data_files))],
                result,
            )
            result.quarantined.extend(plan.quarantined)
        if not plan.committed and not result.quarantined:
            return None
        keys = [d.file_event.container_path for d in plan.committed]
        plan.new_state = dataclasses.replace(
            state,
            commit_id=uuid.uuid4().hex,
            epoch=max(self.epoch, state.epoch),
            event_files=(list(state.event_files) + keys)[-EVENT_FILES_KEPT:],
        )
        result.records = sum(f.record_count for f in plan.data_files)
        result.bytes = sum(f.file_size_in_bytes for f in plan.data_files)
        return plan

    # -- building the commit -----------------------------------------------------------------------

    def _prepare(
        self, table: Table | None, identifier: str, ready: list[Delivery], result: TableCommit
    ) -> _Plan | None:
        """Validate files, evolve the schema, build data
        files; quarantine monikers that cannot go in."""
        # Monikers of a batch share their schema: parse (and below, compare) each distinct one once.
        schemas: dict[str, Schema] = {}
        schema_keys = []
        previous_schema, schema_key = None, ""
        for delivery in ready:
            # Comparing with the previous moniker's schema dict (C, ~1 µs) spares serializing
            # each one (~40 µs): 1,000 monikers of a cycle usually carry equal schemas.
            if delivery.moniker.schema_ != previous_schema:
                previous_schema, schema_key = (
                    delivery.moniker.schema_,
                    json.dumps(delivery.moniker.schema_, sort_keys=True),
                )
            if schema_key not in schemas:
                schemas[schema_key] = self._schemas.get(
                    schema_key, functools.partial(Schema.model_validate, delivery.moniker.schema_)
                )
            schema_keys.append(schema_key)
        # An upsert table's deleted-keys files are read and checked as its data files are: each
        # one deletes every key it holds.
        upsert = self.config.table(identifier).upsert
        requests = [
            (entry.path, schemas[key], key)
            for delivery, key in zip(ready, schema_keys)
            for entry in _checked_files(delivery.moniker, upsert)
            if not isinstance(self._footers.get(entry.path), (FooterFacts, InvalidFile))
        ]  # unread, or unavailable last time
        properties = table.properties if table is not None else {}
        self._describe_retrying(requests, properties)
        plan = _Plan(table=table)
        held_writers: dict[str, int] = {}
        """Writer -> the seq of its moniker left pending
        for a file: its later monikers wait behind it."""
        current_schema = table.schema() if table is not None else None
        # What ids the table gave out, as the cycle's schema changes move it on (see evolution.py).
        last_column_id = table.metadata.last_column_id if table is not None else 0
        known_schemas = list(table.metadata.schemas) if table is not None else []
        evolutions: dict[tuple[int, str], object] = {}
        for delivery, schema_key in zip(ready, schema_keys):
            moniker = delivery.moniker
            file_schema = schemas[schema_key]
            if moniker.writer_id in held_writers:
                result.waiting.append(delivery)
                continue
            unavailable = [
                facts
                for entry in _checked_files(moniker, upsert)
                if isinstance(facts := self._footers[entry.path], FileUnavailable)
            ]
            if unavailable:
                held_writers[moniker.writer_id] = moniker.seq
                result.waiting.append(delivery)
                result.unavailable.append(
                    (delivery, "; ".join(str(problem) for problem in unavailable))
                )
                continue
            try:
                if current_schema is None:
                    table = self._create_table(identifier, moniker, file_schema)
                    plan.table, current_schema = table, table.schema()
                    last_column_id = table.metadata.last_column_id
                    known_schemas = list(table.metadata.schemas)
                evolution_key = (id(current_schema), schema_key)
                if evolution_key not in evolutions:
                    try:
                        evolutions[evolution_key] = plan_evolution(
                            current_schema,
                            file_schema,
                            self.config.bookkeeper.allow_drop_columns,
                            last_column_id=last_column_id,
                            earlier_schemas=known_schemas,
                        )
                    except IncompatibleSchema as error:
                        evolutions[evolution_key] = error
                evolution = evolutions[evolution_key]
                if isinstance(evolution, IncompatibleSchema):
                    raise evolution
                location = plan.table.location()
                files = []
                for entry in moniker.files:
                    facts = self._footers[entry.path]
                    if isinstance(facts, InvalidFile):
                        raise facts
                    validate(entry, facts, location, file_schema)
                    spec = plan.table.specs().get(entry.spec_id, plan.table.spec())
                    files.append(data_file(entry, facts, spec))
                for entry in moniker.delete_files if upsert else ():
                    facts = self._footers[entry.path]
                    if isinstance(facts, InvalidFile):
                        raise facts
                    validate(entry, facts, location, file_schema)
            except (IncompatibleSchema, InvalidFile) as error:
                plan.quarantined.append((delivery, str(error)))
                continue
            if evolution.schema is not None:
                current_schema = evolution.schema
                # As Iceberg's metadata builder (and pyiceberg's AddSchemaUpdate) will set it.
                last_column_id = max(last_column_id, current_schema.highest_field_id)
                known_schemas.append(current_schema)
                plan.new_schema = evolution.schema
                plan.schema_changes.extend(evolution.changes)
            plan.committed.append(delivery)
            plan.data_files.extend(files)
            plan.files_of[delivery.moniker.id] = files
        if plan.table is not None and plan.committed and self.config.table(identifier).upsert:
            for writer, seq in self._plan_upserts(
                plan,
                [(d, plan.files_of[d.moniker.id], d.moniker.delete_files) for d in plan.committed],
                result,
            ).items():
                held_writers.setdefault(writer, seq)
        if held_writers:
            # A refused moniker after one left pending would
            # move its writer's chain past it: it waits too.
            held = [
                (d, reason)
                for d, reason in result.refused
                if d.moniker.seq > held_writers.get(d.moniker.writer_id, d.moniker.seq)
            ]
            result.refused = [item for item in result.refused if item not in held]
            result.waiting.extend(d for d, _ in held)
        result.quarantined = plan.quarantined
        result.schema_changes = plan.schema_changes
        if plan.table is None:
            return None
        return plan

    def _describe_retrying(
        self, requests: list[tuple[str, Schema, str]], properties: dict[str, str]
    ) -> None:
        """Describe files into the footer cache. A file storage cannot serve is read again after
        `FILE_RETRY_DELAYS_S` in the cycle that first meets it (later cycles read it once each: the
        commit interval spaces them); one missing for `bookkeeper.missing_file_timeout`, counted
        from when this bookkeeper first found it missing, becomes an `InvalidFile`."""
        unavailable_before = {
            path for path, _, _ in requests if isinstance(self._footers.get(path), FileUnavailable)
        }

        def newly_unavailable() -> list[tuple[str, Schema, str]]:
            return [
                request
                for request in requests
                if isinstance(self._footers[request[0]], FileUnavailable)
                and request[0] not in unavailable_before
            ]

        def describe(attempt: int) -> list[tuple[str, Schema, str]]:
            pending = requests if attempt == 1 else newly_unavailable()
            self._footers.update(self.footer_reader.describe(pending, properties))
            return newly_unavailable()

        retry(
            describe,
            attempts=len(FILE_RETRY_DELAYS_S) + 1,
            what="storage could not serve files, reading them again",
            retry_while=bool,
            wait_s=FILE_RETRY_DELAYS_S,
        )
        now = time.monotonic()
        timeout = self.config.bookkeeper.missing_file_timeout
        for path, _, _ in requests:
            problem = self._footers[path]
            if not isinstance(problem, FileUnavailable):
                self._missing_since.pop(path, None)
                continue
            if not problem.missing:
                self._missing_since.pop(
                    path, None
                )  # it exists and storage failed to serve it: retried as long as it takes
                continue
            since = self._missing_since.setdefault(path, now)
            if now - since >= timeout:
                self._footers[path] = InvalidFile(
                    f"{path}: missing for {now - since:.0f} s (bookkeeper.missing_file_timeout "
                    f"{timeout:.0f} s)"
                )

    def _plan_upserts(
        self,
        plan: _Plan,
        items: list[tuple[Delivery, list[DataFile], list[FileEntry]]],
        result: TableCommit,
    ) -> dict[str, int]:
        """Key look-ups and position deletes for an upsert table's cycle. `items`: each committed
        delivery with its data files and deleted-keys files. A delivery whose key columns storage
        cannot serve now waits, with its writer's later deliveries (a key's changes commit in
        order); one whose key columns cannot be read is quarantined like one with an invalid file.
        Returns the writers held back, with the seq of each one's first waiting moniker."""
        table = plan.table
        assert table is not None
        keys = self.upserts.read_keys(table, [(files, deleted) for _, files, deleted in items])
        readable: list[MonikerKeys] = []
        held: dict[str, int] = {}
        for (delivery, files, _), found in zip(items, keys):
            writer = delivery.moniker.writer_id if delivery.moniker is not None else None
            if isinstance(found, (InvalidFile, FileUnavailable)) or writer in held:
                plan.committed.remove(delivery)
                gone = {id(data) for data in files}
                plan.data_files = [data for data in plan.data_files if id(data) not in gone]
                if isinstance(found, InvalidFile):
                    plan.quarantined.append((delivery, str(found)))
                    continue
                if writer is not None:
                    held.setdefault(writer, delivery.moniker.seq)
                result.waiting.append(delivery)
                if isinstance(found, FileUnavailable):
                    result.unavailable.append((delivery, str(found)))
            else:
                readable.append(found)
        if plan.committed:
            plan.upsert = self.upserts.plan(table, readable)
        return held

    def _create_table(self, identifier: str, moniker: Moniker, file_schema: Schema) -> Table:
        spec = self.config.table(identifier)
        namespace = identifier.rsplit(".", 1)[0]
        try:
            self.catalog.create_namespace(namespace)
        except NamespaceAlreadyExistsError:
            pass
        properties = table_properties(None, spec)
        if spec.comment:
            properties["comment"] = spec.comment
        location = spec.location or moniker.table_location
        try:
            table = self.catalog.create_table(
                identifier,
                schema=file_schema,
                partition_spec=partition_spec(spec.partition_by, file_schema),
                location=location,
                properties=properties,
            )
        except TableAlreadyExistsError:
            table = self.catalog.load_table(identifier)
        created_ids = {f.name: f.field_id for f in table.schema().fields}
        if created_ids != {f.name: f.field_id for f in file_schema.fields}:
            raise IncompatibleSchema(
                f"{identifier}: the new table's field ids differ from the files' ({created_ids})"
            )
        log.info("table created", extra={"table": identifier, "location": table.location()})
        return table

    def _commit_settled(self, table: Table, plan: _Plan, new_state: CommittedState) -> int:
        """One commit attempt: the new snapshot id, or `CommitConflict` (the caller re-checks the
        refreshed table). An unknown outcome is settled by reading the table back."""
        identifier = ".".join(table.name())
        try:
            return self._commit_once(table, plan, new_state)
        except CommitFailedException as error:
            raise CommitConflict(str(error)) from error
        except (StaleEpoch, InvalidFile):
            raise
        except Exception as error:  # outcome unknown: read the table back, never assume
            snapshot_id = self._settle_unknown(identifier, new_state.commit_id, error)
            if snapshot_id is None:
                raise CommitConflict(
                    f"the commit of unknown outcome did not land ({error!r})"
                ) from error
            return snapshot_id

    def _commit_once(self, table: Table, plan: _Plan, new_state: CommittedState) -> int:
        """One compare-and-swap: schema change (if any) and the snapshot, atomically."""
        summary = new_state.to_summary(
            [d.moniker.id for d in plan.committed if d.moniker is not None]
        )
        transaction = UncopiedTransaction(table)
        expired = self._expirable(table)
        if expired:
            # In the same transaction, so the history kept stays bounded without a commit of its
            # own. Files stay: the reaper deletes unreachable ones.
            ExpireSnapshots(transaction).by_ids(expired).commit()
        if plan.new_schema is not None:
            stage_updates(  # explicit field ids: see evolution.py
                transaction,
                (AddSchemaUpdate(schema=plan.new_schema), SetCurrentSchemaUpdate(schema_id=-1)),
                (
                    AssertCurrentSchemaId(current_schema_id=table.schema().schema_id),
                    # The new schema's ids were checked against this last-column-id: an engine
                    # that added and dropped a column meanwhile leaves the schema id as it was.
                    AssertLastAssignedFieldId(last_assigned_field_id=table.metadata.last_column_id),
                ),
            )
        removed_deletes = plan.upsert.removed_deletes if plan.upsert else []
        with merge_append(
            transaction,
            summary,
            plan.upsert.delete_files if plan.upsert else None,
            [live.delete_file for live in removed_deletes],
            {live.manifest_path for live in removed_deletes},
        ) as append:
            for data in plan.data_files:
                append.append_data_file(data)
        # A single attempt; the snapshot producer's AssertRefSnapshotId makes it a CAS on the
        # snapshot our state was read from.
        commit_once(transaction, (AssertTableUUID(uuid=table.metadata.table_uuid),))
        return table.current_snapshot().snapshot_id

    def _expirable(self, table: Table) -> list[int]:
        """Snapshots to expire with this commit: beyond the newest `keep_snapshots` (the commit
        adds one) and older than `keep_snapshots_for`, so that a streaming reader lagging by less
        than that keeps its place.

        Looked for only once the oldest snapshot is a tenth of that age (at most a minute) past
        it: choosing them reads every snapshot's summary (~20 ms at 1,000 snapshots), so at a
        commit a second, with an hour kept, expiry runs about once a minute, not every commit."""
        settings = self.config.bookkeeper
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
        return None


def _checked_files(moniker: Moniker, upsert: bool) -> list[FileEntry]:
    """The files of `moniker` whose footers are read and checked: its data files, and for an
    upsert table its deleted-keys files too."""
    return [*moniker.files, *moniker.delete_files] if upsert else list(moniker.files)


EVENT_FILES_KEPT = 2000
"""Event Grid file keys kept in the committed state: redeliveries come within minutes, not days."""


def _local_or_url(url: str, table_location: str) -> str:
    """The path pyarrow opens for an event's URL: local test files keep their path; storage URLs
    are rewritten onto the table location's scheme (abfs[s]://container@account...)."""
    if url.startswith(("file:", "/")):
        return url if url.startswith("file:") else "file://" + url
    table_key, file_key = location_key(table_location), location_key(url)
    if file_key.startswith(table_key + "/"):
        return table_location.rstrip("/") + file_key[len(table_key) :]
    return url


@dataclass
class _Plan:
    table: Table | None
    committed: list[Delivery] = field(default_factory=list)
    quarantined: list[tuple[Delivery, str]] = field(default_factory=list)
    data_files: list[DataFile] = field(default_factory=list)
    new_schema: Schema | None = None
    schema_changes: list[str] = field(default_factory=list)
    files_of: dict[str, list[DataFile]] = field(default_factory=dict)
    """Moniker id -> its data files, for upsert tables' key look-ups."""
    refused: list[tuple[Delivery, str]] = field(default_factory=list)
    """Monikers whose offsets overlap the committed ones:
    they move their writer's seq on, not the offsets."""
    upsert: UpsertCycle | None = None
    new_state: CommittedState | None = None
    """The committed state this commit writes into the snapshot summary."""


def _advance(state: CommittedState, plan: _Plan, epoch: int) -> CommittedState:
    """The state after this commit: seqs, offsets, event time, watermark, epoch, a new commit id.

    Quarantined monikers advance their writer's seq and offsets too: their records are
    accounted for in the dead-letter place, and later monikers of the writer must not wait.
    Refused ones (offsets overlapping the committed ones, or planned on such a one) advance
    neither: they are recorded as the writer's `Refusal`, which its writer reads to re-plan, and
    which goes once a later moniker of the writer is committed (the writer chained past it).
    Quarantined ones join `quarantined_monikers`, and a replayed one leaves it (its records leave
    the count).
    """
    writer_seqs = dict(state.writer_seqs)
    offsets = dict(state.offsets)
    event_ms = dict(state.partition_event_ms)
    quarantined = state.quarantined_records
    for delivery in sorted(
        plan.committed + [d for d, _ in plan.quarantined],
        key=lambda d: (d.moniker.writer_id, d.moniker.seq),
    ):
        moniker = delivery.moniker
        writer_seqs[moniker.writer_id] = max(
            writer_seqs.get(moniker.writer_id, moniker.seq), moniker.seq
        )
        for offset_range in moniker.offsets:
            key = (offset_range.topic, offset_range.partition)
            offsets[key] = next_committed_offset(offsets, offset_range)
            if moniker.max_event_time_ms is not None:
                event_ms[key] = max(event_ms.get(key, 0), moniker.max_event_time_ms)
    refusals = dict(state.refusals)
    for delivery, _ in plan.refused:
        moniker = delivery.moniker
        if not moniker.rereads_refused:  # an earlier version's writer: its chain moves on
            writer_seqs[moniker.writer_id] = max(
                writer_seqs.get(moniker.writer_id, moniker.seq), moniker.seq
            )
            continue
        earlier = refusals.get(moniker.writer_id)
        from_offsets = dict(earlier.from_offsets) if earlier is not None else {}
        for offset_range in moniker.offsets:
            if offset_range.count:
                key = (offset_range.topic, offset_range.partition)
                from_offsets[key] = min(
                    from_offsets.get(key, offset_range.from_offset), offset_range.from_offset
                )
        refusals[moniker.writer_id] = Refusal(
            max(moniker.seq, earlier.seq if earlier is not None else moniker.seq), from_offsets
        )
    refusals = {
        writer: refusal
        for writer, refusal in refusals.items()
        if writer_seqs.get(writer, -1) < refusal.seq
    }
    listed = list(state.quarantined_monikers)
    for delivery in plan.committed:
        if delivery.moniker.id in listed:  # a replay
            listed.remove(delivery.moniker.id)
            quarantined -= delivery.moniker.records
    for delivery, _ in plan.quarantined:
        if delivery.moniker.id not in listed:
            listed.append(delivery.moniker.id)
            quarantined += delivery.moniker.records
    watermark = min(event_ms.values()) if event_ms else state.watermark_ms
    return CommittedState(
        writer_seqs,
        offsets,
        event_ms,
        watermark,
        max(epoch, state.epoch),
        uuid.uuid4().hex,
        max(0, quarantined),
        state.event_files,
        tuple(listed[-QUARANTINED_MONIKERS_KEPT:]),
        refusals,
    )


def describe(result: TableCommit) -> str:
    return json.dumps(
        {
            "table": result.table,
            "snapshot_id": result.snapshot_id,
            "files": result.files,
            "records": result.records,
        }
    )

"""What a writer knows of each table between batches: where it has got to, and its last batch seq.

Rebuilt before every batch from what the table committed (the state in its snapshot summary) and
this writer's pending monikers, so a restarted writer neither skips records nor redoes work the
bookkeeper would commit twice; between batches it moves forward with what the writer publishes.
Positions only ever move forward.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pyiceberg.catalog import Catalog

from icekeeper.common.catalog import load_table_or_none
from icekeeper.common.committed_state import committed_state
from icekeeper.common.moniker import Moniker
from icekeeper.writers.offsets import TopicPartition as TP
from icekeeper.writers.offsets import pending_restarts, pending_until

_INITIAL_BYTES_PER_ROW = 64


@dataclass
class TableProgress:
    """What this writer knows of one table between batches."""

    last_seq: int | None = None
    """The seq of this writer's newest live moniker for the table (committed or pending): the
    `prev_seq` of its next one."""
    highest_seq: int | None = None
    """The highest seq this writer is known to have used for the table, refused ones included:
    its next batch's seq is above it, so no seq is ever used twice."""
    positions: dict[TP, int] = field(default_factory=dict)
    bytes_per_row: float = _INITIAL_BYTES_PER_ROW
    rereading: frozenset[TP] = frozenset()
    """Partitions the table refused this writer's monikers for and the writer has not yet
    published a moniker for since (`CommittedState.refusals`): read again from `positions` (the
    writer rewinds the source's checkpoint to them first); the next batch gives the table a
    moniker even without rows, so the refusal is settled."""

    def published(self, moniker: Moniker) -> None:
        """Move past a moniker this writer just published for the table."""
        self.last_seq = moniker.seq
        self.highest_seq = max(self.highest_seq or moniker.seq, moniker.seq)
        self.rereading = frozenset()
        for offsets in moniker.offsets:
            self.positions[(offsets.topic, offsets.partition)] = offsets.until_offset


def refresh_progress(
    tables: dict[str, TableProgress],
    pending: list[Moniker],
    catalog: Catalog,
    configured: list[str],
    writer_id: str,
) -> int:
    """Bring `tables` up to date with committed state and this writer's pending monikers.

    Args:
        tables: this writer's progress per table identifier, updated in place (entries are added
            for configured tables and for tables with pending monikers of this writer).
        pending: every pending moniker, of all writers; read before the tables, so a moniker
            committed and acknowledged in between is found in the table.
        configured: the identifiers of the config's tables.
    Returns:
        The bytes of pending monikers of the tables this writer serves (for backpressure).
    """
    served = set(configured) | set(tables)
    pending_bytes = sum(m.bytes for m in pending if m.table in served)
    mine = [m for m in pending if m.writer_id == writer_id]
    # Every table this writer knows, not only configured ones: a templated table's refusal or
    # committed seq must reach the writer whether or not a moniker of it is pending right now.
    for identifier in sorted(set(configured) | set(tables) | {m.table for m in mine}):
        _progress_of(tables, catalog, identifier, mine, writer_id)
    return pending_bytes


def _progress_of(
    tables: dict[str, TableProgress],
    catalog: Catalog,
    identifier: str,
    my_pending: list[Moniker],
    writer_id: str,
) -> TableProgress:
    progress = tables.setdefault(identifier, TableProgress())
    table = load_table_or_none(catalog, identifier)
    state = committed_state(table) if table is not None else None
    pending = [m for m in my_pending if m.table == identifier]
    refusal = state.refusals.get(writer_id) if state else None
    committed_seq = state.writer_seqs.get(writer_id) if state else None
    live, doomed = live_monikers(pending, committed_seq, refusal.seq if refusal else None)
    positions: dict[TP, int] = dict(state.offsets) if state else {}
    for key, until in pending_until(live).items():
        positions[key] = max(positions.get(key, 0), until)
    # A pending moniker that starts a recreated topic over replaces the old topic's offsets.
    restarted = pending_restarts(live)
    positions.update(restarted)
    seqs = [m.seq for m in pending]
    if committed_seq is not None:
        seqs.append(committed_seq)
    if refusal is not None:
        seqs.append(refusal.seq)
    progress.highest_seq = max([*seqs, progress.highest_seq or 0]) if seqs else progress.highest_seq
    if refusal is not None:
        # The table refused this writer's monikers (or will: `doomed` ones were planned on a
        # refused one): start over from what is committed and what is still live, which may be
        # behind what this writer read and what its checkpoint says.
        progress.last_seq = live[-1].seq if live else committed_seq
        reread = set(refusal.from_offsets if refusal else ()) | {
            (r.topic, r.partition) for m in doomed for r in m.offsets if r.count
        }
        for key in reread:
            if key not in positions:
                # Nothing committed or live there: from where the refused ranges started.
                starts = [
                    r.from_offset
                    for m in doomed
                    for r in m.offsets
                    if (r.topic, r.partition) == key and r.count
                ]
                if refusal is not None and key in refusal.from_offsets:
                    starts.append(refusal.from_offsets[key])
                positions[key] = min(starts)
        progress.positions = positions
        # Once a live moniker follows every refused one, it covers these partitions from there.
        refused_through = max([refusal.seq, *(m.seq for m in doomed)])
        settled = any(m.seq > refused_through for m in live)
        progress.rereading = frozenset() if settled else frozenset(reread)
        return progress
    progress.rereading = frozenset()
    progress.last_seq = max(seqs) if seqs else progress.last_seq
    # Positions only move forward: a table read back a moment ago cannot lose committed offsets.
    for key, value in positions.items():
        progress.positions[key] = (
            value if key in restarted else max(progress.positions.get(key, 0), value)
        )
    return progress


def live_monikers(
    pending: list[Moniker], committed_seq: int | None, refused_seq: int | None
) -> tuple[list[Moniker], list[Moniker]]:
    """This writer's pending monikers for one table that can still be committed, in seq order,
    and those the table refused or will refuse.

    A moniker at or below the table's highest refused seq of this writer was refused (or planned
    on a refused one); one whose `prev_seq` is not the previous live moniker (or the committed
    seq) was planned on a refused one too. Monikers at or below the committed seq are committed
    (their acknowledgement is on its way) and are neither.
    """
    live: list[Moniker] = []
    doomed: list[Moniker] = []
    head = committed_seq
    for moniker in sorted(pending, key=lambda m: m.seq):
        if committed_seq is not None and moniker.seq <= committed_seq:
            continue
        if refused_seq is not None and moniker.seq <= refused_seq:
            doomed.append(moniker)
        elif refused_seq is not None and moniker.prev_seq != head:
            doomed.append(moniker)
        else:
            live.append(moniker)
            head = moniker.seq
    return live, doomed


def next_seq(tables: dict[str, TableProgress], last_batch_seq: int | None) -> int:
    """The seq of this writer's next batch: one past the highest it used or any table knows."""
    known = [seq for p in tables.values() for seq in (p.last_seq, p.highest_seq) if seq is not None]
    if last_batch_seq is not None:
        known.append(last_batch_seq)
    return (max(known) + 1) if known else 1


def table_positions(
    tables: dict[str, TableProgress],
    table_ids: Iterable[str],
    checkpoint: dict[TP, int],
    templated: bool,
) -> dict[str, dict[TP, int]]:
    """Per table of a source, the next offset it needs per topic-partition (`plan_batch`'s input).

    Args:
        table_ids: the source's tables; each gets an entry in `tables` if it has none.
        checkpoint: what this writer finished for the source (`checkpoints.py`).
        templated: the source routes by a table template: tables not yet seen start at the
            checkpoint (entry `*`).
    """
    positions = {}
    for identifier in table_ids:
        # The later of the table's own progress and what this writer finished for the source:
        # a batch that gave a table no rows (only other tables', tombstones or dead letters)
        # publishes nothing for it, and must not be read again for it forever.
        known = dict(checkpoint)
        for key, offset in tables.setdefault(identifier, TableProgress()).positions.items():
            known[key] = max(known.get(key, 0), offset)
        positions[identifier] = known
    if templated:
        positions["*"] = checkpoint
    return positions

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

from common.catalog import load_table_or_none
from common.committed_state import committed_state
from common.moniker import Moniker
from writers.offsets import TopicPartition as TP
from writers.offsets import pending_restarts, pending_until

_INITIAL_BYTES_PER_ROW = 64


@dataclass
class TableProgress:
    """What this writer knows of one table between batches."""

    last_seq: int | None = None
    positions: dict[TP, int] = field(default_factory=dict)
    bytes_per_row: float = _INITIAL_BYTES_PER_ROW

    def published(self, moniker: Moniker) -> None:
        """Move past a moniker this writer just published for the table."""
        self.last_seq = moniker.seq
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
        pending: every pending moniker, of all writers.
        configured: the identifiers of the config's tables.
    Returns:
        The bytes of pending monikers of the tables this writer serves (for backpressure).
    """
    served = set(configured) | set(tables)
    pending_bytes = sum(m.bytes for m in pending if m.table in served)
    mine = [m for m in pending if m.writer_id == writer_id]
    for identifier in configured:
        _progress_of(tables, catalog, identifier, mine, writer_id)
    for identifier in {m.table for m in mine}:
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
    positions: dict[TP, int] = dict(state.offsets) if state else {}
    pending = [m for m in my_pending if m.table == identifier]
    for key, until in pending_until(pending).items():
        positions[key] = max(positions.get(key, 0), until)
    # A pending moniker that starts a recreated topic over replaces the old topic's offsets.
    restarted = pending_restarts(pending)
    positions.update(restarted)
    seqs = [m.seq for m in pending]
    if state and writer_id in state.writer_seqs:
        seqs.append(state.writer_seqs[writer_id])
    progress.last_seq = max(seqs) if seqs else progress.last_seq
    # Positions only move forward: a table read back a moment ago cannot lose committed offsets.
    for key, value in positions.items():
        progress.positions[key] = (
            value if key in restarted else max(progress.positions.get(key, 0), value)
        )
    return progress


def next_seq(tables: dict[str, TableProgress], last_batch_seq: int | None) -> int:
    """The seq of this writer's next batch: one past the highest it used or any table knows."""
    known = [p.last_seq for p in tables.values() if p.last_seq is not None]
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

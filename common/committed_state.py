"""What a table has committed, as icekeeper records it: in a table property, named by snapshots.

The committed state (each writer's last seq, the next offset and event time of every
topic-partition, refusals, quarantined monikers...) grows with the partitions a table covers:
about 2.8 KB for a 64-partition topic. Every commit rewrites the table's metadata file with every
snapshot kept (at a commit a second, an hour of them: 3,600), so the state is kept once per
metadata file, not once per snapshot:

- the table property `KEY_STATE` holds the whole state of the bookkeeper's newest commit, set in
  the same commit (one transaction, one compare-and-swap) as the snapshot, on every catalog;
- each snapshot icekeeper makes carries only what identifies the commit (`to_summary`): its commit
  id, the bookkeeper's epoch, the ids of the monikers it added and the watermark, a size that does
  not grow with the partitions. The commit id is how a commit of unknown outcome is found.

A property belongs to the table, not to a snapshot, so a reader checks that it belongs to the
snapshot the table is at (`committed_state`): the newest icekeeper snapshot among the current
snapshot's ancestors (snapshots made by other engines, Spark's `rewrite_data_files` for example,
carry no icekeeper keys and are walked past) must carry the property's commit id. It does unless
the table's current snapshot was moved back or aside within the table (Iceberg's
`rollback_to_snapshot`, `set_current_snapshot`, a cherry-pick): then the property is the state of
a commit the table is no longer at, the state of the snapshot it is at is not kept anywhere, and
the reader refuses (`StateNotInLineage`) rather than guess; the bookkeeper commits nothing to that
table and writers plan nothing for it until the operator moves the table back (docs/operations.md).
Carrying a full state in a summary every K commits would not make that exact: the state between
that snapshot and the one rolled back to would be missing, and committing on it would add records
twice or lose them. (Before this change a rollback also stopped the table, silently: the writers'
seq chains no longer met the rolled-back seqs, and their monikers waited.) A catalog-level
restore (pointing the catalog at an older metadata file, Nessie's branch reset) brings the property
back with the snapshots, and is consistent.

Expiry (the reaper's and the bookkeeper's, `expirable_snapshots`) never takes the current
snapshot's newest icekeeper ancestor, the one the property is checked against, nor the snapshots
between the two (expired, they would cut the walk short and hide a rollback), nor the table's
newest icekeeper snapshot. When the current snapshot's ancestors that the table lists hold no
icekeeper snapshot (an older release's expiry broke the parent chain; Nessie's Iceberg REST API
serves only the current snapshot, so one snapshot made by another engine hides every earlier one),
the table's newest icekeeper snapshot is checked instead, and only if the current snapshot came
after it (a snapshot older than the newest icekeeper commit cannot descend from it: the table was
rolled back to before icekeeper's first commit, and that state is refused as a rollback is); when
the table lists none at all, the property is read as it is.

Tables committed before this change carry the whole state in every icekeeper snapshot's summary
(`from_summary` reads it; the property, if any, has the same keys): when the newest icekeeper
snapshot of the lineage carries it, that summary is the state, whatever the property says.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

PREFIX = "icekeeper."
KEY_COMMIT_ID = PREFIX + "commit-id"
KEY_EPOCH = PREFIX + "epoch"
KEY_WRITERS = PREFIX + "writer-seqs"
KEY_OFFSETS = PREFIX + "offsets"
KEY_EVENT_TIME = PREFIX + "partition-event-ms"
KEY_WATERMARK = PREFIX + "watermark-ms"
KEY_MONIKERS = PREFIX + "moniker-ids"
KEY_QUARANTINED = PREFIX + "quarantined-records"
KEY_EVENT_FILES = PREFIX + "event-files"
KEY_QUARANTINED_MONIKERS = PREFIX + "quarantined-monikers"
KEY_REFUSALS = PREFIX + "refusals"
KEY_STATE = PREFIX + "committed-state"
"""Table property: the whole state of the bookkeeper's newest commit, as one JSON object of the
keys above (see the module docstring)."""
NOT_HERE = json.dumps({"": "newer icekeeper: see icekeeper.committed-state"}, separators=(",", ":"))
"""What a snapshot summary's `KEY_WRITERS` holds now: a release from before the state moved to
the table property reads its state from the newest icekeeper summary, and would read this one's
as empty (every writer's chain unknown, no offsets committed: duplicates, or records planned
past); instead its parse fails on this value (`int()` of the text), loudly, naming the property,
and it commits and plans nothing (docs/operations.md: no downgrade)."""
SUMMARY_KEYS = (KEY_COMMIT_ID, KEY_EPOCH, KEY_MONIKERS, KEY_WATERMARK, KEY_WRITERS)
"""The only icekeeper keys a snapshot summary carries now: what identifies the commit, none of
them growing with the partitions a table covers (and `NOT_HERE`)."""

QUARANTINED_MONIKERS_KEPT = 500
"""Ids of quarantined monikers the state remembers for
replay (quarantines are rare; the oldest go first)."""

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class Refusal:
    """A writer's monikers the table refused (their offsets overlapped committed ones, or they
    were planned on top of a refused one), until the writer's chain moves past them.

    The writer reads it back to re-plan: its progress and checkpoint stood past the refused
    ranges, and the records beyond the committed offsets must come from it again."""

    seq: int
    """The highest refused seq: the writer's monikers up to it are refused; later ones whose
    `prev_seq` is a refused seq are refused too (they were planned on the refused ranges)."""
    from_offsets: dict[TopicPartition, int] = field(default_factory=dict)
    """Per topic-partition, the lowest offset the refused monikers covered: where the writer
    reads again a partition the table has no committed offset for."""


@dataclass(frozen=True)
class CommittedState:
    """Per-writer last committed seq, next offset per topic-partition, event-time progress."""

    writer_seqs: dict[str, int] = field(default_factory=dict)
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    partition_event_ms: dict[TopicPartition, int] = field(default_factory=dict)
    watermark_ms: int | None = None
    epoch: int = 0
    commit_id: str | None = None
    quarantined_records: int = 0
    event_files: tuple[str, ...] = ()
    """Keys of the newest files committed from Event Grid events (no moniker)."""
    quarantined_monikers: tuple[str, ...] = ()
    """Ids of quarantined monikers whose records are not in the table: a replayed one is committed
    once (its id leaves the list in the same snapshot), whatever its writer's seq has become."""
    refusals: dict[str, Refusal] = field(default_factory=dict)
    """Per writer id, what the table refused of it and the writer has not yet re-planned past."""
    snapshot_id: int | None = None

    def to_summary(self, moniker_ids: list[str]) -> dict[str, str]:
        """Summary properties for the next snapshot (moniker ids: those this commit adds): what
        identifies the commit, never the per-partition state (that is `to_property`'s)."""
        summary = {
            KEY_COMMIT_ID: self.commit_id or "",
            KEY_EPOCH: str(self.epoch),
            KEY_MONIKERS: ",".join(moniker_ids),
            KEY_WRITERS: NOT_HERE,
        }
        if self.watermark_ms is not None:
            summary[KEY_WATERMARK] = str(self.watermark_ms)
        return summary

    def to_property(self) -> str:
        """The table property `KEY_STATE` for the next commit: the whole state, set in the same
        commit as the snapshot whose summary names `commit_id`."""
        return json.dumps(self.full_keys(), sort_keys=True, separators=(",", ":"))

    def full_keys(self) -> dict[str, str]:
        """Every key of the state, as summaries carried them before the state moved to the table
        property (`from_summary` reads either)."""
        compact = {"sort_keys": True, "separators": (",", ":")}
        keys = {
            KEY_COMMIT_ID: self.commit_id or "",
            KEY_EPOCH: str(self.epoch),
            KEY_WRITERS: json.dumps(self.writer_seqs, **compact),
            KEY_OFFSETS: json.dumps(nest_by_topic(self.offsets), **compact),
            KEY_EVENT_TIME: json.dumps(nest_by_topic(self.partition_event_ms), **compact),
            KEY_QUARANTINED: str(self.quarantined_records),
        }
        if self.watermark_ms is not None:
            keys[KEY_WATERMARK] = str(self.watermark_ms)
        if self.event_files:
            keys[KEY_EVENT_FILES] = json.dumps(list(self.event_files), **compact)
        if self.refusals:
            keys[KEY_REFUSALS] = json.dumps(
                {
                    writer: {"seq": refusal.seq, "from": nest_by_topic(refusal.from_offsets)}
                    for writer, refusal in self.refusals.items()
                },
                **compact,
            )
        if self.quarantined_monikers:
            keys[KEY_QUARANTINED_MONIKERS] = ",".join(
                self.quarantined_monikers[-QUARANTINED_MONIKERS_KEPT:]
            )
        return keys

    @classmethod
    def from_summary(
        cls, summary: Mapping[str, str], snapshot_id: int | None = None
    ) -> CommittedState:
        """The state from its keys: a summary written before the state moved to the table
        property, or the property's (`full_keys`)."""
        watermark = summary.get(KEY_WATERMARK)
        return cls(
            writer_seqs={
                k: int(v) for k, v in json.loads(summary.get(KEY_WRITERS) or "{}").items()
            },
            offsets=_flatten(json.loads(summary.get(KEY_OFFSETS) or "{}")),
            partition_event_ms=_flatten(json.loads(summary.get(KEY_EVENT_TIME) or "{}")),
            watermark_ms=int(watermark) if watermark else None,
            epoch=int(summary.get(KEY_EPOCH) or 0),
            commit_id=summary.get(KEY_COMMIT_ID) or None,
            quarantined_records=int(summary.get(KEY_QUARANTINED) or 0),
            event_files=tuple(json.loads(summary.get(KEY_EVENT_FILES) or "[]")),
            quarantined_monikers=tuple(
                filter(None, (summary.get(KEY_QUARANTINED_MONIKERS) or "").split(","))
            ),
            refusals={
                writer: Refusal(int(refusal["seq"]), _flatten(refusal.get("from") or {}))
                for writer, refusal in json.loads(summary.get(KEY_REFUSALS) or "{}").items()
            },
            snapshot_id=snapshot_id,
        )


def nest_by_topic(values: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """`{topic: {"partition": value}}`: the JSON form of offsets in snapshot summaries, writer
    checkpoints and Spark's Kafka source options."""
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), value in values.items():
        nested.setdefault(topic, {})[str(partition)] = value
    return nested


def _flatten(nested: Mapping[str, Mapping[str, int]]) -> dict[TopicPartition, int]:
    return {
        (topic, int(partition)): int(value)
        for topic, partitions in nested.items()
        for partition, value in partitions.items()
    }


class StateNotInLineage(RuntimeError):
    """The table's committed-state property is not the state of the snapshot the table is at (its
    current snapshot was rolled back or set aside within the table): nothing may be planned on it
    (see the module docstring)."""


def committed_state(table: Table) -> CommittedState:
    """The committed state of the snapshot `table` is at (see the module docstring).

    Raises `StateNotInLineage` when the table property holds the state of a commit that is not
    the newest icekeeper commit among the current snapshot's ancestors.
    """
    carrier = _lineage_carrier(table)
    if carrier is None:
        # No icekeeper snapshot among the ancestors the table lists: expiry broke the parent
        # chain, or the catalog serves only the current snapshot (Nessie: its parent is not
        # listed, or not named at all). The table's newest icekeeper snapshot stands for it
        # (`expirable_snapshots` keeps it); with none listed, the property is read as it is.
        carrier = newest_state_carrier(table)
        current = table.current_snapshot()
        if carrier is not None and current is not None and _order(current) < _order(carrier):
            # The table is at a snapshot older than its newest icekeeper commit, with no
            # icekeeper commit among its ancestors: rolled back to before icekeeper's first
            # commit (or to a snapshot whose icekeeper ancestors are expired). It cannot descend
            # from that commit, so that commit's state is not the table's.
            newest_id = carrier.summary.additional_properties.get(KEY_COMMIT_ID)
            raise StateNotInLineage(
                f"{_name(table)}: the table is at snapshot {current.snapshot_id}, older than "
                f"its newest icekeeper commit {newest_id} "
                f"(snapshot {carrier.snapshot_id}), with no icekeeper commit among its ancestors: "
                "the table was rolled back or set to another snapshot, and that snapshot's "
                "committed state is not kept; nothing is committed to it until it is moved back "
                "(see docs/operations.md)"
            )
    kept = state_property(table)
    if carrier is None:
        return CommittedState.from_summary(kept) if kept is not None else CommittedState()
    summary = carrier.summary.additional_properties if carrier.summary else {}
    if KEY_OFFSETS in summary:
        # Committed before the state moved to the property: the summary is the whole state.
        return CommittedState.from_summary(summary, carrier.snapshot_id)
    commit_id = summary.get(KEY_COMMIT_ID)
    if kept is None:
        # Unset by a user or dropped by a tool: the state is gone, not empty. Read as nothing
        # committed, every record would be committed again.
        raise StateNotInLineage(
            f"{_name(table)}: the table property {KEY_STATE} is missing (unset, or dropped by a "
            f"tool that rewrote the table's properties), but the table's snapshot "
            f"{_current_id(table)} descends from icekeeper commit {commit_id} (snapshot "
            f"{carrier.snapshot_id}): its committed state is lost, and nothing is committed to "
            "the table until the property is restored (see docs/operations.md)"
        )
    if kept.get(KEY_COMMIT_ID) != commit_id:
        kept_id = kept.get(KEY_COMMIT_ID)
        at = _snapshot_of_commit(table, kept_id) if kept_id else None
        raise StateNotInLineage(
            f"{_name(table)}: the table property {KEY_STATE} holds the state of commit "
            f"{kept_id or '(none)'}"
            + (f" (snapshot {at})" if at is not None else "")
            + f", but the newest icekeeper commit the table's snapshot {_current_id(table)} "
            f"descends from is {commit_id} (snapshot {carrier.snapshot_id}): the table was "
            "rolled back or set to another snapshot, and that snapshot's committed state is not "
            "kept; nothing is committed to it until it is moved back (see docs/operations.md)"
        )
    return CommittedState.from_summary(kept, carrier.snapshot_id)


def snapshot_state(table: Table, snapshot: Snapshot) -> CommittedState | None:
    """The committed state as of `snapshot`, when the table still holds it: the snapshot's own
    summary (committed before the state moved to the property), or the property when the
    snapshot is the commit it belongs to. None for any other snapshot (an older icekeeper commit,
    another engine's)."""
    summary = snapshot.summary.additional_properties if snapshot.summary else {}
    if KEY_OFFSETS in summary:
        return CommittedState.from_summary(summary, snapshot.snapshot_id)
    kept = state_property(table)
    if (
        KEY_COMMIT_ID in summary
        and kept is not None
        and kept.get(KEY_COMMIT_ID) == summary[KEY_COMMIT_ID]
    ):
        return CommittedState.from_summary(kept, snapshot.snapshot_id)
    return None


def _lineage_carrier(table: Table) -> Snapshot | None:
    """The newest snapshot with an icekeeper commit id among the current snapshot's ancestors that
    the table lists (the current one included)."""
    path = _lineage_path(table)
    carrier = table.snapshot_by_id(path[-1]) if path else None
    return carrier if carrier is not None and _carries_state(carrier) else None


def _lineage_path(table: Table) -> list[int]:
    """Ids from the current snapshot back to its newest icekeeper ancestor (both included), as far
    as the table lists them."""
    path: list[int] = []
    snapshot = table.current_snapshot()
    while snapshot is not None:
        path.append(snapshot.snapshot_id)
        if _carries_state(snapshot) or snapshot.parent_snapshot_id is None:
            break
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id)
    return path


def _snapshot_of_commit(table: Table, commit_id: str) -> int | None:
    for snapshot in table.snapshots():
        if (
            snapshot.summary
            and snapshot.summary.additional_properties.get(KEY_COMMIT_ID) == commit_id
        ):
            return snapshot.snapshot_id
    return None


def _current_id(table: Table) -> int | None:
    current = table.current_snapshot()
    return current.snapshot_id if current is not None else None


def _name(table: Table) -> str:
    return ".".join(table.name())


def state_property(table: Table) -> dict[str, str] | None:
    """The state's keys kept in the table's `KEY_STATE` property, if any (`full_keys`)."""
    kept = table.properties.get(KEY_STATE)
    return json.loads(kept) if kept else None


def newest_state_carrier(table: Table) -> Snapshot | None:
    """The newest snapshot with an icekeeper commit id (its whole state in its summary, or in the
    table property), by sequence number."""
    carriers = [s for s in table.snapshots() if _carries_state(s)]
    return max(carriers, key=_order, default=None)


def _order(snapshot: Snapshot) -> tuple[int, int]:
    """Commit order: a snapshot's descendants all come after it (sequence numbers, then time for
    format-1 tables, whose snapshots all have sequence number 0)."""
    return (snapshot.sequence_number or 0, snapshot.timestamp_ms)


def expirable_snapshots(table: Table, keep: int, older_than_ms: int | None = None) -> list[int]:
    """Snapshots that may be expired: beyond the newest `keep` (and older than `older_than_ms` when
    given), never a branch or tag head, never the table's newest snapshot with an icekeeper commit
    id, nor the current snapshot's newest icekeeper ancestor and the snapshots between them (the
    one the table property's commit id is checked against, see the module docstring)."""
    snapshots = sorted(
        table.snapshots(), key=lambda s: (s.sequence_number or 0, s.timestamp_ms), reverse=True
    )
    protected = {ref.snapshot_id for ref in table.metadata.refs.values()}
    carrier = newest_state_carrier(table)
    if carrier is not None:
        protected.add(carrier.snapshot_id)
    # And the current snapshot's way back to its newest icekeeper commit: after a rollback that
    # commit is another than the newest, and the property is checked against it (expired, the
    # walk would stop short and the rollback go unseen). Not a way back to no icekeeper commit
    # (a table other engines wrote): that would keep its whole history.
    path = _lineage_path(table)
    lineage_carrier = table.snapshot_by_id(path[-1]) if path else None
    if lineage_carrier is not None and _carries_state(lineage_carrier):
        protected.update(path)
    return [
        s.snapshot_id
        for s in snapshots[max(keep, 1) :]
        if s.snapshot_id not in protected
        and (older_than_ms is None or s.timestamp_ms < older_than_ms)
    ]


def _carries_state(snapshot: Snapshot) -> bool:
    return snapshot.summary is not None and KEY_COMMIT_ID in snapshot.summary.additional_properties

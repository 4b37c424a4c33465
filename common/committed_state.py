"""What a table has committed, as icekeeper records it in snapshot summaries.

Every bookkeeper commit carries the whole state forward (not a delta), so the newest snapshot
that has it is enough. Snapshots made by other engines (Spark's `rewrite_data_files`, for
example) do not copy custom keys, so readers walk back through parents to the newest snapshot
that carries them; the reaper never expires that one.

Some catalogs keep no snapshot history in the table's metadata: Nessie's Iceberg REST API serves
only the current snapshot (its history is Nessie's own commit log), so one snapshot made by
another engine hides every summary icekeeper wrote. Commits through such a catalog (REST) also
carry the state in a table property, `KEY_STATE`, set in the same commit: it is read when no
snapshot of the table carries the state.
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
"""Table property: the summary keys of the bookkeeper's newest commit, as one JSON object (REST
catalogs, see the module docstring)."""

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
        """Summary properties for the next snapshot (moniker ids: those this commit adds)."""
        summary = {
            KEY_COMMIT_ID: self.commit_id or "",
            KEY_EPOCH: str(self.epoch),
            KEY_WRITERS: json.dumps(self.writer_seqs, sort_keys=True),
            KEY_OFFSETS: json.dumps(nest_by_topic(self.offsets), sort_keys=True),
            KEY_EVENT_TIME: json.dumps(nest_by_topic(self.partition_event_ms), sort_keys=True),
            KEY_MONIKERS: ",".join(moniker_ids),
            KEY_QUARANTINED: str(self.quarantined_records),
        }
        if self.watermark_ms is not None:
            summary[KEY_WATERMARK] = str(self.watermark_ms)
        if self.event_files:
            summary[KEY_EVENT_FILES] = json.dumps(list(self.event_files))
        if self.refusals:
            summary[KEY_REFUSALS] = json.dumps(
                {
                    writer: {"seq": refusal.seq, "from": nest_by_topic(refusal.from_offsets)}
                    for writer, refusal in self.refusals.items()
                },
                sort_keys=True,
            )
        if self.quarantined_monikers:
            summary[KEY_QUARANTINED_MONIKERS] = ",".join(
                self.quarantined_monikers[-QUARANTINED_MONIKERS_KEPT:]
            )
        return summary

    @classmethod
    def from_summary(
        cls, summary: Mapping[str, str], snapshot_id: int | None = None
    ) -> CommittedState:
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


def committed_state(table: Table) -> CommittedState:
    """The state carried by the newest snapshot (in the current ancestry) that has icekeeper's keys.

    Maintenance snapshots (compaction, retention) carry no state, and expiring some of them can
    break the parent chain; then the newest state-carrying snapshot of the table is the answer
    (`expirable_snapshots` never expires it).
    """
    snapshot = table.current_snapshot()
    while snapshot is not None:
        if _carries_state(snapshot):
            return CommittedState.from_summary(
                snapshot.summary.additional_properties, snapshot.snapshot_id
            )
        snapshot = (
            table.snapshot_by_id(snapshot.parent_snapshot_id)
            if snapshot.parent_snapshot_id is not None
            else None
        )
    carrier = newest_state_carrier(table)
    if carrier is not None:
        return CommittedState.from_summary(
            carrier.summary.additional_properties, carrier.snapshot_id
        )
    kept = state_property(table)
    return CommittedState.from_summary(kept) if kept is not None else CommittedState()


def state_property(table: Table) -> dict[str, str] | None:
    """The summary keys kept in the table's `KEY_STATE` property, if any."""
    kept = table.properties.get(KEY_STATE)
    return json.loads(kept) if kept else None


def newest_state_carrier(table: Table) -> Snapshot | None:
    """The newest snapshot with icekeeper's committed state, by sequence number."""
    carriers = [s for s in table.snapshots() if _carries_state(s)]
    return max(carriers, key=lambda s: (s.sequence_number or 0, s.timestamp_ms), default=None)


def expirable_snapshots(table: Table, keep: int, older_than_ms: int | None = None) -> list[int]:
    """Snapshots that may be expired: beyond the newest `keep` (and older than `older_than_ms` when
    given), never a branch or tag head, never the newest snapshot carrying icekeeper's state."""
    snapshots = sorted(
        table.snapshots(), key=lambda s: (s.sequence_number or 0, s.timestamp_ms), reverse=True
    )
    protected = {ref.snapshot_id for ref in table.metadata.refs.values()}
    carrier = newest_state_carrier(table)
    if carrier is not None:
        protected.add(carrier.snapshot_id)
    return [
        s.snapshot_id
        for s in snapshots[max(keep, 1) :]
        if s.snapshot_id not in protected
        and (older_than_ms is None or s.timestamp_ms < older_than_ms)
    ]


def _carries_state(snapshot: Snapshot) -> bool:
    return snapshot.summary is not None and KEY_COMMIT_ID in snapshot.summary.additional_properties

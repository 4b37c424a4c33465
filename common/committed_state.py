"""What a table has committed, as icekeeper records it in snapshot summaries.

Every bookkeeper commit carries the whole state forward (not a delta), so the newest snapshot
that has it is enough. Snapshots made by other engines (Spark's `rewrite_data_files`, for
example) do not copy custom keys, so readers walk back through parents to the newest snapshot
that carries them; the reaper never expires that one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping

from pyiceberg.table import Table

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

TopicPartition = tuple[str, int]


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
    snapshot_id: int | None = None

    def to_summary(self, moniker_ids: list[str]) -> dict[str, str]:
        """Summary properties for the next snapshot (moniker ids: those this commit adds)."""
        summary = {
            KEY_COMMIT_ID: self.commit_id or "",
            KEY_EPOCH: str(self.epoch),
            KEY_WRITERS: json.dumps(self.writer_seqs, sort_keys=True),
            KEY_OFFSETS: json.dumps(_nest(self.offsets), sort_keys=True),
            KEY_EVENT_TIME: json.dumps(_nest(self.partition_event_ms), sort_keys=True),
            KEY_MONIKERS: ",".join(moniker_ids),
            KEY_QUARANTINED: str(self.quarantined_records),
        }
        if self.watermark_ms is not None:
            summary[KEY_WATERMARK] = str(self.watermark_ms)
        if self.event_files:
            summary[KEY_EVENT_FILES] = json.dumps(list(self.event_files))
        return summary

    @classmethod
    def from_summary(cls, summary: Mapping[str, str], snapshot_id: int | None = None) -> "CommittedState":
        watermark = summary.get(KEY_WATERMARK)
        return cls(
            writer_seqs={k: int(v) for k, v in json.loads(summary.get(KEY_WRITERS) or "{}").items()},
            offsets=_flatten(json.loads(summary.get(KEY_OFFSETS) or "{}")),
            partition_event_ms=_flatten(json.loads(summary.get(KEY_EVENT_TIME) or "{}")),
            watermark_ms=int(watermark) if watermark else None,
            epoch=int(summary.get(KEY_EPOCH) or 0),
            commit_id=summary.get(KEY_COMMIT_ID) or None,
            quarantined_records=int(summary.get(KEY_QUARANTINED) or 0),
            event_files=tuple(json.loads(summary.get(KEY_EVENT_FILES) or "[]")),
            snapshot_id=snapshot_id,
        )


def _nest(values: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), value in values.items():
        nested.setdefault(topic, {})[str(partition)] = value
    return nested


def _flatten(nested: Mapping[str, Mapping[str, int]]) -> dict[TopicPartition, int]:
    return {(topic, int(partition)): int(value) for topic, partitions in nested.items() for partition, value in partitions.items()}


def committed_state(table: Table) -> CommittedState:
    """The state carried by the newest snapshot (in the current ancestry) that has icekeeper's keys."""
    snapshot = table.current_snapshot()
    while snapshot is not None:
        summary = snapshot.summary
        properties = summary.additional_properties if summary is not None else {}
        if KEY_COMMIT_ID in properties:
            return CommittedState.from_summary(properties, snapshot.snapshot_id)
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id is not None else None
    return CommittedState()

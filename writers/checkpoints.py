"""How far a writer has finished each source: one small JSON file per writer and source.

A batch that gives a table no rows (only other tables', tombstones or dead letters) publishes
nothing for it, so the table's own progress does not move; the checkpoint does, once the batch's
monikers are published and its dead letters sent, so those records are not read again for that
table forever. It is advisory otherwise: tables and pending monikers decide where reading starts
(`offsets.py`). The file is `{"<topic>": {"<partition>": <next offset>}}`, which `icekeeper
status` reads too.
"""

from __future__ import annotations

import json

from icekeeper.common.committed_state import nest_by_topic
from icekeeper.common.config.model import KafkaSource
from icekeeper.common.transports.folder import MonikerFolder
from icekeeper.writers.files import path_segment
from icekeeper.writers.offsets import BatchPlan
from icekeeper.writers.offsets import TopicPartition as TP


class SourceCheckpoints:
    """One writer's checkpoints, `<writer>/<source>.json` under `checkpoint_uri`."""

    def __init__(self, checkpoint_uri: str, writer_id: str) -> None:
        self.folder = MonikerFolder(checkpoint_uri)
        self.writer_id = writer_id

    def _name(self, source: KafkaSource) -> str:
        return f"{path_segment(self.writer_id)}/{path_segment(source.name)}.json"

    def read(self, source: KafkaSource) -> dict[TP, int]:
        """The next offset per topic-partition this writer
        finished for `source`; empty without a file. A file storage cannot serve now raises (an
        outage): read as none, a batch planned the tables a template names from
        `starting_offsets`, and `advance` wrote back only the batch's partitions."""
        try:
            raw = json.loads(self.folder.read_bytes(f"{self.folder.root}/{self._name(source)}"))
        except (FileNotFoundError, ValueError):
            return {}
        return {
            (topic, int(partition)): int(offset)
            for topic, partitions in raw.items()
            for partition, offset in partitions.items()
        }

    def forget(self, source: KafkaSource, partitions: set[TP]) -> None:
        """Drop `partitions`, before a batch starts them over on a recreated topic: their offsets
        are the old topic's, and `advance` only moves forward."""
        current = self.read(source)
        if partitions & set(current):
            kept = {key: value for key, value in current.items() if key not in partitions}
            self.folder.write_bytes(self._name(source), json.dumps(nest_by_topic(kept)).encode())

    def rewind(self, source: KafkaSource, positions: dict[TP, int]) -> None:
        """Move partitions back to `positions` where the checkpoint is past them, before a batch
        reads again what a table refused (`TableProgress.rereading`): the checkpoint stood past the
        refused ranges, and a batch capped below it would leave the rest unread for good."""
        current = self.read(source)
        lowered = {
            key: offset for key, offset in positions.items() if current.get(key, offset) > offset
        }
        if lowered:
            current.update(lowered)
            self.folder.write_bytes(self._name(source), json.dumps(nest_by_topic(current)).encode())

    def templated_tables(self) -> dict[str, str]:
        """Tables a source's `table_template` named that this writer published to: identifier ->
        source. A restarted writer reads their committed state too (its seq chain and any
        refusal), which it cannot otherwise find: they are not in the config."""
        try:
            known = json.loads(self.folder.read_bytes(f"{self.folder.root}/{self._tables_name}"))
        except (FileNotFoundError, ValueError):
            return {}
        return {str(identifier): str(source) for identifier, source in known.items()}

    def remember_templated_tables(self, tables: dict[str, str]) -> None:
        """Add tables to `templated_tables`, before their first moniker is published."""
        known = self.templated_tables()
        if not tables.keys() - known.keys():
            return
        known.update(tables)
        self.folder.write_bytes(self._tables_name, json.dumps(known, sort_keys=True).encode())

    @property
    def _tables_name(self) -> str:
        # Not `.json`: `icekeeper status` reads every `.json` of the folder as offsets.
        return f"{path_segment(self.writer_id)}/templated-tables"

    def advance(self, source: KafkaSource, plan: BatchPlan) -> None:
        """Note the end of the batch's read ranges (offsets only move forward)."""
        current = self.read(source)
        for key, (_, until) in plan.read_ranges.items():
            current[key] = max(current.get(key, 0), until)
        self.folder.write_bytes(self._name(source), json.dumps(nest_by_topic(current)).encode())

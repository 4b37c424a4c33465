"""A reader outside the pipeline that notes when each snapshot of a table first becomes visible.

Freshness is what a reader sees: not when the bookkeeper says it committed, but when a query
started afterwards finds the rows. This observer runs as its own process, polls the catalog
every `interval_s` (50 ms by default) and writes one JSON line per newly seen snapshot: the
moment it was first seen and the Kafka offsets the table covers from then on (`snapshot_state`:
the table property holds the newest icekeeper snapshot's; a snapshot seen in the same poll before
that one gets none, since it became visible at the same moment and the newest covers it).
Records are matched to the first snapshot covering their offset
(`committed_offsets.record_delays`).

A poll asks the catalog only for the table's current metadata location (one SQL query for a
SQL catalog, the catalog's schema shared with Java's JdbcCatalog); the metadata file is read
only when that changes, so polling 20 times a second costs the machine little.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from sqlalchemy import text

from icekeeper.common.catalog import load_table_or_none, open_catalog
from icekeeper.common.committed_state import CommittedState, snapshot_state
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.logs import configure_logging

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class SeenSnapshot:
    """A snapshot as the observer first saw it."""

    snapshot_id: int
    visible_ms: int
    """Wall-clock time of the first poll that found the snapshot in the table's metadata."""
    offsets: dict[TopicPartition, int]
    """The next offset per topic-partition the table holds from this snapshot on."""


class MetadataPointer:
    """The table's current metadata location, asked of the catalog as cheaply as it allows."""

    def __init__(self, catalog: Catalog, identifier: str) -> None:
        self.catalog = catalog
        self.identifier = identifier
        self.namespace, _, self.name = identifier.rpartition(".")

    def current(self) -> str | None:
        if isinstance(self.catalog, SqlCatalog):
            query = text(
                "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = :catalog "
                "AND table_namespace = :namespace AND table_name = :name"
            )
            with self.catalog.engine.connect() as connection:
                row = connection.execute(
                    query,
                    {"catalog": self.catalog.name, "namespace": self.namespace, "name": self.name},
                ).first()
            return row[0] if row else None
        # Other catalogs: load the table (every poll then reads its metadata file).
        table = load_table_or_none(self.catalog, self.identifier)
        return table.metadata_location if table is not None else None


def observe_snapshots(
    config: IcekeeperConfig,
    identifier: str,
    out_path: str,
    stop: Any,
    ready: Any,
    interval_s: float = 0.05,
) -> None:
    """Process target: a `SeenSnapshot` line in `out_path` per new snapshot, until `stop` is set."""
    configure_logging()
    catalog = open_catalog(config)
    pointer = MetadataPointer(catalog, identifier)
    seen: set[int] = set()
    last_location: str | None = None
    ready.set()
    with Path(out_path).open("a", encoding="utf-8") as out:
        while not stop.is_set():
            polled_ms = int(time.time() * 1000)
            try:
                location = pointer.current()
                if location is not None and location != last_location:
                    table = catalog.load_table(identifier)
                    for snapshot in table.snapshots():
                        if snapshot.snapshot_id in seen:
                            continue
                        seen.add(snapshot.snapshot_id)
                        # Only the newest icekeeper snapshot's state is in the metadata (the
                        # table property): older ones seen in the same poll became visible at
                        # the same moment, and the newest covers their offsets too.
                        state = snapshot_state(table, snapshot) or CommittedState()
                        line = {
                            "snapshot_id": snapshot.snapshot_id,
                            "visible_ms": polled_ms,
                            "offsets": [[t, p, o] for (t, p), o in state.offsets.items()],
                        }
                        out.write(json.dumps(line) + "\n")
                    out.flush()
                    last_location = location
            except Exception as error:  # noqa: BLE001 - a busy catalog: the next poll catches up
                log.warning("observing snapshots failed; retrying", extra={"error": repr(error)})
            stop.wait(max(0.0, interval_s - (time.time() * 1000 - polled_ms) / 1000))


def read_seen_snapshots(path: str | Path) -> list[SeenSnapshot]:
    """The observer's lines, in the order it saw the snapshots."""
    seen = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.endswith("}"):
            continue  # a line still being written when the observer was stopped
        entry = json.loads(line)
        offsets = {(topic, partition): offset for topic, partition, offset in entry["offsets"]}
        seen.append(SeenSnapshot(entry["snapshot_id"], entry["visible_ms"], offsets))
    return seen

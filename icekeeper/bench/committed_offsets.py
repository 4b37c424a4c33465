"""When each record of a topic became part of a table: the committed offsets of every snapshot.

The bookkeeper writes one commit report per snapshot (its commit time) and records in each
snapshot's summary the next offset of every topic-partition the table covers. A record at offset
`o` is in the table from the first snapshot whose offset for its partition is past `o`. The
bookkeeper expires snapshots (older than `bookkeeper.keep_snapshots_for` and beyond the newest
`bookkeeper.keep_snapshots`), so the summaries are read while it runs, as the reports come in.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from bisect import bisect_right
from pathlib import Path

from common.catalog import open_catalog
from common.committed_state import CommittedState
from common.config import IcekeeperConfig

log = logging.getLogger(__name__)


class CommittedOffsets:
    """Per snapshot, when it was committed and the offsets it covers, read from the table as the
    bookkeeper's commit reports come in (it keeps only its newest snapshots)."""

    def __init__(self, config: IcekeeperConfig, identifier: str) -> None:
        self.config = config
        self.identifier = identifier
        self.commits: list[tuple[int, dict[tuple[str, int], int]]] = []
        """(committed_at_ms, committed offsets) per snapshot, in commit order."""
        self._lines_read = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="committed-offsets", daemon=True)

    def start(self) -> CommittedOffsets:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.read_new()

    def _follow(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.read_new()
            except Exception as error:  # noqa: BLE001 - e.g. the catalog busy: the next look catches up
                log.warning(
                    "reading committed offsets failed; retrying", extra={"error": repr(error)}
                )

    def read_new(self) -> None:
        path = Path(self.config.bookkeeper.commit_report_path)
        text = path.read_text() if path.exists() else ""
        lines = text[
            : text.rfind("\n") + 1
        ].splitlines()  # a line still being appended waits for the next look
        new = [json.loads(line) for line in lines[self._lines_read :]]
        if not new:
            return
        table = open_catalog(self.config).load_table(self.identifier)
        for report in new:
            snapshot = table.snapshot_by_id(report["snapshot_id"])
            if snapshot is None:
                raise RuntimeError(
                    f"snapshot {report['snapshot_id']} was expired before its offsets were read"
                )
            self.commits.append(
                (
                    report["committed_at_ms"],
                    CommittedState.from_summary(snapshot.summary.additional_properties).offsets,
                )
            )
        self._lines_read += len(new)

    def freshness(self, topic: str, since_ms: int) -> list[float]:
        """Seconds from Kafka timestamp to the first snapshot covering the record, for every record
        of `topic` produced at or after `since_ms`."""
        from confluent_kafka import Consumer, TopicPartition

        covered: dict[int, tuple[list[int], list[int]]] = {}
        for committed_ms, offsets in self.commits:
            for (name, partition), until in offsets.items():
                if name == topic:
                    untils, times = covered.setdefault(partition, ([], []))
                    if not untils or until > untils[-1]:
                        untils.append(until)
                        times.append(committed_ms)
        consumer = Consumer(
            {
                "bootstrap.servers": self.config.sources[0].bootstrap_servers,
                "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
        )
        delays: list[float] = []
        try:
            for partition, (untils, times) in covered.items():
                end = untils[-1]
                consumer.assign([TopicPartition(topic, partition, 0)])
                position = 0
                while position < end:
                    messages = consumer.consume(10_000, timeout=10)
                    if not messages:
                        raise TimeoutError(
                            f"{topic}[{partition}]: no records after offset {position} (committed up to {end})"
                        )
                    for message in messages:
                        if message.error():
                            raise RuntimeError(str(message.error()))
                        position = message.offset() + 1
                        kafka_ms = message.timestamp()[1]
                        if kafka_ms >= since_ms and message.offset() < end:
                            delays.append(
                                (times[bisect_right(untils, message.offset())] - kafka_ms) / 1000
                            )
        finally:
            consumer.close()
        return delays

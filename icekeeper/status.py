"""`icekeeper status`: one screen of what operators ask first.

Per table: committed rows and snapshots, age of the last commit, freshness (now minus the
watermark), pending monikers and bytes, quarantined records. Per writer: its last moniker
(pending or committed), how far it has read each partition and the lag behind Kafka's end.
Dead letters: records in the dead-letter topic, monikers in the transport's dead-letter place,
rewrite requests the bookkeeper set aside beside the upsert tables.

Everything is read from where it already lives (table snapshot summaries, the transport,
writer checkpoints, Kafka watermarks): status needs no running service and changes nothing.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from icekeeper.common.catalog import load_table_or_none, open_catalog
from icekeeper.common.committed_state import CommittedState, StateNotInLineage, committed_state
from icekeeper.common.config.model import IcekeeperConfig, KafkaSource
from icekeeper.common.rewrites import set_aside_rewrites
from icekeeper.common.transports import open_transport

TopicPartition = tuple[str, int]


@dataclass
class Status:
    taken_ms: int
    tables: list[dict[str, Any]] = field(default_factory=list)
    writers: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: dict[str, int | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    """Services that did not answer (a Kafka cluster), one line each: `icekeeper status` prints
    them and exits 4 (common/exit_codes.py)."""

    def to_json(self) -> dict[str, Any]:
        return self.__dict__


def collect_status(config: IcekeeperConfig, kafka_timeout_s: float = 5.0) -> Status:
    status = Status(taken_ms=int(time.time() * 1000))
    transport = open_transport(config)
    pending = transport.pending()
    catalog = open_catalog(config)
    committed_seqs: dict[str, int] = {}
    set_aside_requests = 0
    for spec in config.tables:
        waiting = [m for m in pending if m.table == spec.identifier]
        row: dict[str, Any] = {
            "table": spec.identifier,
            "pending_monikers": len(waiting),
            "pending_bytes": sum(m.bytes for m in waiting),
            "pending_records": sum(m.records for m in waiting),
        }
        table = load_table_or_none(catalog, spec.identifier)
        if table is None:
            row["exists"] = False
        else:
            try:
                state = committed_state(table)
            except StateNotInLineage as error:
                # Rolled back under icekeeper: nothing is committed until it is moved back.
                status.problems.append(str(error))
                state = CommittedState()
            snapshot = table.current_snapshot()
            summary = (
                snapshot.summary.additional_properties if snapshot and snapshot.summary else {}
            )
            row.update(
                {
                    "exists": True,
                    "snapshots": len(table.snapshots()),
                    "rows": int(summary.get("total-records", 0)),
                    "last_commit_age_s": round((status.taken_ms - snapshot.timestamp_ms) / 1000, 1)
                    if snapshot
                    else None,
                    "watermark_ms": state.watermark_ms,
                    "freshness_s": round((status.taken_ms - state.watermark_ms) / 1000, 1)
                    if state.watermark_ms
                    else None,
                    "quarantined_records": state.quarantined_records,
                    "epoch": state.epoch,
                }
            )
            for writer_id, seq in state.writer_seqs.items():
                committed_seqs[writer_id] = max(committed_seqs.get(writer_id, 0), seq)
            if spec.upsert:
                try:
                    set_aside_requests += len(set_aside_rewrites(table.location()))
                except Exception as error:  # noqa: BLE001 - a status screen shows what it can
                    status.problems.append(f"{spec.identifier}: set-aside rewrites: {error}")
        status.tables.append(row)
    ends, silent = _kafka_end_offsets(config, kafka_timeout_s, status)
    for writer_id, positions, last_batch_ms in _writer_checkpoints(config):
        mine = [m for m in pending if m.writer_id == writer_id]
        newest = max(mine, key=lambda m: m.created_ms, default=None)
        partitions = []
        for (topic, partition), position in sorted(positions.items()):
            end = ends.get((topic, partition))
            partitions.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "read_until": position,
                    "end": end,
                    "lag": None if end is None else max(0, end - position),
                }
            )
        status.writers.append(
            {
                "writer": writer_id,
                "last_batch_age_s": round((status.taken_ms - last_batch_ms) / 1000, 1),
                "last_moniker": (
                    {
                        "seq": newest.seq,
                        "table": newest.table,
                        "records": newest.records,
                        "state": "pending",
                        "age_s": round((status.taken_ms - newest.created_ms) / 1000, 1),
                    }
                    if newest
                    else {"seq": committed_seqs.get(writer_id), "state": "committed"}
                ),
                "pending_monikers": len(mine),
                "partitions": partitions,
                "lag": sum(p["lag"] for p in partitions if p["lag"] is not None),
            }
        )
    try:
        status.dead_letters["monikers"] = transport.dead_letter_count()
    except Exception as error:  # noqa: BLE001 - a status screen shows what it can
        status.problems.append(f"moniker dead letters: {error}")
    status.dead_letters["rewrite requests"] = set_aside_requests
    for source in config.sources:
        if source.name in silent:
            status.dead_letters[f"topic {source.dead_letter_topic}"] = None
            continue  # asked once: another wait would tell nothing new
        status.dead_letters[f"topic {source.dead_letter_topic}"] = _topic_size(
            source, source.dead_letter_topic, kafka_timeout_s, status.problems
        )
    return status


def _writer_checkpoints(
    config: IcekeeperConfig,
) -> list[tuple[str, dict[TopicPartition, int], int]]:
    """(writer id, read position per partition, time of its last batch) from writer checkpoints."""
    root = Path(config.writer.checkpoint_uri.removeprefix("file://"))
    writers = []
    for folder in sorted(p for p in root.glob("*") if p.is_dir()) if root.exists() else []:
        positions: dict[TopicPartition, int] = {}
        newest = 0
        for checkpoint in folder.glob("*.json"):
            newest = max(newest, int(checkpoint.stat().st_mtime * 1000))
            for topic, partitions in json.loads(checkpoint.read_text()).items():
                for partition, offset in partitions.items():
                    positions[(topic, int(partition))] = int(offset)
        writers.append((folder.name, positions, newest))
    return writers


def _kafka_end_offsets(
    config: IcekeeperConfig, timeout_s: float, status: Status
) -> tuple[dict[TopicPartition, int], set[str]]:
    """The end offset of each partition the sources read, and the sources whose Kafka did not
    answer (in `status.unreachable`)."""
    ends: dict[TopicPartition, int] = {}
    silent: set[str] = set()
    for source in config.sources:
        try:
            consumer = _consumer(source)
            try:
                try:
                    metadata = consumer.list_topics(timeout=timeout_s)
                except Exception as error:  # noqa: BLE001 - no broker answered: one line for it
                    status.unreachable.append(
                        f"Kafka at {source.bootstrap_servers} (source {source.name}) did not "
                        f"answer within {timeout_s:g} s ({error}); lag and dead-letter counts "
                        "unknown"
                    )
                    silent.add(source.name)
                    continue
                topics = [
                    t
                    for t in metadata.topics
                    if (
                        t in source.topics
                        or (source.topic_pattern and re.fullmatch(source.topic_pattern, t))
                    )
                ]
                for topic in topics:
                    for partition in metadata.topics[topic].partitions:
                        _, high = consumer.get_watermark_offsets(
                            _tp(topic, partition), timeout=timeout_s
                        )
                        ends[(topic, partition)] = high
            finally:
                consumer.close()
        except Exception as error:  # noqa: BLE001 - Kafka down: show the rest
            status.problems.append(f"kafka {source.bootstrap_servers}: {error}")
    return ends, silent


def _topic_size(
    source: KafkaSource, topic: str, timeout_s: float, problems: list[str]
) -> int | None:
    """Records currently in a topic (sum of high minus low watermarks)."""
    try:
        consumer = _consumer(source)
        try:
            metadata = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
            if metadata is None or metadata.error is not None:
                return 0
            total = 0
            for partition in metadata.partitions:
                low, high = consumer.get_watermark_offsets(_tp(topic, partition), timeout=timeout_s)
                total += high - low
            return total
        finally:
            consumer.close()
    except Exception as error:  # noqa: BLE001
        problems.append(f"dead-letter topic {topic}: {error}")
        return None


def _consumer(source: KafkaSource):  # noqa: ANN202 - confluent_kafka.Consumer
    from confluent_kafka import Consumer

    from icekeeper.common.kafka_clients import librdkafka_config

    librdkafka_log = logging.getLogger("librdkafka")
    return Consumer(
        librdkafka_config(
            source,
            {
                "group.id": "icekeeper-status",
                "enable.auto.commit": False,
                "allow.auto.create.topics": False,
                # librdkafka's own lines (every refused connection, every retry) would bury the
                # screen; what failed is in its problems. `-vv` shows them.
                "log_level": 7 if librdkafka_log.isEnabledFor(logging.DEBUG) else 0,
            },
        ),
        logger=librdkafka_log,
    )


def _tp(topic: str, partition: int):  # noqa: ANN202
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    return KafkaTopicPartition(topic, partition)


def render_status(status: Status) -> str:
    """The status as a few aligned text blocks."""
    lines = [
        "icekeeper status at "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(status.taken_ms / 1000))}Z",
        "",
        "TABLES",
    ]
    lines.append(
        f"  {'table':<36} {'rows':>10} {'snaps':>6} {'last commit':>12} {'freshness':>10} "
        f"{'pending':>8} {'pending MB':>10} {'quarantined':>11}"
    )
    for row in status.tables:
        if not row.get("exists"):
            lines.append(
                f"  {row['table']:<36} {'(not created yet)':>29} {'':>10} "
                f"{row['pending_monikers']:>8} {row['pending_bytes'] / 1e6:>10.1f}"
            )
            continue
        lines.append(
            f"  {row['table']:<36} {row['rows']:>10} {row['snapshots']:>6} "
            f"{format_age(row['last_commit_age_s']):>12} {format_age(row['freshness_s']):>10} "
            f"{row['pending_monikers']:>8} {row['pending_bytes'] / 1e6:>10.1f} "
            f"{row['quarantined_records']:>11}"
        )
    lines += ["", "WRITERS"]
    if not status.writers:
        lines.append("  (no writer has run yet)")
    for writer in status.writers:
        last = writer["last_moniker"]
        lines.append(
            f"  {writer['writer']}: last batch {format_age(writer['last_batch_age_s'])} ago, last "
            f"moniker seq {last['seq']} ({last['state']}), {writer['pending_monikers']} pending, "
            f"lag {writer['lag']}"
        )
        for p in writer["partitions"]:
            lines.append(
                f"    {p['topic']}[{p['partition']}]: read until {p['read_until']} of "
                f"{p['end'] if p['end'] is not None else '?'}, lag "
                f"{p['lag'] if p['lag'] is not None else '?'}"
            )
    lines += ["", "DEAD LETTERS"]
    for place, count in status.dead_letters.items():
        lines.append(f"  {place}: {count if count is not None else '?'}")
    if status.problems:
        lines += ["", "PROBLEMS", *(f"  {problem}" for problem in status.problems)]
    return "\n".join(lines)


def format_age(seconds: float | None) -> str:
    """An age as people read it: seconds, then minutes, then hours."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"

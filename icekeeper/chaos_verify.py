"""What a chaos run must end with, checked against the Kafka records themselves.

The changelog table (`chaos.orders`): every offset of the topic exactly once, in the table or in
the dead-letter topic, never in both and never twice in either (dead letters are counted by
(partition, offset) with repeats); each row's payload (`CHANGELOG_PAYLOAD`) equal to the Kafka
record at its position; and pyiceberg, DuckDB and Spark each reading every row of it, alike
position by position and payload by payload. The upsert table (`chaos.orders_mirror`): the state
a reference builds from the topic read back and decoded here (the last change of each key in
Kafka order, a delete removes the key, records that do not decode are poison and left out), with
the same keys, no key twice and the same values, as pyiceberg, DuckDB and Spark each read it.
Nothing here trusts what icekeeper reports about itself: the reference never looks at the table,
the key index or the dead letters, and the comparisons (`compare_changelog`, `check_dead_letters`,
`engines_disagreeing`, `compare_with_reference`) are plain functions over values.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError
from pyiceberg.table import Table

from icekeeper.common.catalog import open_catalog
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.config.model import KafkaSource
from icekeeper.common.kafka_clients import Cluster, librdkafka_config, registry_client
from icekeeper.common.moniker import Moniker
from icekeeper.mirror import Key, Row, differences, latest_live_rows
from icekeeper.samples.readback import topic_messages

KEY = ["id"]
UPSERT_COLUMNS = (
    "id",
    "customer",
    "amount",
    "price",
    "status",
    "extra_1",
    "_src_op",
    "_kfk_partition",
    "_kfk_offset",
)
"""The upsert table's columns compared with the reference: the key, the synthetic stream's values
(`extra_1` arrives with the first schema change, `amount` is widened by the second), the surviving
change's operation and its Kafka position, which pins which change survived."""
CHANGELOG_PAYLOAD = ("id", "customer", "amount", "price", "status", "extra_1", "_src_op")
"""The changelog table's columns compared with the Kafka record at each row's position: the
synthetic stream's values (the `after` image, `before` for a delete) and the operation. Plain
ints, floats and strings, which every engine hands to Python alike (the timestamps are left out:
each engine gives them another type)."""

CHANGELOG_FAULTS = (
    "duplicates",
    "missing",
    "poison_in_table",
    "unknown_positions",
    "payload_mismatched",
)
"""The counts of `ChangelogComparison` that fail a run when not 0."""

Position = tuple[int, int]
"""(Kafka partition, offset) of a record; the topic is the run's one topic."""
PositionedDigest = tuple[int, int, int]
"""(partition, offset, `payload_digest`) of one changelog row as an engine read it."""


def topic_offsets(cluster: Cluster, topic: str) -> set[Position]:
    """(partition, offset) of every record of `topic`, from the partitions' end offsets."""
    consumer = Consumer(
        librdkafka_config(cluster, {"group.id": "chaos-verify"}),
        logger=logging.getLogger("librdkafka"),
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {
            (p, o)
            for p in partitions
            for o in range(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1])
        }
    finally:
        consumer.close()


def dead_letter_positions(config: IcekeeperConfig, topic: str) -> Counter[Position]:
    """(source partition, source offset) of every record in the dead-letter topic, with repeats:
    a record dead-lettered twice counts 2 (a set would hide it)."""
    positions: Counter[Position] = Counter()
    for message in topic_messages(config.sources[0], topic):
        headers = {k: v.decode() for k, v in (message.headers() or [])}
        positions[
            (int(headers["icekeeper.source.partition"]), int(headers["icekeeper.source.offset"]))
        ] += 1
    return positions


def topic_changes(source: KafkaSource, topic: str) -> tuple[list[Row], list[Position]]:
    """The topic's Debezium change events as changelog rows, and the positions of the records that
    did not decode.

    A row is the event's `after` image (`before` for a delete) with `_src_op`, `_kfk_partition`
    and `_kfk_offset`, the form `icekeeper.mirror.latest_live_rows` takes. The values are decoded
    through the registry by confluent-kafka's own deserializer, not the writers' decoder; a record
    it cannot decode (a bad magic byte, an unknown schema id, a truncated body) is poison.
    """
    deserializer = AvroDeserializer(registry_client(source))
    context = SerializationContext(topic, MessageField.VALUE)
    changes: list[Row] = []
    undecodable: list[Position] = []
    for message in topic_messages(source, topic):
        try:
            event = deserializer(message.value(), context)
        except (SerializationError, SchemaRegistryError, EOFError, ValueError, IndexError):
            undecodable.append((message.partition(), message.offset()))
            continue
        if event is None:  # a tombstone: no change of its own
            continue
        image = event["before"] if event["op"] == "d" else event["after"]
        changes.append(
            {
                **image,
                "_src_op": event["op"],
                "_kfk_partition": message.partition(),
                "_kfk_offset": message.offset(),
            }
        )
    return changes, undecodable


def payload_digest(values: Sequence[Any]) -> int:
    """A 64-bit digest of one row's payload values (in `CHANGELOG_PAYLOAD`
    order): equal values give equal digests whichever engine read them, so
    a million rows compare without holding their values."""
    return int.from_bytes(
        hashlib.blake2b(repr(tuple(values)).encode(), digest_size=8).digest(), "big"
    )


def expected_payloads(
    changes: Iterable[Row], columns: Sequence[str] = CHANGELOG_PAYLOAD
) -> dict[Position, int]:
    """The digest of each decoded Kafka record's payload, by position (`topic_changes`' rows)."""
    return {
        (row["_kfk_partition"], row["_kfk_offset"]): payload_digest(
            [row.get(name) for name in columns]
        )
        for row in changes
    }


def positioned_digests(rows: Iterable[Sequence[Any]]) -> list[PositionedDigest]:
    """Rows read as (partition, offset, *payload in
    `CHANGELOG_PAYLOAD` order) to (partition, offset, digest)."""
    return [(int(row[0]), int(row[1]), payload_digest(row[2:])) for row in rows]


@dataclass(frozen=True)
class ChangelogComparison:
    """A changelog table's rows, as one engine read them, against the topic's records."""

    rows: int
    duplicates: int
    """Rows beyond the first at a Kafka position (a record committed twice)."""
    missing: int
    """Positions of the topic neither in the table nor in the dead-letter topic (a lost record)."""
    poison_in_table: int
    """Rows at the position of a record that does not decode."""
    unknown_positions: int
    """Rows at a position the topic does not have (a wrong offset written)."""
    payload_mismatched: int
    """Rows whose payload differs from the Kafka record
    at their position (values crossed or altered)."""
    examples: tuple[str, ...]
    missing_ranges: tuple[str, ...] = ()
    """The missing positions as offset ranges per partition (`missing_ranges`)."""


def compare_changelog(
    rows: Sequence[PositionedDigest],
    expected: dict[Position, int],
    undecodable: set[Position],
    topic_positions: set[Position],
    dead_letters: Counter[Position],
) -> ChangelogComparison:
    """How one engine's read of the changelog table differs from the topic.

    Args:
        rows: (partition, offset, payload digest) of each row, as read.
        expected: the payload digest of each decodable record, by position (`expected_payloads`).
        undecodable: positions of the records that do not decode (poison).
        topic_positions: every position of the topic.
        dead_letters: dead letters by source position, with repeats.
    """
    per_position = Counter((partition, offset) for partition, offset, _ in rows)
    duplicates = sorted(position for position, count in per_position.items() if count > 1)
    missing = sorted(topic_positions - set(per_position) - set(dead_letters))
    poison = sorted(set(per_position) & undecodable)
    unknown = sorted(set(per_position) - topic_positions)
    mismatched = sorted(
        {
            (partition, offset)
            for partition, offset, digest in rows
            if (partition, offset) in expected and expected[(partition, offset)] != digest
        }
    )
    examples = (
        [f"{position}: {per_position[position]} rows" for position in duplicates[:3]]
        + [f"{position}: missing" for position in missing[:3]]
        + [f"{position}: poison in the table" for position in poison[:3]]
        + [f"{position}: not in the topic" for position in unknown[:3]]
        + [f"{position}: payload unlike the Kafka record" for position in mismatched[:3]]
    )
    return ChangelogComparison(
        rows=len(rows),
        duplicates=sum(per_position[position] - 1 for position in duplicates),
        missing=len(missing),
        missing_ranges=missing_ranges(missing, set(dead_letters)),
        poison_in_table=len(poison),
        unknown_positions=len(unknown),
        payload_mismatched=len(mismatched),
        examples=tuple(examples),
    )


def missing_ranges(
    missing: Iterable[Position], dead_lettered: set[Position], most: int = 8
) -> tuple[str, ...]:
    """Missing positions as `[partition] from..until (n missing)` ranges, the `most` largest: a
    lost batch shows as one range, not as its first three offsets. A range runs on over the
    dead-lettered positions inside it (poison is not in the table either way)."""
    ranges: list[tuple[int, int, int, int]] = []  # partition, from, until, missing
    for partition, offset in sorted(missing):
        if ranges and ranges[-1][0] == partition:
            _, start, until, count = ranges[-1]
            if all((partition, gap) in dead_lettered for gap in range(until, offset)):
                ranges[-1] = (partition, start, offset + 1, count + 1)
                continue
        ranges.append((partition, offset, offset + 1, 1))
    largest = sorted(ranges, key=lambda r: (-r[3], r[0], r[1]))[:most]
    return tuple(
        f"[{partition}] {start}..{until} ({count} missing)"
        for partition, start, until, count in sorted(largest)
    )


def waiting_for_gone(
    pending: Iterable[Moniker], committed_seqs: dict[str, dict[str, int]]
) -> list[str]:
    """Writers' chains that can never commit: the oldest pending moniker of a writer for a table
    names a `prev_seq` that the table has not committed and no pending moniker has, so its
    moniker is gone (lost by the transport, or acknowledged without being committed).

    Args:
        pending: the monikers still pending.
        committed_seqs: per table, each writer's last committed seq (`CommittedState.writer_seqs`).
    """
    chains: dict[tuple[str, str], list[Moniker]] = {}
    for moniker in pending:
        chains.setdefault((moniker.table, moniker.writer_id), []).append(moniker)
    found = []
    for (table, writer), monikers in sorted(chains.items()):
        seqs = {m.seq for m in monikers}
        committed = committed_seqs.get(table, {}).get(writer)
        oldest = min(monikers, key=lambda m: m.seq)
        gone = oldest.prev_seq
        if gone is not None and gone not in seqs and (committed is None or committed < gone):
            found.append(
                f"{table}: {writer} seq {oldest.seq} waits for seq {gone}, which is neither "
                f"committed ({writer}'s last committed seq: {committed}) nor pending"
            )
    return found


@dataclass(frozen=True)
class DeadLetterCheck:
    """The dead-letter topic against the records that do not decode: each exactly once."""

    dead_lettered: int
    """Dead letters, repeats included."""
    positions: int
    """Distinct source positions among them."""
    duplicates: int
    """Dead letters beyond the first of a position (a record dead-lettered twice)."""
    poison_not_dead_lettered: int
    """Records that do not decode and have no dead letter."""
    good_dead_lettered: int
    """Dead letters of records that decode."""
    examples: tuple[str, ...]
    most_copies: int = 0
    """Dead letters of the most often dead-lettered position."""


def check_dead_letters(
    dead_letters: Counter[Position], undecodable: set[Position]
) -> DeadLetterCheck:
    """How the dead letters (by source position, with
    repeats) differ from one per undecodable record."""
    repeated = sorted(position for position, count in dead_letters.items() if count > 1)
    absent = sorted(undecodable - set(dead_letters))
    good = sorted(set(dead_letters) - undecodable)
    examples = (
        [f"{position}: dead-lettered {dead_letters[position]} times" for position in repeated[:3]]
        + [f"{position}: poison without a dead letter" for position in absent[:3]]
        + [f"{position}: decodes, yet dead-lettered" for position in good[:3]]
    )
    return DeadLetterCheck(
        dead_lettered=sum(dead_letters.values()),
        positions=len(dead_letters),
        duplicates=sum(dead_letters[position] - 1 for position in repeated),
        poison_not_dead_lettered=len(absent),
        good_dead_lettered=len(good),
        examples=tuple(examples),
        most_copies=max(dead_letters.values(), default=0),
    )


def engines_disagreeing(reads: dict[str, Sequence[PositionedDigest]]) -> int:
    """Rows (position and payload digest, with repeats) in which some
    engine's read differs from the first engine's, counted on both sides:
    0 when every engine read the same rows with the same payloads."""
    reads_by_engine = [Counter(rows) for rows in reads.values()]
    if not reads_by_engine:
        return 0
    first = reads_by_engine[0]
    return max(
        (sum(((first - other) + (other - first)).values()) for other in reads_by_engine[1:]),
        default=0,
    )


@dataclass(frozen=True)
class UpsertComparison:
    """An upsert table's rows, as one engine read them, against the reference state."""

    rows: int
    keys: int
    duplicate_keys: int
    """Rows beyond the first of a key (0 when every key has one row)."""
    missing_keys: int
    """Keys of the reference the table lacks (a lost
    update, or a delete applied to the wrong row)."""
    extra_keys: int
    """Keys the table has and the reference does not (a resurrected row: its delete was lost)."""
    mismatched_keys: int
    """Keys on both sides whose compared columns differ (an older change survived)."""
    examples: tuple[str, ...]


def compare_with_reference(
    rows: list[Row], reference: dict[Key, Row], columns: tuple[str, ...] = UPSERT_COLUMNS
) -> UpsertComparison:
    """How `rows` (one engine's read of the upsert table)
    differ from `reference` (latest live rows by key)."""
    per_key = Counter(tuple(row[name] for name in KEY) for row in rows)
    mirror = {tuple(row[name] for name in KEY): row for row in rows}
    expected = {key: {name: row.get(name) for name in columns} for key, row in reference.items()}
    found = differences(expected, mirror)
    one_side = [d for d in found if d.column is None]
    return UpsertComparison(
        rows=len(rows),
        keys=len(per_key),
        duplicate_keys=sum(count - 1 for count in per_key.values() if count > 1),
        missing_keys=sum(1 for d in one_side if d.key in expected),
        extra_keys=sum(1 for d in one_side if d.key not in expected),
        mismatched_keys=len({d.key for d in found if d.column is not None}),
        examples=tuple(str(d) for d in found[:5])
        + tuple(f"key {key[0]}: {count} rows" for key, count in per_key.items() if count > 1)[:5],
    )


def verify(
    config: IcekeeperConfig,
    overrides: dict[str, str],
    topic: str,
    poison_expected: int,
    changelog_table: str | None,
    upsert_table: str | None,
) -> dict[str, Any]:
    """Every check of the run's tables (those not None), as one flat report (see `failures`)."""
    from icekeeper.readers import duckdb_rows

    catalog = open_catalog(config)
    changelog = catalog.load_table(changelog_table) if changelog_table else None
    read_columns = changelog_columns(changelog) if changelog is not None else []
    catalog_queries = {}
    if changelog_table:
        catalog_queries["changelog_rows"] = (
            f"SELECT {', '.join(read_columns)} FROM {{catalog}}.{changelog_table}"
        )
    upsert = catalog.load_table(upsert_table) if upsert_table else None
    upsert_read = upsert_columns(upsert) if upsert is not None else []
    if upsert_table:
        catalog_queries["upsert_rows"] = (
            f"SELECT {', '.join(upsert_read)} FROM {{catalog}}.{upsert_table}"
        )
    spark = spark_reads(overrides, catalog_queries)
    topic_positions = topic_offsets(config.sources[0], topic)
    changes, undecodable = topic_changes(config.sources[0], topic)
    dead = dead_letter_positions(config, topic + ".dlq")
    result: dict[str, Any] = {
        "records_in": len(topic_positions),
        "poison_expected": poison_expected,
        "undecodable": len(undecodable),
        **dead_letter_report(dead, set(undecodable)),
    }
    if changelog is not None:
        result.update(
            verify_changelog(
                changelog,
                read_columns,
                spark["changelog_rows"],
                changes,
                set(undecodable),
                topic_positions,
                dead,
            )
        )
    if upsert is not None:
        table = upsert
        reference = latest_live_rows(changes, KEY)
        # A column the table lacks reads as null in every row (a run whose schema change never
        # got committed): the comparison then shows each key whose reference has a value there.
        absent = dict.fromkeys(UPSERT_COLUMNS)
        engines = {
            "pyiceberg": table.scan(selected_fields=tuple(upsert_read)).to_arrow().to_pylist(),
            "duckdb": duckdb_rows(table, ", ".join(upsert_read)),
            "spark": [dict(zip(upsert_read, row)) for row in spark["upsert_rows"]],
        }
        compared = {
            engine: compare_with_reference([{**absent, **row} for row in rows], reference)
            for engine, rows in engines.items()
        }
        result.update(
            {
                "upsert_reference_keys": len(reference),
                "upsert_reference_changes": len(changes),
                "upsert_undecodable": len(undecodable),
                "upsert_rows": compared["pyiceberg"].rows,
                "upsert_keys": compared["pyiceberg"].keys,
                "upsert_duckdb_rows": compared["duckdb"].rows,
                "upsert_spark_rows": compared["spark"].rows,
                "upsert_duplicate_keys": max(c.duplicate_keys for c in compared.values()),
                "upsert_missing_keys": max(c.missing_keys for c in compared.values()),
                "upsert_extra_keys": max(c.extra_keys for c in compared.values()),
                "upsert_mismatched": max(
                    c.mismatched_keys + c.missing_keys + c.extra_keys for c in compared.values()
                ),
                "upsert_by_engine": {engine: asdict(c) for engine, c in compared.items()},
                "upsert_snapshots": len(table.snapshots()),
            }
        )
    return result


def upsert_columns(table: Table) -> list[str]:
    """The columns of `UPSERT_COLUMNS` the upsert table has (a run may end before, or stall
    before, the schema change adding `extra_1` is committed)."""
    names = {field.name for field in table.schema().fields}
    return [name for name in UPSERT_COLUMNS if name in names]


def changelog_columns(table: Table) -> list[str]:
    """The columns read from the changelog table: its Kafka position, then those of
    `CHANGELOG_PAYLOAD` it has (a short run may end before the schema change adding `extra_1`)."""
    names = {field.name for field in table.schema().fields}
    return ["_kfk_partition", "_kfk_offset", *(name for name in CHANGELOG_PAYLOAD if name in names)]


def _in_payload_order(
    rows: Iterable[Sequence[Any]], columns: list[str]
) -> Iterator[tuple[Any, ...]]:
    """Rows read as `columns` (`changelog_columns`) as (partition, offset, *`CHANGELOG_PAYLOAD`),
    None for a column the table lacks (so a Kafka value for it shows as a payload difference)."""
    where = [columns.index(name) if name in columns else None for name in CHANGELOG_PAYLOAD]
    for row in rows:
        yield (row[0], row[1], *(None if index is None else row[index] for index in where))


def _pyiceberg_tuples(table: Table, columns: list[str]) -> Iterator[tuple[Any, ...]]:
    """The table's rows as pyiceberg reads them, as
    tuples of `columns`, one Arrow batch at a time."""
    for batch in table.scan(selected_fields=tuple(columns)).to_arrow_batch_reader():
        values = batch.to_pydict()
        yield from zip(*(values[name] for name in columns))


def verify_changelog(
    table: Table,
    columns: list[str],
    spark_rows: list[list[Any]],
    changes: list[Row],
    undecodable: set[Position],
    topic_positions: set[Position],
    dead_letters: Counter[Position],
) -> dict[str, Any]:
    """Every offset of the topic exactly once in the changelog `table` or in the dead-letter topic,
    each row with the payload of its Kafka record, as pyiceberg, DuckDB and Spark (`spark_rows`,
    read as `columns`) each read the table; and the three reads alike, row by row."""
    from icekeeper.readers import duckdb_tuples

    reads = {
        "pyiceberg": positioned_digests(
            _in_payload_order(_pyiceberg_tuples(table, columns), columns)
        ),
        "duckdb": positioned_digests(_in_payload_order(duckdb_tuples(table, columns), columns)),
        "spark": positioned_digests(_in_payload_order(spark_rows, columns)),
    }
    return {
        **changelog_report(
            reads, expected_payloads(changes), undecodable, topic_positions, dead_letters
        ),
        "snapshots": len(table.snapshots()),
    }


def dead_letter_report(
    dead_letters: Counter[Position], undecodable: set[Position]
) -> dict[str, Any]:
    """`check_dead_letters` as entries of the flat report (see `failures`)."""
    checked = check_dead_letters(dead_letters, undecodable)
    return {
        "dead_lettered": checked.dead_lettered,
        "dead_letter_positions": checked.positions,
        "dead_letter_duplicates": checked.duplicates,
        "poison_not_dead_lettered": checked.poison_not_dead_lettered,
        "good_dead_lettered": checked.good_dead_lettered,
        "dead_letter_examples": list(checked.examples),
        "dead_letter_most_copies": checked.most_copies,
    }


def changelog_report(
    reads: dict[str, Sequence[PositionedDigest]],
    expected: dict[Position, int],
    undecodable: set[Position],
    topic_positions: set[Position],
    dead_letters: Counter[Position],
) -> dict[str, Any]:
    """Each engine's read (`pyiceberg`, `duckdb`, `spark`) compared with the topic
    (`compare_changelog`) and with the others (`engines_disagreeing`), as entries of the flat
    report: each count is the worst engine's."""
    compared = {
        engine: compare_changelog(rows, expected, undecodable, topic_positions, dead_letters)
        for engine, rows in reads.items()
    }
    return {
        "rows": compared["pyiceberg"].rows,
        "duckdb_rows": compared["duckdb"].rows,
        "spark_rows": compared["spark"].rows,
        **{name: max(getattr(c, name) for c in compared.values()) for name in CHANGELOG_FAULTS},
        "missing_ranges": list(max(compared.values(), key=lambda c: c.missing).missing_ranges),
        "engines_disagreeing": engines_disagreeing(reads),
        "changelog_by_engine": {engine: asdict(c) for engine, c in compared.items()},
    }


def failures(result: dict[str, Any]) -> list[str]:
    """What a user would call a failed run, in words; empty when every check of the run holds."""
    found = []
    for number, event in enumerate(result.get("reassignments") or [], 1):
        # A reassignment whose steps did not all happen did not test what it is for: the run
        # could pass without a partition ever changing writer over pending monikers.
        missed = [
            step
            for step in ("backlog_reached", "new_writers_published", "reaching_past")
            if not event.get(step)
        ]
        if missed:
            found.append(f"reassignment {number} did not happen as planned: {', '.join(missed)}")
    if (
        any(event.get("reaching_past") for event in result.get("reassignments") or [])
        and result.get("refusals_logged", 1) == 0
    ):
        found.append(
            "a new writer's moniker reached past a pending one on a moved partition, yet no "
            "bookkeeper refused a moniker: the overlap was never checked"
        )
    for chain in result.get("chains_waiting_for_gone") or []:
        found.append(f"a moniker is gone: {chain}")
    if not result.get("settled", True):
        stuck = result.get("pending_at_end_examples") or []
        found.append(
            "the tables did not take in every record before the timeout"
            + (
                f"; {result.get('pending_at_end')} monikers still pending ({'; '.join(stuck[:3])})"
                if stuck
                else ""
            )
        )
    if result.get("fenced_exit_code", 3) != 3:  # every run pauses a bookkeeper once
        found.append(
            f"the paused bookkeeper exited with {result.get('fenced_exit_code')}, not 3 (fenced)"
        )
    if result.get("dead_letter_positions", result["dead_lettered"]) != result["poison_expected"]:
        found.append(
            f"{result['dead_lettered']} dead letters for {result['poison_expected']} poison records"
        )
    # Dead letters are sent at least once (writers/dead_letters.py): a writer killed after sending a
    # batch's dead letters and before publishing its moniker sends them again when it restarts.
    # A repeat is a failure only beyond what the run's writer kills can explain.
    # The writers a reassignment kills (`chaos_reassign.py`) count too.
    writer_kills = result.get("event_writer_kills", 0) + sum(
        count
        for component, count in dict(result.get("killed") or {}).items()
        if component.startswith("writer")
    )
    repeated_beyond_kills = (
        result.get("dead_letter_most_copies", 1 + bool(result.get("dead_letter_duplicates")))
        > 1 + writer_kills
    )
    if (
        repeated_beyond_kills
        or result.get("poison_not_dead_lettered")
        or result.get("good_dead_lettered")
    ):
        found.append(
            f"dead letters: {result['dead_letter_duplicates']} repeated, "
            f"{result['poison_not_dead_lettered']} poison records without one, "
            f"{result['good_dead_lettered']} for records that decode "
            f"({'; '.join(result['dead_letter_examples'])})"
        )
    if result.get("undecodable", result["poison_expected"]) != result["poison_expected"]:
        found.append(
            f"{result['undecodable']} records of the topic do not decode for "
            f"{result['poison_expected']} poison records produced"
        )
    if "rows" in result:
        wrong = {name: result[name] for name in CHANGELOG_FAULTS if result.get(name)}
        if wrong:
            examples = list(
                dict.fromkeys(
                    example
                    for compared in result.get("changelog_by_engine", {}).values()
                    for example in compared["examples"]
                )
            )[:5]
            found.append(
                f"changelog: {', '.join(f'{count} {name}' for name, count in wrong.items())} "
                f"({'; '.join(examples)})"
                + (
                    f"; missing: {', '.join(result['missing_ranges'])}"
                    if result.get("missing_ranges")
                    else ""
                )
            )
        if not result["spark_rows"] == result["duckdb_rows"] == result["rows"]:
            found.append(
                f"changelog: rows {result['rows']}, Spark {result['spark_rows']}, DuckDB "
                f"{result['duckdb_rows']}"
            )
        if result.get("engines_disagreeing"):
            found.append(
                f"changelog: {result['engines_disagreeing']} rows (position and payload) not alike "
                "in pyiceberg, DuckDB and Spark"
            )
    if "upsert_keys" in result:
        if result["upsert_duplicate_keys"] or result["upsert_mismatched"]:
            found.append(
                f"upsert: {result['upsert_duplicate_keys']} duplicate keys, "
                f"{result['upsert_mismatched']} keys unlike the reference "
                f"({result['upsert_missing_keys']} missing, {result['upsert_extra_keys']} extra)"
            )
        if (
            not result["upsert_spark_rows"]
            == result["upsert_duckdb_rows"]
            == result["upsert_rows"]
            == result["upsert_reference_keys"]
        ):
            found.append(
                f"upsert: rows {result['upsert_rows']}, Spark {result['upsert_spark_rows']}, "
                f"DuckDB {result['upsert_duckdb_rows']}, reference "
                f"{result['upsert_reference_keys']} keys"
            )
        if result["upsert_undecodable"] != result["poison_expected"]:
            found.append(
                f"upsert reference: {result['upsert_undecodable']} undecodable records for "
                f"{result['poison_expected']} poison"
            )
    return found


def spark_reads(overrides: dict[str, str], queries: dict[str, str]) -> dict[str, list[list[Any]]]:
    """Each query's rows as Spark reads them (`{catalog}` is the config's
    catalog name), in a process of its own: a SparkSession is one per process,
    and the caller's (a test's, say) must neither be reused with another catalog
    nor stopped. One process for all queries: a JVM start costs seconds."""
    if not queries:
        return {}
    code = (
        "import json, sys; from common.config import load_config; from common.spark import "
        "spark_session; c = load_config(None); s = spark_session(c, 'icekeeper-chaos-verify', "
        "master='local[1]'); queries = json.loads(sys.argv[1]); print(json.dumps({name: [list(row) "
        "for row in s.sql(q.format(catalog=c.catalog.name)).collect()] for name, q in "
        "queries.items()})); s.stop()"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps(queries)],
        env={**os.environ, **overrides},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"Spark could not read the chaos tables: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])

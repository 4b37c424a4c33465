"""What a chaos run must end with, checked against the Kafka records themselves.

The changelog table (`chaos.orders`): every offset of the topic exactly once, in the table or in
the dead-letter topic. The upsert table (`chaos.orders_mirror`): the state a reference builds from
the topic read back and decoded here (the last change of each key in Kafka order, a delete removes
the key, records that do not decode are poison and left out), with the same keys, no key twice and
the same values, as pyiceberg, DuckDB and Spark each read it. Nothing here trusts what icekeeper
reports about itself: the reference never looks at the table, the key index or the dead letters.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError
from pyiceberg.table import Table

from common.catalog import open_catalog
from common.config import IcekeeperConfig
from common.config.model import KafkaSource
from icekeeper.mirror import Key, Row, differences, latest_live_rows
from icekeeper.samples.readback import topic_messages

KEY = ["id"]
UPSERT_COLUMNS = ("id", "customer", "amount", "price", "status", "extra_1", "_src_op", "_kfk_partition", "_kfk_offset")
"""The upsert table's columns compared with the reference: the key, the synthetic stream's values
(`extra_1` arrives with the first schema change, `amount` is widened by the second), the surviving
change's operation and its Kafka position, which pins which change survived."""


def topic_offsets(bootstrap_servers: str, topic: str) -> set[tuple[int, int]]:
    """(partition, offset) of every record of `topic`."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "chaos-verify"}, logger=logging.getLogger("librdkafka"))
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {(p, o) for p in partitions for o in range(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1])}
    finally:
        consumer.close()


def dead_letter_positions(config: IcekeeperConfig, topic: str) -> set[tuple[int, int]]:
    """(source partition, source offset) of every record in the dead-letter topic."""
    positions = set()
    for message in topic_messages(config.sources[0].bootstrap_servers, topic):
        headers = {k: v.decode() for k, v in (message.headers() or [])}
        positions.add((int(headers["icekeeper.source.partition"]), int(headers["icekeeper.source.offset"])))
    return positions


def topic_changes(source: KafkaSource, topic: str) -> tuple[list[Row], int]:
    """The topic's Debezium change events as changelog rows, and how many records did not decode.

    A row is the event's `after` image (`before` for a delete) with `_src_op`, `_kfk_partition`
    and `_kfk_offset`, the form `icekeeper.mirror.latest_live_rows` takes. The values are decoded
    through the registry by confluent-kafka's own deserializer, not the writers' decoder; a record
    it cannot decode (a bad magic byte, an unknown schema id, a truncated body) is poison.
    """
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": source.schema_registry_url}))
    context = SerializationContext(topic, MessageField.VALUE)
    changes, undecodable = [], 0
    for message in topic_messages(source.bootstrap_servers, topic):
        try:
            event = deserializer(message.value(), context)
        except (SerializationError, SchemaRegistryError, EOFError, ValueError, IndexError):
            undecodable += 1
            continue
        if event is None:  # a tombstone: no change of its own
            continue
        image = event["before"] if event["op"] == "d" else event["after"]
        changes.append({**image, "_src_op": event["op"], "_kfk_partition": message.partition(), "_kfk_offset": message.offset()})
    return changes, undecodable


@dataclass(frozen=True)
class UpsertComparison:
    """An upsert table's rows, as one engine read them, against the reference state."""

    rows: int
    keys: int
    duplicate_keys: int
    """Rows beyond the first of a key (0 when every key has one row)."""
    missing_keys: int
    """Keys of the reference the table lacks (a lost update, or a delete applied to the wrong row)."""
    extra_keys: int
    """Keys the table has and the reference does not (a resurrected row: its delete was lost)."""
    mismatched_keys: int
    """Keys on both sides whose compared columns differ (an older change survived)."""
    examples: tuple[str, ...]


def compare_with_reference(rows: list[Row], reference: dict[Key, Row], columns: tuple[str, ...] = UPSERT_COLUMNS) -> UpsertComparison:
    """How `rows` (one engine's read of the upsert table) differ from `reference` (latest live rows by key)."""
    per_key = Counter(tuple(row[name] for name in KEY) for row in rows)
    mirror = {tuple(row[name] for name in KEY): row for row in rows}
    expected = {key: {name: row.get(name) for name in columns} for key, row in reference.items()}
    found = differences(expected, mirror)
    one_side = [d for d in found if d.column is None]
    return UpsertComparison(
        rows=len(rows), keys=len(per_key), duplicate_keys=sum(count - 1 for count in per_key.values() if count > 1),
        missing_keys=sum(1 for d in one_side if d.key in expected), extra_keys=sum(1 for d in one_side if d.key not in expected),
        mismatched_keys=len({d.key for d in found if d.column is not None}),
        examples=tuple(str(d) for d in found[:5]) + tuple(f"key {key[0]}: {count} rows" for key, count in per_key.items() if count > 1)[:5],
    )


def verify(config: IcekeeperConfig, overrides: dict[str, str], topic: str, poison_expected: int,
           changelog_table: str | None, upsert_table: str | None) -> dict[str, Any]:
    """Every check of the run's tables (those not None), as one flat report (see `failures`)."""
    from icekeeper.readers import duckdb_rows

    catalog_queries = {}
    if changelog_table:
        catalog_queries["changelog_count"] = f"SELECT count(*) FROM {{catalog}}.{changelog_table}"
    if upsert_table:
        catalog_queries["upsert_rows"] = f"SELECT {', '.join(UPSERT_COLUMNS)} FROM {{catalog}}.{upsert_table}"
    spark = spark_reads(overrides, catalog_queries)
    dead = dead_letter_positions(config, topic + ".dlq")
    result: dict[str, Any] = {"records_in": len(topic_offsets(config.sources[0].bootstrap_servers, topic)), "dead_lettered": len(dead),
                              "poison_expected": poison_expected}
    catalog = open_catalog(config)
    if changelog_table:
        table = catalog.load_table(changelog_table)
        result.update(verify_changelog(config, table, topic, dead))
        result.update(spark_rows=spark["changelog_count"][0][0], duckdb_rows=int(duckdb_rows(table, "count(*) AS n")[0]["n"]))
    if upsert_table:
        table = catalog.load_table(upsert_table)
        changes, undecodable = topic_changes(config.sources[0], topic)
        reference = latest_live_rows(changes, KEY)
        engines = {
            "pyiceberg": table.scan(selected_fields=UPSERT_COLUMNS).to_arrow().to_pylist(),
            "duckdb": duckdb_rows(table, ", ".join(UPSERT_COLUMNS)),
            "spark": [dict(zip(UPSERT_COLUMNS, row)) for row in spark["upsert_rows"]],
        }
        compared = {engine: compare_with_reference(rows, reference) for engine, rows in engines.items()}
        result.update({
            "upsert_reference_keys": len(reference), "upsert_reference_changes": len(changes), "upsert_undecodable": undecodable,
            "upsert_rows": compared["pyiceberg"].rows, "upsert_keys": compared["pyiceberg"].keys,
            "upsert_duckdb_rows": compared["duckdb"].rows, "upsert_spark_rows": compared["spark"].rows,
            "upsert_duplicate_keys": max(c.duplicate_keys for c in compared.values()),
            "upsert_missing_keys": max(c.missing_keys for c in compared.values()),
            "upsert_extra_keys": max(c.extra_keys for c in compared.values()),
            "upsert_mismatched": max(c.mismatched_keys + c.missing_keys + c.extra_keys for c in compared.values()),
            "upsert_by_engine": {engine: asdict(c) for engine, c in compared.items()},
            "upsert_snapshots": len(table.snapshots()),
        })
    return result


def verify_changelog(config: IcekeeperConfig, table: Table, topic: str, dead: set[tuple[int, int]]) -> dict[str, Any]:
    """Every offset of `topic` exactly once in the changelog `table`, or in the dead-letter topic."""
    arrow = table.scan(selected_fields=("_kfk_partition", "_kfk_offset")).to_arrow()
    positions = Counter(zip(arrow.column("_kfk_partition").to_pylist(), arrow.column("_kfk_offset").to_pylist()))
    offsets = topic_offsets(config.sources[0].bootstrap_servers, topic)
    return {
        "rows": sum(positions.values()), "duplicates": sum(count - 1 for count in positions.values() if count > 1),
        "missing": len(offsets - set(positions) - dead), "poison_in_table": len(dead & set(positions)), "snapshots": len(table.snapshots()),
    }


def failures(result: dict[str, Any]) -> list[str]:
    """What a user would call a failed run, in words; empty when every check of the run holds."""
    found = []
    if not result.get("settled", True):
        found.append("the tables did not take in every record before the timeout")
    if result.get("fenced_exit_code", 3) != 3:  # every run pauses a bookkeeper once
        found.append(f"the paused bookkeeper exited with {result.get('fenced_exit_code')}, not 3 (fenced)")
    if result["dead_lettered"] != result["poison_expected"]:
        found.append(f"{result['dead_lettered']} dead letters for {result['poison_expected']} poison records")
    if "rows" in result:
        if result["duplicates"] or result["missing"] or result["poison_in_table"]:
            found.append(f"changelog: {result['duplicates']} duplicates, {result['missing']} missing, {result['poison_in_table']} poison in the table")
        if not result["spark_rows"] == result["duckdb_rows"] == result["rows"]:
            found.append(f"changelog: rows {result['rows']}, Spark {result['spark_rows']}, DuckDB {result['duckdb_rows']}")
    if "upsert_keys" in result:
        if result["upsert_duplicate_keys"] or result["upsert_mismatched"]:
            found.append(f"upsert: {result['upsert_duplicate_keys']} duplicate keys, {result['upsert_mismatched']} keys unlike the reference "
                         f"({result['upsert_missing_keys']} missing, {result['upsert_extra_keys']} extra)")
        if not result["upsert_spark_rows"] == result["upsert_duckdb_rows"] == result["upsert_rows"] == result["upsert_reference_keys"]:
            found.append(f"upsert: rows {result['upsert_rows']}, Spark {result['upsert_spark_rows']}, DuckDB {result['upsert_duckdb_rows']}, "
                         f"reference {result['upsert_reference_keys']} keys")
        if result["upsert_undecodable"] != result["poison_expected"]:
            found.append(f"upsert reference: {result['upsert_undecodable']} undecodable records for {result['poison_expected']} poison")
    return found


def spark_reads(overrides: dict[str, str], queries: dict[str, str]) -> dict[str, list[list[Any]]]:
    """Each query's rows as Spark reads them (`{catalog}` is the config's catalog name), in a process
    of its own: a SparkSession is one per process, and the caller's (a test's, say) must neither be
    reused with another catalog nor stopped. One process for all queries: a JVM start costs seconds."""
    if not queries:
        return {}
    code = ("import json, sys; from common.config import load_config; from common.spark import spark_session; c = load_config(None); "
            "s = spark_session(c, 'icekeeper-chaos-verify', master='local[1]'); queries = json.loads(sys.argv[1]); "
            "print(json.dumps({name: [list(row) for row in s.sql(q.format(catalog=c.catalog.name)).collect()] for name, q in queries.items()})); s.stop()")
    result = subprocess.run([sys.executable, "-c", code, json.dumps(queries)], env={**os.environ, **overrides}, capture_output=True, text=True,
                            timeout=600, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"Spark could not read the chaos tables: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])

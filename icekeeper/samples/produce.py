"""Produce the sample and synthetic streams to Kafka, Confluent-framed through the registry.

Framing is done here with fastavro rather than confluent-kafka's AvroSerializer: we need to
write several schema versions into one topic with exact ids, and to corrupt frames on purpose
(poison messages), neither of which the serializer allows.
"""

from __future__ import annotations

import io
import json
import logging
import struct
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import fastavro
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from icekeeper.common.config.model import IcekeeperConfig, KafkaSource
from icekeeper.common.kafka_clients import Cluster, librdkafka_config, registry_client
from icekeeper.common.schema import resolve_named_types
from icekeeper.samples import seed000
from icekeeper.samples.debezium import TableShape, connect_schema
from icekeeper.samples.synthetic import (
    SyntheticEvent,
    SyntheticSpec,
    schema_versions,
    synthetic_events,
)

Progress = Callable[[str], None]
MAGIC_BYTE = 0
UNKNOWN_SCHEMA_ID = 987_654_321


class ConfluentAvroFramer:
    """Registers schemas under TopicNameStrategy subjects
    and frames records: magic, id, Avro body."""

    def __init__(self, registry: SchemaRegistryClient, topic: str) -> None:
        self.registry = registry
        self.topic = topic
        self._ids: dict[str, int] = {}
        self._parsed: dict[int, Any] = {}

    def schema_id(self, schema: dict[str, Any], is_key: bool) -> int:
        text = json.dumps(schema, sort_keys=True)
        if text not in self._ids:
            subject = f"{self.topic}-{'key' if is_key else 'value'}"
            schema_id = self.registry.register_schema(subject, Schema(json.dumps(schema), "AVRO"))
            self._ids[text] = schema_id
            self._parsed[schema_id] = fastavro.parse_schema(schema)
        return self._ids[text]

    def frame(self, schema_id: int, record: dict[str, Any]) -> bytes:
        body = io.BytesIO()
        body.write(struct.pack(">bI", MAGIC_BYTE, schema_id))
        fastavro.schemaless_writer(body, self._parsed[schema_id], record)
        return body.getvalue()


def ensure_topic(cluster: Cluster, topic: str, partitions: int) -> None:
    """Create `topic` with `partitions` unless it exists (then it must have as many)."""
    admin = AdminClient(librdkafka_config(cluster))
    existing = admin.list_topics(timeout=10).topics.get(topic)
    if existing is not None and existing.error is None:
        if len(existing.partitions) != partitions:
            raise ValueError(
                f"topic {topic} exists with {len(existing.partitions)} partitions, expected "
                f"{partitions}"
            )
        return
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
    )
    for future in futures.values():
        try:
            future.result(timeout=30)
        except KafkaException as error:
            if "TOPIC_ALREADY_EXISTS" not in str(error):
                raise
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        described = admin.list_topics(topic, timeout=10).topics.get(topic)
        if (
            described is not None
            and described.error is None
            and len(described.partitions) == partitions
        ):
            return
        time.sleep(0.2)
    raise TimeoutError(f"topic {topic} did not appear")


def _producer(source: KafkaSource) -> Producer:
    return Producer(
        librdkafka_config(
            source,
            {
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 20,
                "compression.type": "lz4",
                "queue.buffering.max.messages": 1_000_000,
                "batch.size": 1_000_000,
            },
        ),
        logger=logging.getLogger("librdkafka"),
    )


def _send(
    producer: Producer,
    topic: str,
    messages: Iterable[tuple[int, bytes | None, bytes | None, int | None]],
) -> int:
    """Produce (partition, key, value, timestamp) tuples; raises if any delivery failed."""
    failures: list[str] = []

    def on_delivery(error, _message) -> None:  # noqa: ANN001 - librdkafka callback
        if error is not None:
            failures.append(str(error))

    count = 0
    for partition, key, value, timestamp_ms in messages:
        while True:
            try:
                producer.produce(
                    topic,
                    key=key,
                    value=value,
                    partition=partition,
                    timestamp=timestamp_ms or 0,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.05)
        count += 1
        if count % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(60)
    if remaining or failures:
        raise RuntimeError(
            f"{remaining} undelivered, {len(failures)} failed (first: {failures[:1]})"
        )
    return count


def produce_seed_sample(
    config: IcekeeperConfig, topic: str | None = None, progress: Progress = print
) -> dict[str, Any]:
    """Produce seed 000's tbl_test_1 stream (18 events, 4 schema versions, 3 partitions).

    Returns:
        A report: topic, records, schema ids per version, last offset per partition.
    """
    source = config.sources[0]
    topic = topic or (source.topics[0] if source.topics else seed000.TOPIC)
    ensure_topic(source, topic, seed000.PARTITIONS)
    framer = ConfluentAvroFramer(registry_client(source), topic)
    value_ids = {
        version: framer.schema_id(shape.value_schema(), is_key=False)
        for version, shape in seed000.SCHEMA_VERSIONS.items()
    }
    key_id = framer.schema_id(seed000.SCHEMA_VERSIONS[1].key_schema(), is_key=True)
    events = seed000.sample_events()
    progress(
        f"producing {len(events)} seed 000 events to {topic} (schema ids "
        f"{sorted(value_ids.values())})"
    )
    messages = [
        (
            event.partition,
            framer.frame(key_id, event.key),
            framer.frame(value_ids[event.version], event.value),
            event.kafka_timestamp_ms,
        )
        for event in events
    ]
    produced = _send(_producer(source), topic, messages)
    return {
        "topic": topic,
        "records": produced,
        "value_schema_ids": value_ids,
        "key_schema_id": key_id,
        "partitions": seed000.PARTITIONS,
    }


def produce_synthetic(
    config: IcekeeperConfig,
    spec: SyntheticSpec,
    topic: str | None = None,
    partitions: int = 3,
    progress: Progress = print,
    subject: str | None = None,
) -> dict[str, Any]:
    """Produce a synthetic stream (see `synthetic.py`); poison messages are corrupted on purpose.

    Args:
        subject: register Avro schemas under `<subject>-key`/`-value` instead of the topic's own
            subjects, as producers with another subject name strategy do.

    Returns:
        A report: topic, records, good events, poison messages by kind, schema versions.
    """
    source = config.sources[0]
    topic = topic or spec.topic
    ensure_topic(source, topic, partitions)
    shapes = schema_versions(spec)
    encode = (
        _avro_encoder(source, subject or topic, shapes)
        if spec.format == "avro"
        else _json_encoder()
    )
    poison: dict[str, int] = {}
    good = 0
    started = time.monotonic()

    def messages() -> Iterable[tuple[int, bytes | None, bytes | None, int | None]]:
        nonlocal good
        for event in synthetic_events(spec):
            key, value = encode(event)
            if event.poison:
                poison[event.poison] = poison.get(event.poison, 0) + 1
            else:
                good += 1
                if good % 100_000 == 0:
                    progress(f"  {good:,} events produced")
            yield event.partition(partitions), key, value, None

    produced = _send(_producer(source), topic, messages())
    seconds = time.monotonic() - started
    progress(f"produced {produced:,} messages to {topic} in {seconds:.1f}s")
    return {
        "topic": topic,
        "records": produced,
        "events": good,
        "poison": poison,
        "schema_versions": len(shapes),
        "partitions": partitions,
        "seconds": round(seconds, 3),
    }


def _avro_encoder(
    source: KafkaSource, subject: str, shapes: list[TableShape]
) -> Callable[[SyntheticEvent], tuple[bytes, bytes]]:
    framer = ConfluentAvroFramer(registry_client(source), subject)
    value_ids = [framer.schema_id(shape.value_schema(), is_key=False) for shape in shapes]
    key_id = framer.schema_id(shapes[0].key_schema(), is_key=True)

    def encode(event: SyntheticEvent) -> tuple[bytes, bytes]:
        key = framer.frame(key_id, event.key)
        value = framer.frame(value_ids[event.version - 1], event.value)
        if event.poison == "bad-magic-byte":
            value = b"\x07" + value[1:]
        elif event.poison == "unknown-schema-id":
            value = struct.pack(">bI", MAGIC_BYTE, UNKNOWN_SCHEMA_ID) + value[5:]
        elif event.poison == "truncated-avro":
            value = value[: 5 + max(1, (len(value) - 5) // 3)]
        return key, value

    return encode


def _json_encoder() -> Callable[[SyntheticEvent], tuple[bytes, bytes]]:
    def encode(event: SyntheticEvent) -> tuple[bytes, bytes]:
        key = json.dumps(event.key).encode()
        value = json.dumps(event.value).encode()
        if event.poison:
            value = value[: len(value) // 2]  # invalid JSON
        return key, value

    return encode


def produce_debezium_records(
    config: IcekeeperConfig,
    shape: TableShape,
    records: Iterable[tuple[Any, dict[str, Any] | None]],
    topic: str,
    encoding: str = "avro",
) -> int:
    """Produce (record key, Debezium envelope) pairs as given, in order, to partition 0 of `topic`.

    For streams a test spells out record by record: deletes with or without a `before` image or a
    key, tombstones, changes of primary key. A key is a dict (Debezium's `Key` struct of
    `shape.key`), a bare value (a primitive key, for a one-column key), or None (no key); an
    envelope of None is a tombstone.

    Args:
        encoding: `avro` (Confluent-framed, `shape`'s schemas under `<topic>-key` / `-value`),
            `json-schemas` (JsonConverter with `schemas.enable=true`: Connect's schema/payload
            envelope around key and value) or `json` (the bare key and envelope).

    Returns:
        The number of records produced.
    """
    source = config.sources[0]
    ensure_topic(source, topic, 1)
    value_schema = shape.value_schema()
    primitive_key_schema = next(
        column.avro_type for column in shape.columns if column.name == shape.key[0]
    )
    if encoding == "avro":
        framer = ConfluentAvroFramer(registry_client(source), topic)
        value_id = framer.schema_id(value_schema, is_key=False)

        def encode(key: Any, envelope: dict[str, Any] | None) -> tuple[bytes | None, bytes | None]:
            key_schema = shape.key_schema() if isinstance(key, dict) else primitive_key_schema
            framed_key = (
                None
                if key is None
                else framer.frame(framer.schema_id(key_schema, is_key=True), key)
            )  # type: ignore[arg-type]
            return framed_key, None if envelope is None else framer.frame(value_id, envelope)
    elif encoding in ("json", "json-schemas"):
        value_connect = connect_schema(resolve_named_types(value_schema))

        def enveloped(schema: dict[str, Any], payload: Any) -> bytes:
            return json.dumps(
                {"schema": schema, "payload": payload} if encoding == "json-schemas" else payload
            ).encode()

        def encode(key: Any, envelope: dict[str, Any] | None) -> tuple[bytes | None, bytes | None]:
            key_connect = connect_schema(
                shape.key_schema() if isinstance(key, dict) else primitive_key_schema
            )
            return (None if key is None else enveloped(key_connect, key)), (
                None if envelope is None else enveloped(value_connect, envelope)
            )
    else:
        raise ValueError(f"encoding {encoding!r}: use avro, json-schemas or json")
    return _send(
        _producer(source), topic, ((0, *encode(key, envelope), None) for key, envelope in records)
    )


def produce_at_rate(
    config: IcekeeperConfig,
    spec: SyntheticSpec,
    rate_per_s: float,
    topic: str | None = None,
    partitions: int = 3,
    stop: threading.Event | None = None,
    gate: Callable[[int], bool] | None = None,
) -> dict[str, Any]:
    """Produce `spec.events` synthetic events at a
    steady `rate_per_s`, Kafka timestamps = send time.

    For freshness measurements: records carry the time they were produced, so the delay to a
    committed snapshot is `commit time - Kafka timestamp`. Sends in 20 ms slices to stay steady.
    `gate` is asked, with the count sent so far, before each event: while it answers False nothing
    is sent, and the rest come later at the same rate (`icekeeper chaos` spreads its records over
    the steps of its run, however long they take).
    """
    source = config.sources[0]
    topic = topic or spec.topic
    ensure_topic(source, topic, partitions)
    encode = (
        _avro_encoder(source, topic, schema_versions(spec))
        if spec.format == "avro"
        else _json_encoder()
    )
    producer = _producer(source)
    failures: list[str] = []
    poison: dict[str, int] = {}
    started = time.monotonic()
    sent = 0
    for event in synthetic_events(spec):
        if event.poison:
            poison[event.poison] = poison.get(event.poison, 0) + 1
        if stop is not None and stop.is_set():
            break
        while gate is not None and not gate(sent) and not (stop is not None and stop.is_set()):
            held_from = time.monotonic()
            producer.poll(0.05)
            started += time.monotonic() - held_from
        due = started + sent / rate_per_s
        if due > time.monotonic() + 0.02:
            producer.poll(0)
            time.sleep(max(0.0, due - time.monotonic()))
        key, value = encode(event)
        producer.produce(
            topic,
            key=key,
            value=value,
            partition=event.partition(partitions),
            on_delivery=lambda error, _m: failures.append(str(error)) if error else None,
        )
        sent += 1
    remaining = producer.flush(60)
    if remaining or failures:
        raise RuntimeError(
            f"{remaining} undelivered, {len(failures)} failed (first: {failures[:1]})"
        )
    seconds = time.monotonic() - started
    return {
        "topic": topic,
        "records": sent,
        "poison": poison,
        "seconds": round(seconds, 3),
        "rate_per_s": round(sent / seconds, 1) if seconds else 0.0,
    }

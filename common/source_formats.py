"""The source formats a writer reads, registered in one place.

A source's `format` names one entry here. The entry says what the rest of the writer needs to
know about the format without knowing the format: whether its records name value schemas the
schema registry holds (Confluent framing: magic byte and schema id), whether a Debezium delete
without a `before` image can read its key columns from the record key's registered schema, and,
per writer engine, the module that decodes it (its `decode` function; an engine without an entry
does not take the format, and the writer runs the batch on `spark-sql`). The config model takes
its `format` names from here, so adding a format is its decoder modules, one entry here and its
tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SourceFormat:
    """One source format and what the writer needs to know of it."""

    name: str
    description: str
    registry: bool
    """Records name their value schema by id (Confluent framing): the writer asks the schema
    registry for the topics' schemas, and learns an id it does not know from a dead letter."""
    record_keys: bool = False
    """Debezium deletes without `before` read their key columns from the record key's
    registered schema (learnt by id like value schemas)."""
    decoders: dict[str, str] = field(default_factory=dict)
    """Engine name -> the module whose `decode` decodes the format on that engine."""


_SQL = "icekeeper.writers.spark_sql_engine"

SOURCE_FORMATS: dict[str, SourceFormat] = {
    f.name: f
    for f in (
        SourceFormat(
            "avro-confluent",
            "Confluent-framed Avro (magic byte + schema id): Debezium envelopes or plain records",
            registry=True,
            record_keys=True,
            decoders={
                "spark-sql": f"{_SQL}.sql_avro_confluent",
                "arrow": "icekeeper.writers.arrow_engine.avro_block",
            },
        ),
        SourceFormat(
            "debezium-json",
            "Debezium JSON events, with or without Kafka Connect's schema envelope",
            registry=False,
            decoders={"spark-sql": f"{_SQL}.sql_debezium_json"},
        ),
        SourceFormat(
            "json",
            "plain JSON objects, one row each (columns inferred per topic)",
            registry=False,
            decoders={"spark-sql": f"{_SQL}.sql_plain_json"},
        ),
        SourceFormat(
            "debezium-unwrapped-avro",
            "Confluent-framed Avro of Debezium's `ExtractNewRecordState` (unwrapped) output: "
            'the row, `__deleted: "true"` on deletes (`delete.tombstone.handling.mode: rewrite`, '
            "before Debezium 2.5 `delete.handling.mode: rewrite`: without it deletes are not "
            "seen), and the `__op`, `__ts_ms`, `__source_ts_ms`, `__db`, `__table` fields "
            "`add.fields` adds",
            registry=True,
            decoders={"spark-sql": f"{_SQL}.sql_unwrapped_avro"},
        ),
    )
}


def source_format(name: str) -> SourceFormat:
    """The registered format `name` (the config model admits no other)."""
    return SOURCE_FORMATS[name]


def formats_description() -> str:
    """The formats, for the config key's documentation."""
    return "; ".join(f"`{f.name}`: {f.description}" for f in SOURCE_FORMATS.values())

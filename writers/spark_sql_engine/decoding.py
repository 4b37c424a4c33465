"""Decode a batch of Kafka records in Spark's JVM: Confluent-framed Avro, Debezium JSON, plain JSON.

Per-record decoding in Python runs at ~18k records/s per core; Spark's `from_avro` in the JVM
is an order of magnitude faster, so decoding stays in Spark. One batch may hold several schema
versions: each registered version gets its own `from_avro` column, selected per record by
comparing the 5-byte frame prefix (magic byte + schema id) with the version's literal prefix,
so every record is decoded once, by its own writer schema, in one pass over the data.

JSON gets the same shape: one version per Kafka Connect schema the batch's Debezium JSON records
carry (typed like the Avro schema Connect would register, `connect_schema.py`), and one per topic
for schemaless JSON, typed by inference.

Every record also gets `_ik_error`: null when it decoded, else why not (`bad-magic-byte`,
`unknown-schema-id`, `undecodable-avro`, `invalid-utf8` (a string the writer reads is not
UTF-8, which `from_avro` does not check: `valid_utf8_sql`), `invalid-json`,
`payload-does-not-match-schema`, `unsupported-connect-schema: <why>`, `not-a-debezium-event`,
`unconvertible-value`, `tombstone`).

Given `RecordKeys` (a source feeding tables with primary keys), each Debezium version also reads
the Kafka record key of its deletes without a `before` image, as a row (`sql_record_keys.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icekeeper.common.schema import (
    COLLECTION,
    MAX_DECIMAL_PRECISION,
    Column,
    SchemaConversionError,
    envelope_shape,
    iceberg_type_from_spark,
)
from icekeeper.writers.avro_binary import zigzag_varint
from icekeeper.writers.confluent_frame import frame_prefix
from icekeeper.writers.connect_schema import (
    avro_from_connect,
    avro_value_sql,
    conversion_failures_sql,
    is_connect_struct,
    json_carrier_type,
)
from icekeeper.writers.key_columns import (
    RecordKeys,
    avro_key_schemas,
    key_columns_of,
    row_column_name,
    row_record,
)
from icekeeper.writers.registry import RegisteredSchema
from icekeeper.writers.spark_sql_engine import sql
from icekeeper.writers.spark_sql_engine.columns import (
    DECODE_BARRIER,
    ERROR,
    JSON_CORRUPT,
    JSON_SCHEMA,
    JSON_TEXT,
    VERSION,
    json_parsed_column,
    record_key_column,
)
from icekeeper.writers.spark_sql_engine.sql_record_keys import (
    delete_without_before_sql,
    json_key_row_sql,
)
from icekeeper.writers.version_shapes import (
    DEBEZIUM_SOURCE_FIELDS,
    VersionShape,
    reader_schema,
    shape_from_avro,
    version_column,
)

KAFKA_COLUMNS = ("key", "value", "headers", "topic", "partition", "offset", "timestamp")


@dataclass(frozen=True)
class DecodedBatch:
    """The batch with Kafka columns, `_ik_error`, and one struct column per version."""

    frame: DataFrame
    versions: list[VersionShape]
    planned_schema_ids: list[int] = field(default_factory=list)


def decode_avro_confluent(
    raw: DataFrame,
    schemas: list[RegisteredSchema],
    envelope_fields: dict[str, set[str]] | None = None,
    keys: RecordKeys | None = None,
) -> DecodedBatch:
    """Decode each record with the registered schema its frame names.

    Args:
        envelope_fields: Debezium `source`/`transaction` fields to keep; the others are skipped
            while decoding (an Avro reader schema), which measured ~20% faster decoding.
        keys: read the record keys of deletes without a `before` image with these key schemas.
    """
    prefix = "substring(value, 1, 5)"
    versions: list[VersionShape] = []
    decoded_columns: list[str] = []
    decoded_checks: list[str] = []
    key_columns: list[str] = []
    key_schemas = (
        [
            (schema.schema_id, json.loads(spark_decodable(schema.text)))
            for schema in keys.avro_schemas
        ]
        if keys
        else []
    )
    for index, schema in enumerate(schemas):
        column = version_column(index)
        options = "'mode', 'PERMISSIVE'"
        writer = spark_decodable(schema.text)
        reader = reader_schema(writer, envelope_fields) if envelope_fields else None
        if reader is not None:
            options += f", 'avroSchema', {sql.string(reader)}"
        decoded = f"from_avro(substring(value, 6), {sql.string(writer)}, map({options}))"
        decoded_columns.append(
            f"CASE WHEN {prefix} = {sql.binary(frame_prefix(schema.schema_id))} THEN {decoded} END "
            f"AS {column}"
        )
        shape = shape_from_avro(column, envelope_shape(schema.resolved), schema.schema_id)
        framed = f"{prefix} = {sql.binary(frame_prefix(schema.schema_id))}"
        decoded_checks.append(_decoded_sql(shape, json.loads(writer), framed))
        record_key = (
            _avro_record_key_sql(column, json.loads(writer), key_schemas, keys)
            if keys and shape.is_debezium
            else None
        )
        if record_key is not None:
            key_columns.append(f"{record_key[0]} AS {record_key_column(index)}")
            shape = replace(
                shape, record_key=record_key_column(index), record_key_fields=record_key[1]
            )
        versions.append(shape)
    known = [sql.binary(frame_prefix(schema.schema_id)) for schema in schemas]
    version = (
        f"CASE {prefix} "
        f"{' '.join(f'WHEN {literal} THEN {index}' for index, literal in enumerate(known))} END"
        if known
        else "CAST(NULL AS INT)"
    )
    # `spark_partition_id()` is nondeterministic, which stops Spark from pushing filters on the
    # decoded columns through this projection: pushing them would inline, and so repeat,
    # `from_avro` in the filter and the projection. The error column refers to it so that
    # column pruning keeps it.
    frame = raw.selectExpr(
        *KAFKA_COLUMNS,
        *decoded_columns,
        f"{version} AS {VERSION}",
        f"spark_partition_id() AS {DECODE_BARRIER}",
    )
    decoded_types = {f.name: f.dataType for f in frame.schema.fields}
    valid_utf8 = [
        f"WHEN {index} THEN {valid_utf8_sql(v.column, decoded_types[v.column])}"
        for index, v in enumerate(versions)
    ]
    error = (
        f"CASE WHEN {DECODE_BARRIER} < 0 THEN 'unreachable'"
        " WHEN value IS NULL THEN 'tombstone'"
        " WHEN length(value) < 5 OR substring(value, 1, 1) != X'00' THEN 'bad-magic-byte'"
        f" WHEN NOT {sql.in_list(prefix, known)} THEN 'unknown-schema-id'"
        f" WHEN NOT {sql.any_of(decoded_checks)} THEN 'undecodable-avro'"
        + (
            f" WHEN NOT (CASE {VERSION} {' '.join(valid_utf8)} ELSE true END) THEN 'invalid-utf8'"
            if valid_utf8
            else ""
        )
        + " END"
    )
    # Keys are read after the barrier, from the decoded events, so `from_avro` of values runs once.
    return DecodedBatch(
        frame.selectExpr("*", f"{error} AS {ERROR}", *key_columns),
        versions,
        [schema.schema_id for schema in schemas],
    )


def _avro_record_key_sql(
    column: str, value_schema: dict[str, Any], key_schemas: list[tuple[int, Any]], keys: RecordKeys
) -> tuple[str, tuple[str, ...]] | None:
    """SQL reading the record key of a delete without `before` as
    version `column`'s key columns, by the key schema its frame names,
    and those columns; None when no known key schema fits the row."""
    row = row_record(value_schema)
    if row is None:
        return None
    branches = []
    for schema_id, key_schema in key_schemas:
        readable = avro_key_schemas(row, key_schema, keys)
        if readable is not None:
            writer, reader = readable
            decoded = (
                f"from_avro(substring(key, 6), {sql.string(writer)}, map('mode', 'PERMISSIVE', "
                f"'avroSchema', {sql.string(reader)}))"
            )
            branches.append(f"WHEN {sql.binary(frame_prefix(schema_id))} THEN {decoded}")
    if not branches:
        return None
    expression = (
        f"CASE WHEN {delete_without_before_sql(sql.ident(column))} THEN CASE substring(key, 1, "
        f"5) {' '.join(branches)} END END"
    )
    return expression, tuple(key_columns_of([field["name"] for field in row["fields"]], keys))


def spark_decodable(schema_text: str) -> str:
    """The schema with decimals wider than Spark's 38 digits read as their bytes.

    Spark refuses a schema with such a decimal (MariaDB's DECIMAL(65, 30)) outright, which
    would fail every record of the version; the bytes are the same on the wire, and the writer
    turns them into exact text (`sql_conversions.py`). Other schemas are returned as they are.
    """
    if '"decimal"' not in schema_text:
        return schema_text

    def narrowed(node: Any) -> Any:
        if isinstance(node, list):
            return [narrowed(item) for item in node]
        if not isinstance(node, dict):
            return node
        if (
            node.get("logicalType") == "decimal"
            and int(node.get("precision", 0)) > MAX_DECIMAL_PRECISION
        ):
            return {key: value for key, value in node.items() if key != "logicalType"}
        return {key: narrowed(value) for key, value in node.items()}

    parsed = json.loads(schema_text)
    result = narrowed(parsed)
    return schema_text if result == parsed else json.dumps(result)


def valid_utf8_sql(column: str, decoded: T.StructType) -> str:
    """True when the strings of decoded struct `column` that the writer reads are UTF-8: every
    field's (Spark's `from_avro` decodes only those the reader schema keeps), `before`'s only
    where `after` is null, as the arrow engine decodes it (`avro_block.SchemaDecoder`)."""
    names = decoded.fieldNames()
    lazy_before = "before" in names and "after" in names
    checks = []
    for struct_field in decoded.fields:
        inner = _strings_valid(sql.path(column, struct_field.name), struct_field.dataType, 0)
        if inner and lazy_before and struct_field.name == "before":
            checks.append(f"({sql.path(column, 'after')} IS NOT NULL OR {sql.all_of(inner)})")
        else:
            checks.extend(inner)
    return sql.all_of(checks)


def _strings_valid(expression: str, data_type: T.DataType, depth: int) -> list[str]:
    """Conditions, true or null-safe, that each string within `expression` is UTF-8."""
    if isinstance(data_type, T.StringType):
        return [f"coalesce(is_valid_utf8({expression}), true)"]
    if isinstance(data_type, T.StructType):
        return [
            check
            for struct_field in data_type.fields
            for check in _strings_valid(
                f"{expression}.{sql.ident(struct_field.name)}", struct_field.dataType, depth
            )
        ]
    variable = f"_ik_s{depth}"
    if isinstance(data_type, T.ArrayType):
        parts = [(expression, data_type.elementType)]
    elif isinstance(data_type, T.MapType):
        parts = [
            (f"map_keys({expression})", data_type.keyType),
            (f"map_values({expression})", data_type.valueType),
        ]
    else:
        return []
    checks = []
    for items, item_type in parts:
        inner = _strings_valid(variable, item_type, depth + 1)
        if inner:
            checks.append(f"coalesce(forall({items}, {variable} -> {sql.all_of(inner)}), true)")
    return checks


def _decoded_sql(version: VersionShape, writer: Any, framed: str) -> str:
    """True when `version` (writer schema `writer`; `framed`: SQL true for a record framed
    with its schema id) decoded the record.

    In PERMISSIVE mode `from_avro` yields a struct of nulls, not null, for a body it cannot
    decode (a truncated one, say). A Debezium event counts only with its required `op`; another
    record with its first field that cannot be null. When every field may be null, a record counts
    with one field not null, or when its body starts with the bytes of a record whose every field
    is null (each union's branch index of `null`): such a body decodes, as the reader reads only
    those bytes, while one that does not decode yields the same struct of nulls. Without this a
    truncated record became a row of nulls (on `spark-sql` only: the arrow engine reads a datum
    with fastavro, which fails on it). The byte test holds only for records framed with this
    version's id: the checks of all versions are ORed, and an undecodable record of another
    version may well start with these bytes (a one-field version's are one byte, 0x00).
    """
    if version.is_debezium:
        return f"{sql.path(version.column, 'op')} IS NOT NULL"
    if not isinstance(writer, dict) or writer.get("type") != "record" or not writer["fields"]:
        return f"{sql.ident(version.column)} IS NOT NULL"
    fields = writer["fields"]
    encodings = [_null_encoding(f["type"]) for f in fields]
    required = [f["name"] for f, null in zip(fields, encodings, strict=True) if null is None]
    if required:
        return f"{sql.path(version.column, required[0])} IS NOT NULL"
    all_null = b"".join(encoding for encoding in encodings if encoding is not None)
    if not all_null:
        return f"{sql.ident(version.column)} IS NOT NULL"
    some_value = sql.any_of(f"{sql.path(version.column, f['name'])} IS NOT NULL" for f in fields)
    all_null_body = f"substring(value, 6, {len(all_null)}) = {sql.binary(all_null)}"
    return f"({some_value} OR ({framed} AND {all_null_body}))"


def _null_encoding(avro_type: Any) -> bytes | None:
    """The Avro binary encoding of null as a value of `avro_type`; None when it cannot be null."""
    if avro_type == "null" or (isinstance(avro_type, dict) and avro_type.get("type") == "null"):
        return b""
    if isinstance(avro_type, list):
        for index, branch in enumerate(avro_type):
            if branch == "null" or (isinstance(branch, dict) and branch.get("type") == "null"):
                return zigzag_varint(index)
    return None


def framed_schema_id_sql(column: str) -> str:
    """SQL for the schema id the Confluent frame of
    binary `column` names, as a number; null unframed."""
    return (
        f"CASE WHEN length({column}) >= 5 AND substring({column}, 1, 1) = X'00' THEN "
        f"CAST(conv(hex(substring({column}, 2, 4)), 16, 10) AS BIGINT) END"
    )


UNKNOWN_SCHEMA_ID = framed_schema_id_sql("value")
"""The schema id a value's frame names (only evaluated for records no version matched)."""


@dataclass(frozen=True)
class _JsonVersion:
    """A JSON version: which records it decodes and how (SQL over the batch's staged columns)."""

    shape: VersionShape
    parsed: str
    """`from_json` of the record into the version's carrier type (column `_ik_j<index>`)."""
    envelope: str
    """The parsed value (the payload of a Connect envelope), for checks before converting."""
    value: str
    """The decoded struct (column `shape.column`), from the parsed column."""
    failures: list[str] = field(default_factory=list)
    """True where a carrier value did not convert (a decimal that does not fit its column)."""
    schema_text: str | None = None
    """The Connect schema of this version's records; None for a topic's schemaless records."""
    topic: str | None = None
    """The topic whose schemaless records this version decodes; None for a Connect schema's."""
    row_carrier: T.StructType | None = None
    """The type `from_json` reads this version's row
    (`before`/`after`) into; None when it has no row."""
    row_avro: dict[str, Any] | None = None
    """Connect versions: the row as Avro, which says how its carrier converts (`avro_value_sql`)."""


def decode_json(
    spark: SparkSession, raw: DataFrame, debezium: bool, keys: RecordKeys | None = None
) -> DecodedBatch:
    """Decode JSON values: one version per Kafka Connect schema, one per topic for schemaless JSON.

    Debezium JSON may come with Kafka Connect's schema envelope (`{"schema":..,"payload":..}`,
    JsonConverter's `schemas.enable=true`) or without. Each distinct schema in the batch (one
    aggregate pass collects them) is a version typed by its schema (`writers.connect_schema`),
    as a registered Avro schema is. Records without a schema, and `format: json`, are typed by
    inference, per topic (one more pass), so tables fed by different topics never share columns.
    Every record gets `_ik_version`; a record whose schema no Iceberg table can take goes to the
    dead letters with `unsupported-connect-schema: <why>`. With `keys`, a delete without a `before`
    image reads its record key as its version's row (`sql_record_keys.py`).
    """
    text = "CAST(value AS STRING)"
    schema_text = f"get_json_object({text}, '$.schema')" if debezium else "CAST(NULL AS STRING)"
    staged = raw.selectExpr(
        *KAFKA_COLUMNS, f"{text} AS {JSON_TEXT}", f"{schema_text} AS {JSON_SCHEMA}"
    )
    connect_texts, any_schemaless = _distinct_connect_schemas(staged) if debezium else ([], True)
    versions: list[_JsonVersion] = []
    refused: dict[str, str] = {}
    for schema in connect_texts:
        version = _connect_version(schema, len(versions))
        if isinstance(version, str):
            refused[schema] = version
        else:
            versions.append(version)
    # Records whose `schema` has no field types (`{"schema": null, ...}`) are schemaless too.
    schemaless = (
        f"({JSON_SCHEMA} IS NULL OR NOT "
        f"{sql.in_list(JSON_SCHEMA, [sql.string(s) for s in connect_texts])})"
    )
    payload = (
        f"coalesce(get_json_object({JSON_TEXT}, '$.payload'), {JSON_TEXT})"
        if debezium
        else JSON_TEXT
    )
    not_debezium_topics: list[str] = []
    if any_schemaless:
        for topic, inferred in _inferred_by_topic(spark, staged, payload, schemaless).items():
            if debezium:
                if not _has_debezium_parts(inferred):
                    not_debezium_topics.append(topic)
                    continue
                inferred = _same_row_type(inferred)
            index = len(versions)
            parsed = _from_json(
                payload,
                T.StructType([*inferred.fields, T.StructField(JSON_CORRUPT, T.StringType())]),
            )
            row = next(
                (
                    f.dataType
                    for f in inferred.fields
                    if f.name in ("after", "before") and isinstance(f.dataType, T.StructType)
                ),
                None,
            )
            versions.append(
                _JsonVersion(
                    _shape_from_spark(version_column(index), inferred, debezium),
                    parsed,
                    envelope=json_parsed_column(index),
                    value=json_parsed_column(index),
                    topic=topic,
                    row_carrier=row if debezium else None,
                )
            )

    staged = staged.selectExpr(
        *KAFKA_COLUMNS,
        JSON_TEXT,
        JSON_SCHEMA,
        f"{_json_version_sql(versions, refused)} AS {VERSION}",
    )
    # As in `decode_avro_confluent`: the nondeterministic barrier keeps Spark from pushing filters
    # through this projection, which would parse every record once more per filter.
    parsed = staged.selectExpr(
        *KAFKA_COLUMNS,
        JSON_TEXT,
        JSON_SCHEMA,
        VERSION,
        *[
            f"CASE WHEN {VERSION} = {i} THEN {v.parsed} END AS {json_parsed_column(i)}"
            for i, v in enumerate(versions)
        ],
        f"spark_partition_id() AS {DECODE_BARRIER}",
    )
    key_rows = {
        i: key
        for i, v in enumerate(versions)
        if keys and (key := _json_record_key_sql(v, keys)) is not None
    }
    versions = [
        replace(
            v,
            shape=replace(
                v.shape, record_key=record_key_column(i), record_key_fields=key_rows[i][1]
            ),
        )
        if i in key_rows
        else v
        for i, v in enumerate(versions)
    ]
    frame = parsed.selectExpr(
        *KAFKA_COLUMNS,
        *[f"{v.value} AS {v.shape.column}" for v in versions],
        VERSION,
        DECODE_BARRIER,
        *[f"{key} AS {record_key_column(i)}" for i, (key, _) in key_rows.items()],
        f"{_json_error_sql(versions, refused, not_debezium_topics, debezium)} AS {ERROR}",
    )
    return DecodedBatch(frame, [v.shape for v in versions])


def _distinct_connect_schemas(staged: DataFrame) -> tuple[list[str], bool]:
    """The batch's distinct Connect schemas (as JSON text, first seen first), and whether any
    record comes without one. One aggregate pass."""
    rows = (
        staged.where("value IS NOT NULL")
        .groupBy(JSON_SCHEMA)
        .agg(F.min("timestamp").alias("first_seen"))
        .collect()
    )
    connect = [
        (row["first_seen"], row[JSON_SCHEMA])
        for row in rows
        if row[JSON_SCHEMA] is not None and is_connect_struct(json.loads(row[JSON_SCHEMA]))
    ]
    connect.sort(key=lambda pair: (pair[0] is None, pair[0] or 0, pair[1]))
    return [text for _, text in connect], len(connect) < len(rows)


def _connect_version(schema_text: str, index: int) -> _JsonVersion | str:
    """The version of records carrying Connect schema `schema_text`, or why there is none."""
    try:
        avro = avro_from_connect(json.loads(schema_text))
        shape = envelope_shape(avro)
        version_shape = shape_from_avro(version_column(index), shape, None)
        carrier = T.StructType(
            [
                T.StructField("payload", json_carrier_type(avro)),
                T.StructField(JSON_CORRUPT, T.StringType()),
            ]
        )
    except SchemaConversionError as error:
        return f"unsupported-connect-schema: {error}"
    if not shape.is_debezium or not set(DEBEZIUM_SOURCE_FIELDS) <= set(version_shape.source):
        return "not-a-debezium-event"
    payload = sql.path(json_parsed_column(index), "payload")
    return _JsonVersion(
        version_shape,
        _from_json(JSON_TEXT, carrier),
        envelope=payload,
        value=avro_value_sql(payload, avro) or payload,
        failures=conversion_failures_sql(payload, avro),
        schema_text=schema_text,
        row_carrier=json_carrier_type(shape.row),
        row_avro=shape.row,
    )


def _json_record_key_sql(
    version: _JsonVersion, keys: RecordKeys
) -> tuple[str, tuple[str, ...]] | None:
    """SQL reading the record key of a delete without `before` as the version's key columns, and
    those columns: parsed into the row's carrier types and converted as the row is, so each has
    the type it has in `before`."""
    columns = key_columns_of([column.name for column in version.shape.row], keys)
    if version.row_carrier is None or not columns:
        return None
    carrier = T.StructType([f for f in version.row_carrier.fields if f.name in columns])
    options = "map('mode', 'PERMISSIVE')"
    parsed = (
        f"from_json({json_key_row_sql(row_column_name(columns, keys.single_column))}, "
        f"{sql.string(carrier.json())}, {options})"
    )
    row_avro = (
        {
            **version.row_avro,
            "fields": [f for f in version.row_avro["fields"] if f["name"] in columns],
        }
        if version.row_avro
        else None
    )
    converted = avro_value_sql(parsed, row_avro) if row_avro is not None else None
    return (
        f"CASE WHEN {delete_without_before_sql(version.envelope)} THEN {converted or parsed} END",
        tuple(columns),
    )


def _inferred_by_topic(
    spark: SparkSession, staged: DataFrame, payload: str, schemaless: str
) -> dict[str, T.StructType]:
    """The type Spark infers for each topic's schemaless JSON objects, in one pass over the batch.

    Each payload is wrapped as `{"<topic>": <payload>}`, so one inference gives one struct per
    topic (Kafka topic names are ASCII letters, digits, `.`, `_` and `-`: nothing a JSON key must
    escape). Only objects are wrapped: one scalar would turn its topic's type into a string.
    """
    lines = staged.where(f"{schemaless} AND ltrim({payload}) LIKE '{{%'").selectExpr(
        f"concat('{{\"', topic, '\":', {payload}, '}}') AS line"
    )
    inferred = (
        spark.read.option("mode", "DROPMALFORMED").json(lines.rdd.map(lambda row: row[0])).schema
    )
    return {
        f.name: T.StructType(
            [nested for nested in f.dataType.fields if nested.name != "_corrupt_record"]
        )
        for f in inferred.fields
        if isinstance(f.dataType, T.StructType)
    }


def _has_debezium_parts(inferred: T.StructType) -> bool:
    """An inferred Debezium event type has `op`, a row and the `source` fields the writer reads;
    without them (heartbeats, schema-change events) its records are no change events."""
    fields = {f.name: f.dataType for f in inferred.fields}
    source = fields.get("source")
    has_row = any(isinstance(fields.get(name), T.StructType) for name in ("after", "before"))
    return (
        "op" in fields
        and has_row
        and isinstance(source, T.StructType)
        and set(DEBEZIUM_SOURCE_FIELDS) <= set(source.fieldNames())
    )


def _json_version_sql(versions: list[_JsonVersion], refused: dict[str, str]) -> str:
    """Index of the version of each record: by its Connect schema, else by its topic."""
    by_schema = [
        f"WHEN {JSON_SCHEMA} = {sql.string(v.schema_text)} THEN {i}"
        for i, v in enumerate(versions)
        if v.schema_text is not None
    ]
    by_schema += [f"WHEN {JSON_SCHEMA} = {sql.string(schema)} THEN NULL" for schema in refused]
    by_topic = [
        f"WHEN {sql.string(v.topic)} THEN {i}"
        for i, v in enumerate(versions)
        if v.topic is not None
    ]
    schemaless = f"CASE topic {' '.join(by_topic)} END" if by_topic else "NULL"
    return (
        f"CAST(CASE WHEN value IS NULL THEN NULL {' '.join(by_schema)} ELSE {schemaless} END AS "
        "INT)"
    )


def _from_json(text: str, carrier: T.StructType) -> str:
    options = f"map('mode', 'PERMISSIVE', 'columnNameOfCorruptRecord', {sql.string(JSON_CORRUPT)})"
    return f"from_json({text}, {sql.string(carrier.json())}, {options})"


def _json_error_sql(
    versions: list[_JsonVersion],
    refused: dict[str, str],
    not_debezium_topics: list[str],
    debezium: bool,
) -> str:
    """Why a JSON record did not decode (see the module docstring), or null."""

    def any_version(condition) -> str:  # noqa: ANN001 - (index, version) -> SQL or None
        return sql.any_of(
            f"({VERSION} = {i} AND {c})"
            for i, v in enumerate(versions)
            if (c := condition(i, v)) is not None
        )

    def unparsed(i: int) -> str:
        return (
            f"({json_parsed_column(i)} IS NULL OR "
            f"{sql.path(json_parsed_column(i), JSON_CORRUPT)} IS NOT NULL)"
        )

    branches = [
        f"WHEN {DECODE_BARRIER} < 0 THEN 'unreachable'",
        "WHEN value IS NULL THEN 'tombstone'",
    ]
    branches += [
        f"WHEN {JSON_SCHEMA} = {sql.string(schema)} THEN {sql.string(reason)}"
        for schema, reason in refused.items()
    ]
    if not_debezium_topics:
        not_debezium = sql.in_list("topic", [sql.string(t) for t in not_debezium_topics])
        branches.append(
            f"WHEN {VERSION} IS NULL AND {not_debezium} AND try_parse_json({JSON_TEXT}) IS NOT "
            "NULL THEN 'not-a-debezium-event'"
        )
    branches.append(f"WHEN {VERSION} IS NULL THEN 'invalid-json'")
    branches.append(
        f"WHEN {any_version(lambda i, v: None if v.schema_text else unparsed(i))} THEN "
        "'invalid-json'"
    )
    # A record whose schema was read is JSON, unless it breaks off after the schema.
    branches.append(
        f"WHEN {any_version(lambda i, v: unparsed(i) if v.schema_text else None)} THEN CASE WHEN "
        f"try_parse_json({JSON_TEXT}) IS NULL THEN 'invalid-json' ELSE "
        "'payload-does-not-match-schema' END"
    )
    if debezium:
        branches.append(
            f"WHEN {any_version(lambda i, v: v.envelope + '.op IS NULL')} THEN "
            "'not-a-debezium-event'"
        )
    branches.append(
        f"WHEN {any_version(lambda i, v: sql.any_of(v.failures) if v.failures else None)} THEN "
        "'unconvertible-value'"
    )
    return f"CASE {' '.join(branches)} END"


def _same_row_type(inferred: T.StructType) -> T.StructType:
    """Give `before` and `after` one struct type: inferred apart, they can differ in fields."""
    fields = {f.name: f for f in inferred.fields}
    rows = [
        fields[name].dataType
        for name in ("before", "after")
        if isinstance(fields.get(name) and fields[name].dataType, T.StructType)
    ]
    if not rows:
        return inferred
    merged: dict[str, T.StructField] = {}
    for row in rows:
        for f in row.fields:
            merged.setdefault(f.name, f)
    row_type = T.StructType(list(merged.values()))
    return T.StructType(
        [
            T.StructField(f.name, row_type, True) if f.name in ("before", "after") else f
            for f in inferred.fields
        ]
    )


def _inferred_column(name: str, data_type: T.DataType) -> Column:
    """A column of inferred JSON; arrays and maps become JSON text, as Avro's do."""
    semantic = COLLECTION if isinstance(data_type, (T.ArrayType, T.MapType)) else None
    return Column(name, iceberg_type_from_spark(data_type), semantic=semantic)


def _shape_from_spark(column: str, inferred: T.StructType, debezium: bool) -> VersionShape:
    fields = {f.name: f.dataType for f in inferred.fields}
    if not debezium:
        return VersionShape(
            column, False, [_inferred_column(name, dt) for name, dt in fields.items()]
        )
    row_struct = fields.get("after") or fields.get("before")
    row = (
        [_inferred_column(f.name, f.dataType) for f in row_struct.fields]
        if isinstance(row_struct, T.StructType)
        else []
    )
    source = (
        {f.name: iceberg_type_from_spark(f.dataType) for f in fields["source"].fields}
        if isinstance(fields.get("source"), T.StructType)
        else {}
    )
    transaction = (
        {f.name: iceberg_type_from_spark(f.dataType) for f in fields["transaction"].fields}
        if isinstance(fields.get("transaction"), T.StructType)
        else {}
    )
    return VersionShape(column, True, row, source, transaction)

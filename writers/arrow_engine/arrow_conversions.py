"""Debezium / Connect carrier values to the Iceberg values users expect, over Arrow arrays.

The conversions `writers/semantic_types.py` lists, as `spark_sql_engine/sql_conversions.py`
makes them in Spark SQL and docs/types.md describes them, value for value: the parity tests
(tests/writers/test_arrow_engine*.py) write the same records through both engines. Temporal
carriers are converted with Arrow compute; the text forms (time of day, NUMERIC without a scale)
are built per value in Python: they are rare columns, and exactness matters more there than
speed. Fallible conversions (ZonedTimestamp, VariableScaleDecimal)
return a mask of the values that did not convert, which become `unconvertible-value` dead letters.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc

from icekeeper.common.schema import WIDE_DECIMAL
from icekeeper.writers.semantic_types import MAX_TEXT_DIGITS

_MICROS = pa.timestamp("us")


def converted(values: pa.Array, semantic: str | None) -> tuple[pa.Array, pa.Array | None]:
    """The Iceberg values of carrier `values`, and a mask of those that did not convert (or
    None)."""
    if semantic is None:
        return values, None
    if semantic.startswith(WIDE_DECIMAL):
        scale = int(semantic.removeprefix(WIDE_DECIMAL))
        texts = [None if raw is None else _scaled_text(raw, scale) for raw in values.to_pylist()]
        result = pa.array(texts, pa.string())
        return result, pc.and_(pc.is_valid(values), pc.is_null(result))
    if semantic == "io.debezium.time.Date":
        return pc.cast(pc.cast(values, pa.int32()), pa.date32()), None
    if semantic == "io.debezium.time.Timestamp":
        return _micros_timestamp(pc.multiply(pc.cast(values, pa.int64()), 1000)), None
    if semantic == "io.debezium.time.MicroTimestamp":
        return _micros_timestamp(pc.cast(values, pa.int64())), None
    if semantic == "io.debezium.time.NanoTimestamp":
        return _micros_timestamp(_floor_div(pc.cast(values, pa.int64()), 1000)), None
    if semantic == "io.debezium.time.ZonedTimestamp":
        return _zoned_timestamp(values)
    if semantic in (
        "io.debezium.time.Time",
        "org.apache.kafka.connect.data.Time",
        "avro.time-millis",
    ):
        return _time_of_day(pc.multiply(pc.cast(values, pa.int64()), 1000)), None
    if semantic in ("io.debezium.time.MicroTime", "avro.time-micros"):
        return _time_of_day(pc.cast(values, pa.int64())), None
    if semantic == "io.debezium.time.NanoTime":
        return _time_of_day(_floor_div(pc.cast(values, pa.int64()), 1000)), None
    if semantic == "io.debezium.data.VariableScaleDecimal":
        return _variable_scale_text(values)
    if semantic.startswith("io.debezium.data.geometry."):
        return pc.struct_field(values, "wkb"), None
    return values, None


def _micros_timestamp(micros: pa.Array) -> pa.Array:
    return pc.cast(micros, _MICROS)


def _floor_div(values: pa.Array, divisor: int) -> pa.Array:
    """Floor division (Arrow's integer division truncates towards zero, wrong before 1970)."""
    remainder = pc.subtract(values, pc.multiply(pc.divide(values, divisor), divisor))
    truncated = pc.divide(values, divisor)
    return pc.if_else(pc.less(remainder, 0), pc.subtract(truncated, 1), truncated)


def _time_of_day(micros: pa.Array) -> pa.Array:
    """`[-]HH:MM:SS[.ffffff]`, as MariaDB prints TIME (hours may pass 24, values may be
    negative)."""

    def text(value: int | None) -> str | None:
        if value is None:
            return None
        magnitude = abs(value)
        fraction = "" if magnitude % 1_000_000 == 0 else f".{magnitude % 1_000_000:06d}"
        sign = "-" if value < 0 else ""
        hours, minutes = magnitude // 3_600_000_000, (magnitude // 60_000_000) % 60
        return f"{sign}{hours:02d}:{minutes:02d}:{(magnitude // 1_000_000) % 60:02d}{fraction}"

    return pa.array([text(value) for value in micros.to_pylist()], pa.string())


def _zoned_timestamp(values: pa.Array) -> tuple[pa.Array, pa.Array]:
    """ISO-8601 text with a zone as UTC timestamps; text that is none (PostgreSQL's `infinity`)
    does not convert."""
    texts = pc.cast(values, pa.string())
    try:
        parsed = pc.cast(texts, pa.timestamp("us", tz="UTC"))
    except pa.ArrowInvalid:
        parsed = pa.array(
            [_parse_zoned(text) for text in texts.to_pylist()], pa.timestamp("us", tz="UTC")
        )
    return parsed, pc.and_(pc.is_valid(texts), pc.is_null(parsed))


def _parse_zoned(text: str | None) -> dt.datetime | None:
    if text is None:
        return None
    try:
        parsed = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.astimezone(dt.UTC)


def _variable_scale_text(values: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Debezium's NUMERIC without a scale (`{scale, value}`: unscaled big-endian two's-complement
    bytes) as its exact digits; values of more than 38 digits do not convert (as on `spark-sql`)."""
    scales = pc.struct_field(values, "scale").to_pylist()
    unscaled = pc.struct_field(values, "value").to_pylist()
    valid = pc.is_valid(values).to_pylist()
    texts = [
        _scaled_text(raw, scale) if ok and raw is not None and scale is not None else None
        for ok, raw, scale in zip(valid, unscaled, scales, strict=True)
    ]
    result = pa.array(texts, pa.string())
    carried = pc.and_(pc.is_valid(values), pc.is_valid(pc.struct_field(values, "value")))
    return result, pc.and_(carried, pc.is_null(result))


def _scaled_text(raw: bytes, scale: int) -> str | None:
    number = int.from_bytes(raw, "big", signed=True)
    digits = str(abs(number))
    if len(digits) > MAX_TEXT_DIGITS:
        return None
    sign = "-" if number < 0 else ""
    if scale <= 0:
        # As `spark-sql` does: a scale of zero or below keeps the unscaled digits.
        return sign + digits
    padded = digits.rjust(scale + 1, "0")
    return f"{sign}{padded[:-scale]}.{padded[-scale:]}"

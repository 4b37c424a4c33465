"""Spark SQL that turns a Debezium / Connect carrier value into the Iceberg type users expect.

Debezium sends a DATETIME(6) as a long of microseconds, a DATE as an int of days, a TIME as a
long of microseconds, a TIMESTAMP as ISO text. `common.schema.SEMANTIC_TYPES` says which Iceberg
type each becomes and `writers/semantic_types.py` which carriers are converted; this module says
how, as SQL over the carrier (`{}` in each template), so the conversion runs in Spark's JVM with
the rest of the projection (the arrow engine's `arrow_conversions.py` gives the same values). The
rules for values a type cannot hold are in docs/types.md; every conversion here either is total
or reports a failure (`failed_sql`), so a value is never silently replaced by null.
"""

from __future__ import annotations

from icekeeper.common.schema import COLLECTION, WIDE_DECIMAL
from icekeeper.writers.semantic_types import FALLIBLE

_NTZ = "CAST(timestamp_micros({micros}) AS TIMESTAMP_NTZ)"
"""Wall-clock timestamps: Debezium encodes DATETIME as if it were UTC; the writer's Spark session
runs in UTC (`common.spark`), so the cast to TIMESTAMP_NTZ keeps the wall-clock digits."""


def _floor_div(value: str, divisor: int) -> str:
    """Integer floor division (DIV truncates towards zero, which is wrong before 1970)."""
    return f"(({value}) - pmod({value}, {divisor})) DIV {divisor}"


def _time_of_day(micros: str) -> str:
    """`[-]HH:MM:SS[.ffffff]`, as MariaDB prints TIME
    (hours may pass 24, values may be negative)."""
    magnitude = f"abs({micros})"
    fraction = (
        f"CASE WHEN {magnitude} % 1000000 = 0 THEN '' ELSE format_string('.%06d', {magnitude} % "
        "1000000) END"
    )
    return (
        f"CASE WHEN {micros} IS NULL THEN NULL ELSE format_string('%s%02d:%02d:%02d%s', CASE WHEN "
        f"{micros} < 0 THEN '-' ELSE '' END, {magnitude} DIV 3600000000, ({magnitude} DIV "
        f"60000000) % 60, ({magnitude} DIV 1000000) % 60, {fraction}) END"
    )


def _unscaled_decimal_text(value_bytes: str) -> str:
    """Decimal digits of a big-endian two's-complement integer (Connect's decimal bytes); null when
    it has more than 38 digits (Spark's widest decimal)."""
    first = f"CAST(conv(hex(substring({value_bytes}, 1, 1)), 16, 10) AS INT)"
    negative = f"({first} >= 128)"
    byte = f"CAST(conv(hex(substring({value_bytes}, i, 1)), 16, 10) AS INT)"
    digit = f"CASE WHEN {negative} THEN 255 - {byte} ELSE {byte} END"
    magnitude = (
        f"aggregate(sequence(1, length({value_bytes})), CAST(0 AS DECIMAL(38, 0)), (acc, i) -> "
        f"CAST(try_add(try_multiply(acc, CAST(256 AS DECIMAL(38, 0))), {digit}) AS DECIMAL(38, 0)))"
    )
    return f"CAST(CASE WHEN {negative} THEN -({magnitude} + 1) ELSE {magnitude} END AS STRING)"


def _scaled_text(unscaled: str, scale: str) -> str:
    """`unscaled` digits with a decimal point `scale` places from the right."""
    digits = f"ltrim('-', {unscaled})"
    padded = f"lpad({digits}, greatest(length({digits}), {scale} + 1), '0')"
    with_point = (
        f"CASE WHEN {scale} > 0 THEN concat(substring({padded}, 1, length({padded}) - {scale}), "
        f"'.', right({padded}, {scale})) ELSE {padded} END"
    )
    return (
        f"CASE WHEN {unscaled} IS NULL THEN NULL ELSE concat(CASE WHEN {unscaled} LIKE '-%' THEN "
        f"'-' ELSE '' END, {with_point}) END"
    )


_CONVERSIONS: dict[str, str] = {
    "io.debezium.time.Date": "date_from_unix_date({})",
    "io.debezium.time.Timestamp": _NTZ.format(micros="CAST({} AS BIGINT) * 1000"),
    "io.debezium.time.MicroTimestamp": _NTZ.format(micros="{}"),
    # Iceberg timestamps hold microseconds: nanoseconds are cut (floored) to them.
    "io.debezium.time.NanoTimestamp": _NTZ.format(micros=_floor_div("{}", 1000)),
    "io.debezium.time.ZonedTimestamp": "try_cast({} AS TIMESTAMP)",
    "io.debezium.time.Time": _time_of_day("CAST({} AS BIGINT) * 1000"),
    "io.debezium.time.MicroTime": _time_of_day("{}"),
    "io.debezium.time.NanoTime": _time_of_day(_floor_div("{}", 1000)),
    "org.apache.kafka.connect.data.Time": _time_of_day("CAST({} AS BIGINT) * 1000"),
    "avro.time-millis": _time_of_day("CAST({} AS BIGINT) * 1000"),
    "avro.time-micros": _time_of_day("{}"),
    "io.debezium.data.VariableScaleDecimal": _scaled_text(
        _unscaled_decimal_text("{}.value"), "{}.scale"
    ),
    "io.debezium.data.geometry.Geometry": "{}.wkb",
    "io.debezium.data.geometry.Geography": "{}.wkb",
    "io.debezium.data.geometry.Point": "{}.wkb",
    COLLECTION: "to_json({})",
}
"""Semantic types whose carrier needs converting (`semantic_types.CONVERTED`, and collections
as JSON text); the others (Json, Enum, Uuid, ...) are taken as they come."""


def converted_sql(value: str, semantic: str | None) -> str:
    """SQL for the Iceberg value of carrier `value` of a column of semantic type `semantic`."""
    if semantic and semantic.startswith(WIDE_DECIMAL):
        # A decimal wider than 38 digits, decoded as its bytes: exact text while the value itself
        # has at most 38 digits (Spark's arithmetic), a dead letter beyond.
        return _scaled_text(
            _unscaled_decimal_text(f"({value})"), semantic.removeprefix(WIDE_DECIMAL)
        )
    template = _CONVERSIONS.get(semantic or "")
    return template.replace("{}", f"({value})") if template else value


def failed_sql(value: str, semantic: str | None) -> str | None:
    """SQL true where the conversion of a non-null `value` gave null; None for total conversions."""
    if semantic not in FALLIBLE and not (semantic or "").startswith(WIDE_DECIMAL):
        return None
    return f"(({value}) IS NOT NULL AND {converted_sql(value, semantic)} IS NULL)"


def connect_decimal_sql(value_bytes: str, precision: int, scale: int) -> str:
    """Connect Decimal's unscaled big-endian two's-complement bytes as DECIMAL(precision, scale).

    Null when the value does not fit (more digits than `precision`, or no bytes at all, which
    Connect never writes). `<unscaled>E-<scale>` is read by Spark's cast exactly (a BigDecimal).
    """
    unscaled = _unscaled_decimal_text(value_bytes)
    return (
        f"CASE WHEN length({value_bytes}) > 0 THEN try_cast(concat({unscaled}, 'E-{scale}') AS "
        f"DECIMAL({precision}, {scale})) END"
    )

"""Debezium's semantic types (and Connect's and Avro's logical types) as the writer converts them.

A Debezium carrier value is not always the value users expect: a DATETIME(6) arrives as a long of
microseconds, a DATE as an int of days, a TIME as a long of microseconds. `common.schema` says
which Iceberg type each semantic type becomes; this module says which carriers both engines
convert, which of those conversions can fail (a value is then dead-lettered as
`unconvertible-value`, never replaced by null), and which carriers are the value already. The
conversions themselves are each engine's (`spark_sql_engine/sql_conversions.py` as SQL,
`arrow_engine/arrow_conversions.py` over Arrow arrays), value for value the same (docs/types.md;
the parity tests write the same records through both); the module test checks that each covers
`CONVERTED`.
"""

from __future__ import annotations

CONVERTED = frozenset(
    {
        "io.debezium.time.Date",  # days -> date
        "io.debezium.time.Timestamp",  # millis -> timestamp (wall clock)
        "io.debezium.time.MicroTimestamp",  # micros -> timestamp
        "io.debezium.time.NanoTimestamp",  # nanos -> timestamp, floored to micros
        "io.debezium.time.ZonedTimestamp",  # ISO text with a zone -> timestamptz
        "io.debezium.time.Time",  # millis -> `[-]HH:MM:SS[.ffffff]`
        "io.debezium.time.MicroTime",
        "io.debezium.time.NanoTime",
        "org.apache.kafka.connect.data.Time",
        "avro.time-millis",
        "avro.time-micros",
        "io.debezium.data.VariableScaleDecimal",  # {scale, value} -> exact digits
        "io.debezium.data.geometry.Geometry",  # {wkb, srid} -> wkb
        "io.debezium.data.geometry.Geography",
        "io.debezium.data.geometry.Point",
    }
)
"""Semantic types whose carrier both engines convert (besides decimals wider than 38 digits,
`common.schema.WIDE_DECIMAL`, read as their bytes and converted to exact text)."""

FALLIBLE = frozenset({"io.debezium.time.ZonedTimestamp", "io.debezium.data.VariableScaleDecimal"})
"""Conversions that give no value for some carriers (text that is no timestamp, e.g.
PostgreSQL's `infinity`; a NUMERIC of more than `MAX_TEXT_DIGITS` digits), as do wide decimals
beyond that many digits: such records are dead letters (`unconvertible-value`)."""

AS_THEY_COME = frozenset(
    {
        "io.debezium.time.Year",
        "io.debezium.time.MicroDuration",
        "io.debezium.time.NanoDuration",
        "io.debezium.time.Interval",
        "io.debezium.time.ZonedTime",
        "io.debezium.data.Json",
        "io.debezium.data.Enum",
        "io.debezium.data.EnumSet",
        "io.debezium.data.Uuid",
        "io.debezium.data.Xml",
        "io.debezium.data.Ltree",
        "io.debezium.data.Bits",
    }
)
"""Semantic types whose carrier is already the column's value."""

MAX_TEXT_DIGITS = 38
"""Spark's widest decimal: a NUMERIC or wide decimal of more digits gives no text (as on
`spark-sql`, whose arithmetic stops there)."""

"""Debezium's carrier values for given dates and times, as its connectors encode them."""

from __future__ import annotations

import datetime as dt

EPOCH = dt.date(1970, 1, 1)
UTC = dt.UTC


def days(day: dt.date) -> int:
    """io.debezium.time.Date: days since 1970-01-01."""
    return (day - EPOCH).days


def micros(moment: dt.datetime) -> int:
    """io.debezium.time.MicroTimestamp: a wall-clock time's microseconds since 1970, as if UTC."""
    return (moment - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)


def time_micros(
    hours: int, minutes: int, seconds: int, fraction: int = 0, negative: bool = False
) -> int:
    """io.debezium.time.MicroTime: microseconds of a (MariaDB: possibly negative or > 24 h) TIME."""
    value = ((hours * 60 + minutes) * 60 + seconds) * 1_000_000 + fraction
    return -value if negative else value

"""The latest live row per key of a changelog, value forms and differences (no services)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from icekeeper.mirror import (
    UTC,
    Difference,
    differences,
    latest_live_rows,
    normalized,
    source_value,
    time_text,
)


def change(
    key: int, op: str, offset: int, partition: int = 0, **columns: object
) -> dict[str, object]:
    return {"id": key, "_src_op": op, "_kfk_partition": partition, "_kfk_offset": offset, **columns}


def test_latest_live_rows_takes_the_last_change_in_kafka_order_and_drops_deleted_keys() -> None:
    changelog = [
        change(1, "u", 5, amount=3),
        change(1, "r", 0, amount=1),
        change(2, "r", 1),
        change(2, "d", 6),
        change(3, "r", 2),
        change(3, "d", 3),
        change(3, "c", 7, amount=9),  # deleted, then inserted again
        change(4, "c", 0, partition=1, amount=4),
    ]
    live = latest_live_rows(changelog, ["id"])
    assert sorted(live) == [(1,), (3,), (4,)]
    assert (live[(1,)]["amount"], live[(3,)]["amount"], live[(4,)]["amount"]) == (3, 9, 4)


def test_latest_live_rows_refuses_a_key_in_two_partitions() -> None:
    with pytest.raises(ValueError, match=r"key \(1,\) in partitions 0 and 1"):
        latest_live_rows([change(1, "c", 0), change(1, "u", 0, partition=1)], ["id"])


def test_values_of_both_sides_in_the_tables_form() -> None:
    assert time_text(dt.timedelta(hours=-1, minutes=-30)) == "-01:30:00"
    assert (
        source_value(dt.timedelta(hours=838, minutes=59, seconds=59, microseconds=5), "string")
        == "838:59:59.000005"
    )
    assert source_value(dt.datetime(2024, 5, 1, 9, 30), "timestamptz") == dt.datetime(
        2024, 5, 1, 9, 30, tzinfo=UTC
    )
    assert source_value(dt.datetime(2024, 5, 1, 9, 30), "timestamp") == dt.datetime(
        2024, 5, 1, 9, 30
    )
    eight_hours = dt.timezone(dt.timedelta(hours=8))
    assert normalized(
        dt.datetime(2024, 5, 1, 17, 30, tzinfo=eight_hours), "timestamptz"
    ) == dt.datetime(2024, 5, 1, 9, 30, tzinfo=UTC)
    assert (
        normalized(1.5, "decimal(10, 2)") == Decimal("1.5")
        and normalized(bytearray(b"x"), "binary") == b"x"
    )


def test_differences_name_keys_and_columns() -> None:
    source = {
        (1,): {"id": 1, "amount": Decimal("1.00"), "note": "a"},
        (2,): {"id": 2, "amount": Decimal("2.00"), "note": None},
    }
    mirror = {
        (1,): {"id": 1, "amount": Decimal("1.00"), "note": "a", "_src_op": "u"},
        (3,): {"id": 3, "amount": Decimal("3.00")},
    }
    assert differences(source, mirror) == [
        Difference((2,), None, "in the source, not in the table"),
        Difference((3,), None, "in the table, not in the source"),
    ]
    mirror[(2,)] = {"id": 2, "amount": Decimal("2.01")}
    del mirror[(3,)]
    found = differences(source, mirror)
    assert [str(d) for d in found] == [
        "key 2: amount: source Decimal('2.00'), table Decimal('2.01')",
        "key 2: column note is not in the table",
    ]
    assert [d.column for d in found] == ["amount", "note"]
    assert differences(source, {key: dict(row) for key, row in source.items()}) == []

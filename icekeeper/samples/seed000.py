"""Seed 000's `tbl_test_1` change stream: the reference sample every icekeeper user can replay.

The seed article lists eleven raw events (partition/offset, key, Debezium envelope) and the
resulting table, whose rows point at offsets further down partition 2. This module holds those
eleven events verbatim and fills partition 2 with the events the article's result implies
(key 1001 updated up to offset 12, keys 1003 and 1004 at offsets 13-17), so that reading the
whole topic yields exactly the five rows the article shows.

Schema versions follow the article's four `schemaHash` values: v1 (no C3), v2 adds C3, v3 adds
C5 and C4, v4 adds C6. Columns keep the article's order within a version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from icekeeper.samples.debezium import BinlogPosition, Column, TableShape, envelope

TOPIC = "test.db_gb18030_test.tbl_test_1"
PARTITIONS = 3
_TIMESTAMP = "io.debezium.time.Timestamp"
_GTID = "e45b718e-906f-11ec-89e3-0242c0a8640a"


def _shape(*middle: Column) -> TableShape:
    columns = (
        Column("ID1", "int", optional=False),
        Column("ID2", "string", optional=False),
        Column("C1", "string"),
        Column("C2", "int"),
        *middle,
        Column("CREATE_TIME", "long", connect_name=_TIMESTAMP),
        Column("UPDATE_TIME", "long", connect_name=_TIMESTAMP),
    )
    return TableShape(
        server="test", db="db_gb18030_test", table="tbl_test_1", columns=columns, key=("ID1", "ID2")
    )


SCHEMA_VERSIONS: dict[int, TableShape] = {
    1: _shape(),
    2: _shape(Column("C3", "int")),
    3: _shape(Column("C5", "string"), Column("C4", "int"), Column("C3", "int")),
    4: _shape(
        Column("C6", "string"), Column("C5", "string"), Column("C4", "int"), Column("C3", "int")
    ),
}


@dataclass(frozen=True)
class SampleEvent:
    """One event of the sample: where it goes, its schema version, and its content."""

    partition: int
    offset: int
    version: int
    key: dict[str, Any]
    value: dict[str, Any]
    kafka_timestamp_ms: int


def _row(id1: int, c1: str, c2: int, update_time: int, **extra: Any) -> dict[str, Any]:
    return {
        "ID1": id1,
        "ID2": "A",
        "C1": c1,
        "C2": c2,
        **extra,
        "CREATE_TIME": 1646101923000,
        "UPDATE_TIME": update_time,
    }


def _at(ts_ms: int, file: str, pos: int, gtid_seq: int) -> BinlogPosition:
    return BinlogPosition(ts_ms=ts_ms, file=file, pos=pos, gtid=f"{_GTID}:{gtid_seq}")


def _event(
    partition: int,
    offset: int,
    version: int,
    op: str,
    before: dict | None,
    after: dict | None,
    at: BinlogPosition,
    envelope_ts: int,
    kafka_ts: int | None = None,
) -> SampleEvent:
    shape = SCHEMA_VERSIONS[version]
    row = after if after is not None else before
    assert row is not None
    return SampleEvent(
        partition,
        offset,
        version,
        shape.key_of(row),
        envelope(shape, op, before, after, at, envelope_ts),
        kafka_ts or envelope_ts + 100,
    )


def sample_events() -> list[SampleEvent]:
    """All events, in the order they are produced (partition by partition, by offset)."""
    v3 = dict(C3=None)
    events = [
        # Partition 0: key 1005, verbatim from the article (v3 then v4).
        _event(
            0,
            0,
            3,
            "c",
            None,
            _row(1005, "V3-1", 5000, 1646296793000, C5="S4-4", C4=4000, **v3),
            _at(1646297167000, "mysql-bin.000021", 46951, 1375),
            1646297167652,
        ),
        _event(
            0,
            1,
            3,
            "u",
            _row(1005, "V3-1", 5000, 1646296793000, C5="S4-4", C4=4000, **v3),
            _row(1005, "V3-1", 5000, 1646391849000, C5="S4-421", C4=4000, **v3),
            _at(1646391849000, "mysql-bin.000021", 128416, 1419),
            1646391966649,
        ),
        _event(
            0,
            2,
            3,
            "u",
            _row(1005, "V3-1", 5000, 1646296793000, C5="S4-4", C4=4000, **v3),
            _row(1005, "V3-1", 5000, 1646391849000, C5="S4-421", C4=4000, **v3),
            _at(1646391849000, "mysql-bin.000021", 128416, 1419),
            1646392447290,
        ),
        _event(
            0,
            3,
            4,
            "u",
            _row(1005, "V3-1", 5000, 1646391849000, C6=None, C5="S4-421", C4=4000, **v3),
            _row(1005, "V3-1", 5000, 1646392418000, C6=None, C5="S4-44", C4=4000, **v3),
            _at(1646392418000, "mysql-bin.000021", 129482, 1422),
            1646392447328,
            1646392448005,
        ),
        # Partition 1: key 1002, verbatim (v1 then v2).
        _event(
            1,
            0,
            1,
            "c",
            None,
            _row(1002, "V2-1", 9002, 1646123667000),
            _at(1646125051000, "mysql-bin.000019", 15362, 1137),
            1646125051147,
        ),
        _event(
            1,
            1,
            1,
            "u",
            _row(1002, "V2-1", 9002, 1646123667000),
            _row(1002, "V2-1", 9012, 1646128132000),
            _at(1646128132000, "mysql-bin.000019", 19020, 1143),
            1646128132890,
        ),
        _event(
            1,
            2,
            1,
            "u",
            _row(1002, "V2-1", 9012, 1646128132000),
            _row(1002, "V2-1", 9013, 1646128660000),
            _at(1646128660000, "mysql-bin.000019", 22376, 1149),
            1646128660792,
        ),
        _event(
            1,
            3,
            2,
            "u",
            _row(1002, "V2-1", 9013, 1646128660000, C3=None),
            _row(1002, "V2-1", 90141, 1646129902000, C3=None),
            _at(1646129902000, "mysql-bin.000019", 28822, 1160),
            1646129902778,
            1646129902884,
        ),
        # Partition 2: key 1001, the article's first two events verbatim (v1).
        _event(
            2,
            0,
            1,
            "c",
            None,
            _row(1001, "V1-1", 8001, 1646101923000),
            _at(1646101923000, "mysql-bin.000018", 1178, 801),
            1646101923953,
        ),
        _event(
            2,
            1,
            1,
            "u",
            _row(1001, "V1-1", 8001, 1646101923000),
            _row(1001, "V1-1", 8002, 1646123667000),
            _at(1646123667000, "mysql-bin.000018", 241750, 1123),
            1646124214851,
        ),
    ]
    # Partition 2, offsets 2-12: key 1001 keeps changing until the article's final row (C2 8012).
    previous = _row(1001, "V1-1", 8002, 1646123667000)
    for offset in range(2, 13):
        version = 1 if offset < 7 else 2
        update_time = 1646123667000 + offset * 15_000_000 if offset < 12 else 1646295772000
        extra = {"C3": None} if version == 2 else {}
        current = _row(1001, "V1-1", 8000 + offset, update_time, **extra)
        before = {**previous, **extra} if version == 2 else previous
        pos, gtid = (44808, 1369) if offset == 12 else (30000 + offset * 1000, 1200 + offset)
        envelope_ts = 1646295772102 if offset == 12 else update_time + 500
        events.append(
            _event(
                2,
                offset,
                version,
                "u",
                before,
                current,
                _at(update_time, "mysql-bin.000021", pos, gtid),
                envelope_ts,
                1646295772347 if offset == 12 else None,
            )
        )
        previous = current
    # Offsets 13-17: keys 1003 and 1004 are created (v2) and reach the article's final rows.
    created_1003 = _row(1003, "V3-1", 3001, 1646296000000, C3=None)
    created_1004 = _row(1004, "V3-1", 4001, 1646296100000, C3=None)
    mid_1003 = _row(1003, "V3-1", 3010, 1646296500000, C5=None, C4=4020, C3=None)
    final_1003 = _row(1003, "V3-1", 3019, 1646297007000, C5=None, C4=4021, C3=None)
    final_1004 = _row(1004, "V3-1", 4000, 1646392418000, C6=None, C5="S4-14", C4=4000, C3=None)
    events += [
        _event(
            2,
            13,
            2,
            "c",
            None,
            created_1003,
            _at(1646296000000, "mysql-bin.000021", 45000, 1370),
            1646296000300,
        ),
        _event(
            2,
            14,
            2,
            "c",
            None,
            created_1004,
            _at(1646296100000, "mysql-bin.000021", 45500, 1371),
            1646296100300,
        ),
        _event(
            2,
            15,
            3,
            "u",
            {**created_1003, "C5": None, "C4": None},
            mid_1003,
            _at(1646296500000, "mysql-bin.000021", 46000, 1372),
            1646296500300,
        ),
        _event(
            2,
            16,
            3,
            "u",
            mid_1003,
            final_1003,
            _at(1646297007000, "mysql-bin.000021", 46573, 1374),
            1646297007714,
            1646297007806,
        ),
        _event(
            2,
            17,
            4,
            "u",
            {**created_1004, "C6": None, "C5": None, "C4": None},
            final_1004,
            _at(1646392418000, "mysql-bin.000021", 129081, 1421),
            1646392447328,
            1646392448004,
        ),
    ]
    return events


def expected_final_rows() -> dict[tuple[int, str], dict[str, Any]]:
    """Key -> the `after` row of the last event per key: the article's five-row result."""
    final: dict[tuple[int, str], dict[str, Any]] = {}
    for event in sample_events():
        after = event.value["after"]
        if after is not None:
            final[(after["ID1"], after["ID2"])] = after
    return final

"""The arrow engine's steps as plain functions (issue 15, items 4-5), without services: what it
refuses, how it cuts tasks, how it decodes a block with poison in it, and its conversions."""

from __future__ import annotations

import io
import json
import struct

import fastavro
import pyarrow as pa
import pytest

from icekeeper.common.schema import WIDE_DECIMAL, resolve_named_types
from icekeeper.samples import seed000
from icekeeper.samples.debezium import BinlogPosition, envelope
from icekeeper.writers.arrow_engine.arrow_conversions import converted
from icekeeper.writers.arrow_engine.avro_block import SchemaDecoder
from icekeeper.writers.arrow_engine.consumer_settings import librdkafka_settings
from icekeeper.writers.arrow_engine.support import layout_reason, unsupported_reason
from icekeeper.writers.arrow_engine.task_ranges import task_ranges
from icekeeper.writers.offsets import BatchPlan
from icekeeper.writers.registry import RegisteredSchema
from tests.support.seed_config import seed_config

SHAPE = seed000.SCHEMA_VERSIONS[4]


def _registered(schema: dict, schema_id: int = 7) -> RegisteredSchema:
    return RegisteredSchema(schema_id, json.dumps(schema), resolve_named_types(schema))


def test_batches_the_arrow_engine_does_not_take_are_named() -> None:
    config = seed_config()
    source, upsert = config.sources[0], config.tables[0]
    changelog = upsert.model_copy(update={"mode": "changelog"})
    seed = [_registered(SHAPE.value_schema())]

    assert unsupported_reason(source, [changelog], seed) is None
    assert unsupported_reason(source, [upsert], seed) is None  # upsert tables: arrow_upserts.py
    partitioned = changelog.model_copy(update={"partition_by": ["ID2"]})
    assert unsupported_reason(source, [partitioned], seed) is None
    assert layout_reason([partitioned], "none") is None
    assert "rebalance" in layout_reason([partitioned], "rebalance")
    tuned = source.model_copy(
        update={"consumer_properties": {"max.poll.records": "50", "fetch.max.wait.ms": "100"}}
    )
    assert unsupported_reason(tuned, [changelog], seed) is None
    java_only = source.model_copy(
        update={
            "consumer_properties": {
                "interceptor.classes": "com.example.Audit",
                "isolation.level": "read_committed",
                "check.crcs": "perhaps",
            }
        }
    )
    reason = unsupported_reason(java_only, [changelog], seed)
    assert "check.crcs, interceptor.classes" in reason and "isolation" not in reason
    json_source = source.model_copy(update={"format": "debezium-json"})
    assert "debezium-json" in unsupported_reason(json_source, [changelog], seed)
    with_map = SHAPE.value_schema()
    with_map["fields"].append({"name": "extra", "type": {"type": "map", "values": "int"}})
    assert "map" in unsupported_reason(source, [changelog], [_registered(with_map)])


def test_consumer_properties_reach_librdkafka_by_its_names() -> None:
    settings = librdkafka_settings(
        {
            "fetch.max.wait.ms": "100",
            "receive.buffer.bytes": "65536",
            "max.partition.fetch.bytes": "1048576",
            "partition.assignment.strategy": "org.apache.kafka.clients.consumer.RangeAssignor",
        }
    )
    assert settings == {
        "fetch.wait.max.ms": "100",
        "socket.receive.buffer.bytes": "65536",
        "max.partition.fetch.bytes": "1048576",
    }


def test_tasks_are_cut_as_sparks_kafka_source_cuts_them() -> None:
    small = BatchPlan({("t", 0): (10, 110)}, {})
    assert [(t.start, t.until) for t in task_ranges(small, 2)] == [(10, 60), (60, 110)]
    large = BatchPlan({("t", p): (0, 400_000) for p in range(3)}, {})
    pieces = task_ranges(large, 2)
    # 1.2M records on 2 cores: at most a quarter of the batch per task, so each partition in two.
    assert [(t.partition, t.start, t.until) for t in pieces] == [
        (p, start, start + 200_000) for p in range(3) for start in (0, 200_000)
    ]
    assert [t.index for t in pieces] == list(range(6))


def _framed(schema: dict, record: dict, schema_id: int = 7) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
    return struct.pack(">bI", 0, schema_id) + body.getvalue()


def test_a_block_with_poison_decodes_the_good_records_and_names_the_bad() -> None:
    schema = SHAPE.value_schema()
    rows = [
        {"ID1": n, "ID2": "A", "C1": f"v{n}", "C2": n, "C6": None, "C5": None, "C4": None,
         "C3": None, "CREATE_TIME": 1, "UPDATE_TIME": 2}
        for n in range(4)
    ]  # fmt: skip
    at = BinlogPosition(ts_ms=1, file="f", pos=4, gtid="g")
    datums = [_framed(schema, envelope(SHAPE, "c", None, row, at, 5)) for row in rows]
    datums[1] = datums[1][:30]  # cut off: no such datum
    datums[2] = datums[2] + b"\x00\x01"  # trailing bytes: Spark's from_avro ignores them too
    decoder = SchemaDecoder.of(json.dumps(schema), resolve_named_types(schema))

    decoded, failed = decoder.decode(pa.array(datums, pa.binary()))

    assert failed == {1: "undecodable-avro"}
    after = decoded.column("after").to_pylist()
    assert [row["ID1"] for row in after] == [0, 2, 3]
    assert decoded.column("source").to_pylist()[0]["snapshot"] == "false"
    whole, none_failed = decoder.decode(pa.array(datums, pa.binary()).take([0, 3]))
    assert none_failed == {} and whole.num_rows == 2


def test_trailing_bytes_that_still_decode_do_not_shift_the_records_after_them() -> None:
    # polars reads a block's datums back to back: one datum with a trailing zero byte made it
    # read the next records from the wrong place, without an error. Each must read as alone.
    schema = {
        "type": "record",
        "name": "r",
        "fields": [
            {"name": "a", "type": ["null", "long"]},
            {"name": "b", "type": ["null", "long"]},
            {"name": "s", "type": "string"},
        ],
    }
    records = [
        {"a": 1, "b": 2, "s": "x"},
        {"a": 3, "b": None, "s": "yy"},
        {"a": None, "b": 5, "s": "z"},
        {"a": 7, "b": 8, "s": "w"},
    ]
    datums = [_framed(schema, record) for record in records]
    datums[1] = datums[1] + b"\x00"  # read in one block: a=None, b=None, s='\n', then a=61...
    decoder = SchemaDecoder.of(json.dumps(schema), resolve_named_types(schema))

    decoded, failed = decoder.decode(pa.array(datums, pa.binary()))

    assert failed == {}
    assert decoded.to_pylist() == records


def test_the_before_image_of_deletes_is_read_and_the_columns_keep_their_shape() -> None:
    # `before` is decoded only where `after` is null (deletes): updates' copies are skipped.
    schema = SHAPE.value_schema()
    at = BinlogPosition(ts_ms=1, file="f", pos=4, gtid="g")
    changes = [
        envelope(SHAPE, "u", _row(0), _row(1), at, 5),
        envelope(SHAPE, "d", _row(2), None, at, 5),
        envelope(SHAPE, "c", None, _row(3), at, 5),
        envelope(SHAPE, "d", _row(4), None, at, 5),
    ]
    datums = pa.array([_framed(schema, change) for change in changes], pa.binary())
    decoder = SchemaDecoder.of(json.dumps(schema), resolve_named_types(schema))

    decoded, failed = decoder.decode(datums)
    without_deletes, _ = decoder.decode(datums.take([0, 2]))

    assert failed == {}
    assert decoded.column_names == [field["name"] for field in schema["fields"]]
    assert [image and image["ID1"] for image in decoded.column("before").to_pylist()] == [
        None,
        2,
        None,
        4,
    ]
    assert decoded.column("after").to_pylist() == [c["after"] for c in changes]
    assert decoded.schema == without_deletes.schema


def _row(n: int) -> dict:
    return {"ID1": n, "ID2": "A", "C1": f"v{n}", "C2": n, "C6": None, "C5": None, "C4": None,
            "C3": None, "CREATE_TIME": 1, "UPDATE_TIME": 2}  # fmt: skip


def test_a_slice_of_the_records_decodes_exactly_its_records() -> None:
    # A version's datums arrive as a slice or a `take` of the task's values: the block is cut
    # from the array's own offsets, frames removed, whatever the array's start.
    schema = {"type": "record", "name": "r", "fields": [{"name": "s", "type": "string"}]}
    records = [{"s": "a" * n} for n in (0, 3, 1, 200, 2)]
    values = pa.array([_framed(schema, record) for record in records], pa.binary())
    decoder = SchemaDecoder.of(json.dumps(schema), resolve_named_types(schema))

    decoded, failed = decoder.decode(values.slice(1, 3))

    assert failed == {}
    assert decoded.to_pylist() == records[1:4]
    empty_bodies = pa.array([_framed(schema, {"s": ""})] * 2, pa.binary())
    assert decoder.decode(empty_bodies)[0].to_pylist() == [{"s": ""}, {"s": ""}]


@pytest.mark.parametrize(
    ("semantic", "carrier", "expected", "failed"),
    [
        ("io.debezium.time.MicroTime", pa.array([-3_020_399_000_000, 1, None]),
         ["-838:59:59", "00:00:00.000001", None], None),
        ("io.debezium.time.NanoTimestamp", pa.array([-1, 1_500], pa.int64()),
         [pa.scalar(-1, pa.timestamp("us")).as_py(), pa.scalar(1, pa.timestamp("us")).as_py()],
         None),
        ("io.debezium.data.VariableScaleDecimal",
         pa.array([{"scale": 3, "value": (-1234567).to_bytes(4, "big", signed=True)},
                   {"scale": -2, "value": b"\x05"},
                   {"scale": 0, "value": (10**40).to_bytes(17, "big", signed=True)}]),
         ["-1234.567", "5", None], [False, False, True]),
        (WIDE_DECIMAL + "2", pa.array([b"\xff", None], pa.binary()), ["-0.01", None],
         [False, False]),
        ("io.debezium.time.ZonedTimestamp", pa.array(["1970-01-01T00:00:00Z", "infinity"]),
         [pa.scalar(0, pa.timestamp("us", tz="UTC")).as_py(), None], [False, True]),
    ],
)  # fmt: skip
def test_conversions_give_what_spark_sql_gives(
    semantic: str, carrier: pa.Array, expected: list, failed: list | None
) -> None:
    values, not_converted = converted(carrier, semantic)
    assert values.to_pylist() == expected
    assert (not_converted.to_pylist() if not_converted is not None else None) == failed

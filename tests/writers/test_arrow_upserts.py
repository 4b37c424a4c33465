"""The arrow engine's upsert steps as plain functions (issue 15, item 6): the last change per key
in Kafka order, the hard and soft delete split, a key split across tasks or across the ranges of
one task, whole partitions grouped into at most one task per core, and a delete without a
`before` image keyed by its record key."""

from __future__ import annotations

import io
import json
import struct

import fastavro
import pyarrow as pa

from icekeeper.common.config.model import TableSpec
from icekeeper.common.schema import resolve_named_types
from icekeeper.writers.arrow_engine.arrow_flatten import VersionPlan
from icekeeper.writers.arrow_engine.arrow_record_keys import key_readers, with_record_keys
from icekeeper.writers.arrow_engine.arrow_upserts import (
    key_hashes,
    last_change_per_key,
    last_changes,
    per_partition,
    shared_key_count,
    whole_partitions,
)
from icekeeper.writers.arrow_engine.task_ranges import TaskGroup, TaskRange
from icekeeper.writers.key_columns import UpsertRule, record_keys_for
from icekeeper.writers.registry import RegisteredSchema
from tests.writers.test_upsert_record_keys import ORDERS

KEYS = ("id", "region")


def _changes(*changes: tuple[int, str, str, int]) -> pa.Table:
    """(id, region, op, amount) in Kafka offset order."""
    ids, regions, ops, amounts = zip(*changes, strict=True)
    return pa.table(
        {
            "id": pa.array(ids, pa.int32()),
            "region": list(regions),
            "_src_op": list(ops),
            "amount": pa.array(amounts, pa.int64()),
        }
    )


def _rows(table: pa.Table) -> list[tuple]:
    return [tuple(row.values()) for row in table.to_pylist()]


def test_the_last_change_of_each_key_wins_in_kafka_order() -> None:
    changes = _changes(
        (1, "eu", "c", 10),
        (2, "eu", "c", 20),
        (1, "us", "c", 100),  # same id, another region: another key
        (1, "eu", "u", 11),
        (2, "eu", "d", 20),
        (3, "eu", "c", 30),
        (1, "eu", "u", 12),
        (2, "eu", "c", 21),  # deleted, then created again
    )
    assert _rows(last_change_per_key(changes, KEYS)) == [
        (1, "us", "c", 100),
        (3, "eu", "c", 30),
        (1, "eu", "u", 12),
        (2, "eu", "c", 21),
    ]


def test_hard_deletes_go_to_deleted_keys_and_soft_deletes_keep_their_row() -> None:
    changes = _changes(
        (1, "eu", "c", 10),
        (2, "eu", "c", 20),
        (1, "eu", "d", 10),
        (3, "eu", "u", 30),
        (4, "eu", "d", 40),  # a key of an earlier batch
        (5, "eu", "c", 50),  # a change of primary key 5 -> 6: delete + create
        (5, "eu", "d", 50),
        (6, "eu", "c", 50),
    )
    hard = last_changes(changes, UpsertRule(KEYS, "_src_op"))
    assert _rows(hard.live) == [(2, "eu", "c", 20), (3, "eu", "u", 30), (6, "eu", "c", 50)]
    assert _rows(hard.deleted) == [(1, "eu", "d", 10), (4, "eu", "d", 40), (5, "eu", "d", 50)]
    soft = last_changes(changes, UpsertRule(KEYS, None))
    assert [row[:3] for row in _rows(soft.live)] == [
        (2, "eu", "c"),
        (1, "eu", "d"),
        (3, "eu", "u"),
        (4, "eu", "d"),
        (5, "eu", "d"),
        (6, "eu", "c"),
    ]
    assert soft.deleted.num_rows == 0


def test_a_key_in_two_tasks_is_found_and_a_partitions_pieces_become_one_task() -> None:
    first = last_change_per_key(_changes((1, "eu", "c", 10), (2, "eu", "c", 20)), KEYS)
    second = last_change_per_key(_changes((3, "eu", "c", 30), (1, "us", "u", 11)), KEYS)
    third = last_change_per_key(_changes((2, "eu", "u", 21), (1, "eu", "d", 10)), KEYS)
    hashes = [key_hashes(rows, KEYS) for rows in (first, second, third)]
    assert shared_key_count(hashes[:2]) == 0  # (1, eu) and (1, us) are different keys
    assert shared_key_count(hashes) == 2  # (1, eu) and (2, eu) in the first and the third
    assert shared_key_count([hashes[0], key_hashes(first.slice(0, 0), KEYS)]) == 0

    cut = [
        TaskRange(0, "t", 0, 0, 50),
        TaskRange(1, "t", 0, 50, 100),
        TaskRange(2, "t", 1, 0, 70),
        TaskRange(3, "u", 0, 5, 9),
    ]
    assert per_partition(cut) == [
        TaskRange(0, "t", 0, 0, 100),
        TaskRange(1, "t", 1, 0, 70),
        TaskRange(2, "u", 0, 5, 9),
    ]


def test_a_key_in_two_ranges_of_one_task_is_counted() -> None:
    changes = _changes(
        (1, "eu", "c", 10),  # range 0
        (2, "eu", "c", 20),
        (1, "eu", "u", 11),
        (1, "us", "c", 100),  # range 1: (1, us) is another key
        (3, "eu", "c", 30),
        (2, "eu", "u", 21),  # (2, eu) again: in ranges 0 and 1
        (4, "eu", "c", 40),  # range 2
        (3, "eu", "d", 30),  # (3, eu) again: in ranges 1 and 2
    )
    ranges = pa.array([0, 0, 0, 1, 1, 1, 2, 2], pa.int32())
    plan = UpsertRule(KEYS, "_src_op")
    assert last_changes(changes, plan, ranges).keys_in_two_ranges == 2
    apart = last_changes(changes.slice(0, 5), plan, ranges.slice(0, 5))
    assert apart.keys_in_two_ranges == 0
    assert _rows(apart.live) == _rows(last_changes(changes.slice(0, 5), plan).live)
    assert last_changes(changes, plan).keys_in_two_ranges == 0  # one range: no question


def test_an_upsert_batch_runs_whole_partitions_in_at_most_one_task_per_core() -> None:
    cut = [  # as `task_ranges` cuts a batch: (t, 0) in two pieces
        TaskRange(0, "t", 0, 0, 50_000),
        TaskRange(1, "t", 0, 50_000, 100_000),
        TaskRange(2, "t", 1, 0, 60_000),
        TaskRange(3, "t", 2, 10, 70_010),
        TaskRange(4, "t", 3, 0, 30_000),
        TaskRange(5, "u", 0, 5, 45_005),
    ]
    groups = whole_partitions(cut, 2)
    # Largest first into the least loaded: t0 (100k) -> 0, t2 (70k) -> 1, t1 (60k) -> 1,
    # u0 (45k) -> 0, t3 (30k) -> 1 (130k against 145k); each task's ranges in partition order.
    assert groups == [
        TaskGroup(0, (TaskRange(0, "t", 0, 0, 100_000), TaskRange(0, "u", 0, 5, 45_005))),
        TaskGroup(
            1,
            (
                TaskRange(1, "t", 1, 0, 60_000),
                TaskRange(1, "t", 2, 10, 70_010),
                TaskRange(1, "t", 3, 0, 30_000),
            ),
        ),
    ]
    assert [group.records for group in groups] == [145_000, 160_000]
    assert whole_partitions(list(reversed(cut)), 2) == groups  # the order given does not matter
    for parallelism in (1, 2, 3, 4, 5, 8):
        grouped = whole_partitions(cut, parallelism)
        assert len(grouped) == min(parallelism, 5)
        ranges = [(r.topic, r.partition, r.start, r.until) for g in grouped for r in g.ranges]
        assert sorted(ranges) == sorted(
            (r.topic, r.partition, r.start, r.until) for r in per_partition(cut)
        )
        loads = [group.records for group in grouped]
        assert max(loads) - min(loads) <= 100_000  # never more than the largest partition
    assert [len(group.ranges) for group in whole_partitions(cut, 8)] == [1] * 5
    even = [TaskRange(index, "t", index, 0, 50_000) for index in range(4)]
    assert [group.records for group in whole_partitions(even, 2)] == [100_000, 100_000]
    assert whole_partitions([], 2) == []


def test_a_delete_without_before_reads_its_key_columns_from_the_record_key() -> None:
    value = ORDERS.value_schema()
    key_schema = _registered(ORDERS.key_schema(), 41)
    [version] = [VersionPlan(0, 7, json.dumps(value), resolve_named_types(value), True, {}, (), ())]
    keys = record_keys_for([TableSpec(identifier="shop.orders", primary_key=["id", "region"])])
    readers = key_readers([version], keys, [key_schema])[0]
    before_type = pa.struct(
        [
            ("id", pa.int32()),
            ("region", pa.string()),
            ("amount", pa.int64()),
            ("status", pa.string()),
        ]
    )
    kept = {"id": 1, "region": "eu", "amount": 10, "status": "new"}
    decoded = pa.table(
        {
            "op": ["d", "d", "c", "d", "d"],
            "before": pa.array([None, kept, None, None, None], before_type),
        }
    )
    record_keys = pa.array(
        [
            _framed(41, ORDERS.key_schema(), {"region": "us", "id": 7}),
            _framed(41, ORDERS.key_schema(), {"region": "eu", "id": 1}),
            _framed(41, ORDERS.key_schema(), {"region": "eu", "id": 2}),
            None,  # no key: stays a delete without key (`delete-without-key`)
            _framed(99, ORDERS.key_schema(), {"region": "us", "id": 8}),  # schema not learnt
        ],
        pa.binary(),
    )
    patched = with_record_keys(decoded, record_keys, readers)
    assert patched.column("before").to_pylist() == [
        {"id": 7, "region": "us", "amount": None, "status": None},
        kept,
        None,
        None,
        None,
    ]
    assert patched.column("op").to_pylist() == decoded.column("op").to_pylist()


def _registered(schema: dict, schema_id: int) -> RegisteredSchema:
    return RegisteredSchema(schema_id, json.dumps(schema), resolve_named_types(schema))


def _framed(schema_id: int, schema: dict, datum: dict) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), datum)
    return struct.pack(">bI", 0, schema_id) + body.getvalue()

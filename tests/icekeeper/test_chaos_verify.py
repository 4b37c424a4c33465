"""The chaos checker sees each fault it exists for, on a seven-record topic, without services:
a row committed twice, a row whose payload is not its Kafka record's, a record dead-lettered
twice, a lost record, poison in the table, and engines that read different rows."""

from __future__ import annotations

from collections import Counter
from typing import Any

from icekeeper.chaos_verify import (
    CHANGELOG_PAYLOAD,
    Position,
    changelog_report,
    dead_letter_report,
    engines_disagreeing,
    expected_payloads,
    failures,
    missing_ranges,
    positioned_digests,
    upsert_columns,
    waiting_for_gone,
)
from tests.support.moniker_values import sample_moniker

# Partition 0 has offsets 0-3, partition 1 offsets 0-2; (0, 2) and (1, 1) do not decode.
TOPIC_POSITIONS: set[Position] = {(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2)}
UNDECODABLE: set[Position] = {(0, 2), (1, 1)}
CHANGES = [
    {
        "id": 1,
        "customer": "c-1",
        "amount": 10,
        "price": 1.5,
        "status": "new",
        "_src_op": "c",
        "_kfk_partition": 0,
        "_kfk_offset": 0,
    },
    {
        "id": 1,
        "customer": "c-1",
        "amount": 11,
        "price": 1.5,
        "status": "paid",
        "_src_op": "u",
        "_kfk_partition": 0,
        "_kfk_offset": 1,
    },
    {
        "id": 1,
        "customer": "c-1",
        "amount": 11,
        "price": 1.5,
        "status": "paid",
        "extra_1": "x",
        "_src_op": "d",
        "_kfk_partition": 0,
        "_kfk_offset": 3,
    },
    {
        "id": 2,
        "customer": "c-2",
        "amount": 20,
        "price": 2.25,
        "status": "new",
        "_src_op": "c",
        "_kfk_partition": 1,
        "_kfk_offset": 0,
    },
    {
        "id": 2,
        "customer": "c-2",
        "amount": 21,
        "price": 2.25,
        "status": "shipped",
        "_src_op": "u",
        "_kfk_partition": 1,
        "_kfk_offset": 2,
    },
]


def table_row(change: dict[str, Any], **changed: Any) -> tuple[Any, ...]:
    """A changelog row as an engine reads it: (partition,
    offset, *payload), with `changed` values."""
    values = {**change, **changed}
    return (
        values["_kfk_partition"],
        values["_kfk_offset"],
        *(values.get(name) for name in CHANGELOG_PAYLOAD),
    )


def run_report(
    table: list[tuple[Any, ...]],
    dead_letters: Counter[Position],
    duckdb: list[tuple[Any, ...]] | None = None,
) -> dict[str, Any]:
    """The flat report of a run whose table pyiceberg and Spark read as `table`, DuckDB as `duckdb`
    (default: the same), with these dead letters, 2 poison records produced."""
    reads = {
        "pyiceberg": positioned_digests(table),
        "duckdb": positioned_digests(table if duckdb is None else duckdb),
        "spark": positioned_digests(table),
    }
    return {
        "records_in": len(TOPIC_POSITIONS),
        "poison_expected": len(UNDECODABLE),
        "undecodable": len(UNDECODABLE),
        **dead_letter_report(dead_letters, UNDECODABLE),
        **changelog_report(
            reads, expected_payloads(CHANGES), UNDECODABLE, TOPIC_POSITIONS, dead_letters
        ),
    }


CLEAN_TABLE = [table_row(change) for change in CHANGES]
CLEAN_DEAD_LETTERS = Counter(UNDECODABLE)


def test_a_run_with_every_record_once_passes() -> None:
    report = run_report(CLEAN_TABLE, CLEAN_DEAD_LETTERS)
    assert failures(report) == []
    assert (
        report["rows"],
        report["dead_lettered"],
        report["duplicates"],
        report["payload_mismatched"],
    ) == (5, 2, 0, 0)


def test_a_row_committed_twice_is_a_duplicate() -> None:
    report = run_report([*CLEAN_TABLE, table_row(CHANGES[1])], CLEAN_DEAD_LETTERS)
    assert report["duplicates"] == 1 and report["changelog_by_engine"]["pyiceberg"]["examples"] == (
        "(0, 1): 2 rows",
    )
    assert failures(report) == ["changelog: 1 duplicates ((0, 1): 2 rows)"]


def test_a_row_whose_payload_is_not_its_records_is_reported() -> None:
    """The right count at the right positions, but one
    value altered (or another record's values)."""
    altered = [*CLEAN_TABLE[:4], table_row(CHANGES[4], amount=22)]
    report = run_report(altered, CLEAN_DEAD_LETTERS)
    assert (
        report["rows"],
        report["duplicates"],
        report["missing"],
        report["payload_mismatched"],
    ) == (5, 0, 0, 1)
    assert any(
        "1 payload_mismatched" in failure and "(1, 2): payload unlike the Kafka record" in failure
        for failure in failures(report)
    )
    # A schema-change column lost (the delete's `extra_1`) is a payload difference too.
    report = run_report(
        [*CLEAN_TABLE[:2], table_row(CHANGES[2], extra_1=None), *CLEAN_TABLE[3:]],
        CLEAN_DEAD_LETTERS,
    )
    assert report["payload_mismatched"] == 1


def test_a_record_dead_lettered_twice_is_reported() -> None:
    report = run_report(CLEAN_TABLE, CLEAN_DEAD_LETTERS + Counter([(0, 2)]))
    assert (
        report["dead_lettered"],
        report["dead_letter_positions"],
        report["dead_letter_duplicates"],
    ) == (3, 2, 1)
    assert failures(report) == [
        "dead letters: 1 repeated, 0 poison records without one, 0 for records that decode ((0, "
        "2): dead-lettered 2 times)"
    ]
    # Dead letters go at least once: one writer killed between a batch's dead letters and its
    # moniker explains one repeat of each of that batch's records, not two.
    assert failures({**report, "killed": {"writer-1": 1, "bookkeeper": 2}}) == []
    thrice = run_report(CLEAN_TABLE, CLEAN_DEAD_LETTERS + Counter([(0, 2), (0, 2)]))
    assert len(failures({**thrice, "killed": {"writer-1": 1}})) == 1
    # The writers a reassignment kills (chaos_reassign.py) explain repeats as well.
    assert failures({**thrice, "killed": {"writer-1": 1}, "event_writer_kills": 2}) == []


def test_a_run_that_did_not_settle_names_the_monikers_still_pending() -> None:
    """A chain waiting for a predecessor that is gone shows in the failure, not only the timeout."""
    stuck = {
        **run_report(CLEAN_TABLE, CLEAN_DEAD_LETTERS),
        "settled": False,
        "pending_at_end": 7,
        "pending_at_end_examples": ["chaos.orders w1 seq 9 (prev_seq 8): [0] 120..160"],
    }
    assert failures(stuck) == [
        "the tables did not take in every record before the timeout; 7 monikers still pending "
        "(chaos.orders w1 seq 9 (prev_seq 8): [0] 120..160)"
    ]


def test_a_writers_chain_waiting_for_a_moniker_that_is_gone_is_reported() -> None:
    """The pre-fix Azure queue run of issue 26 item 1: w1 committed seq 4, the journal copy of
    seq 5 was deleted with a duplicate's acknowledgement, seqs 6 and 7 wait for it forever."""
    pending = [
        sample_moniker(seq=6, prev_seq=5, table="chaos.orders"),
        sample_moniker(seq=7, prev_seq=6, table="chaos.orders", until=170),
        sample_moniker(seq=3, prev_seq=2, writer="w2", table="chaos.orders"),
    ]
    chains = waiting_for_gone(pending, {"chaos.orders": {"w1": 4, "w2": 2}})
    assert chains == [
        "chaos.orders: w1 seq 6 waits for seq 5, which is neither committed (w1's last committed "
        "seq: 4) nor pending"
    ]
    # A chain whose predecessor is committed, or pending, waits for nothing that is gone.
    assert waiting_for_gone(pending, {"chaos.orders": {"w1": 5, "w2": 2}}) == []
    report = {**run_report(CLEAN_TABLE, CLEAN_DEAD_LETTERS), "chains_waiting_for_gone": chains}
    assert failures(report) == [f"a moniker is gone: {chains[0]}"]


def test_the_upsert_table_is_read_with_the_columns_it_has() -> None:
    """A run that stalls before the schema change adding `extra_1` is committed is compared with
    the reference (a mismatch wherever the reference has a value there), not a crash of the read."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    class Table:
        def schema(self) -> Schema:
            return Schema(
                NestedField(1, "id", LongType(), required=True),
                NestedField(2, "_kfk_offset", LongType(), required=False),
            )

    assert upsert_columns(Table()) == ["id", "_kfk_offset"]


def test_missing_records_are_summed_up_as_ranges_across_their_dead_letters() -> None:
    """A lost moniker's records show as one range per partition, its poison inside it."""
    missing = [(0, 5), (0, 6), (0, 8), (0, 9), (0, 20), (2, 0)]
    assert missing_ranges(missing, dead_lettered={(0, 7)}) == (
        "[0] 5..10 (4 missing)",
        "[0] 20..21 (1 missing)",
        "[2] 0..1 (1 missing)",
    )
    assert missing_ranges(missing, dead_lettered=set(), most=1) == ("[0] 5..7 (2 missing)",)
    lost = run_report(CLEAN_TABLE[1:], CLEAN_DEAD_LETTERS)
    assert lost["missing_ranges"] == ["[0] 0..1 (1 missing)"]
    assert any("; missing: [0] 0..1 (1 missing)" in failure for failure in failures(lost))


def test_lost_records_poison_in_the_table_and_good_records_dead_lettered_are_reported() -> None:
    lost = run_report(CLEAN_TABLE[1:], CLEAN_DEAD_LETTERS)
    assert lost["missing"] == 1 and any(
        "1 missing ((0, 0): missing" in failure for failure in failures(lost)
    )
    poison_kept = run_report(
        [*CLEAN_TABLE, (1, 1, *([None] * len(CHANGELOG_PAYLOAD)))], Counter({(0, 2): 1})
    )
    assert (poison_kept["poison_in_table"], poison_kept["poison_not_dead_lettered"]) == (1, 1)
    good_dead = run_report(CLEAN_TABLE[1:], CLEAN_DEAD_LETTERS + Counter([(0, 0)]))
    assert (good_dead["missing"], good_dead["good_dead_lettered"]) == (0, 1)
    assert any("1 for records that decode" in failure for failure in failures(good_dead))


def test_engines_that_read_different_rows_are_reported_even_with_equal_counts() -> None:
    """DuckDB reads one row at another position with the same count: counts alone would pass."""
    moved = [*CLEAN_TABLE[:4], (1, 2, *table_row(CHANGES[3])[2:])]
    report = run_report(CLEAN_TABLE, CLEAN_DEAD_LETTERS, duckdb=moved)
    assert report["rows"] == report["duckdb_rows"] == report["spark_rows"] == 5
    assert report["engines_disagreeing"] == 2 and report["payload_mismatched"] == 1
    assert (
        "changelog: 2 rows (position and payload) not alike in pyiceberg, DuckDB and Spark"
        in failures(report)
    )
    assert (
        engines_disagreeing(
            {
                "a": positioned_digests(CLEAN_TABLE),
                "b": positioned_digests(list(reversed(CLEAN_TABLE))),
            }
        )
        == 0
    )


def test_a_reassignment_that_did_not_happen_or_refused_nothing_fails_the_run() -> None:
    """The reassignment event is what makes a run check items 1 and 2 of issue 26: a run whose
    event timed out at a step, or never led to a refusal, must not pass as if it had."""
    happened = {"backlog_reached": True, "new_writers_published": True, "reaching_past": True}
    report = run_report(CLEAN_TABLE, CLEAN_DEAD_LETTERS)
    assert failures({**report, "reassignments": [happened], "refusals_logged": 2}) == []
    skipped = {**happened, "reaching_past": False}
    assert failures({**report, "reassignments": [happened, skipped], "refusals_logged": 1}) == [
        "reassignment 2 did not happen as planned: reaching_past"
    ]
    [unchecked] = failures({**report, "reassignments": [happened], "refusals_logged": 0})
    assert "no bookkeeper refused a moniker" in unchecked

"""A batch's counts add up before it is published (issue 26, item 4): the rule as a plain
function over counts (`writers/reconciliation.py`), with fan-out, tables' own starts, upsert
tables, skipped and dead-lettered tombstones."""

from __future__ import annotations

from icekeeper.writers.reconciliation import BatchIntake, TableIntake, discrepancies, ledger

# 20 records: 12 of route shop.orders (fed to shop.orders and its audit table, which starts 4
# records later), 3 of route shop.items, 5 failed (2 skipped tombstones, 3 dead letters).
FED_BY = {"shop.orders": ("shop.orders", "shop.orders_audit"), "shop.items": ("shop.items",)}
RECONCILED = BatchIntake(
    records=20,
    failed=5,
    tombstones=2,
    accepted={"shop.orders": 12, "shop.items": 3},
    tables={
        # An upsert table: 12 records taken in, fewer rows written (one per key); the count is
        # of records.
        "shop.orders": TableIntake("shop.orders", taken=12),
        "shop.orders_audit": TableIntake("shop.orders", taken=8, before_start=4),
        "shop.items": TableIntake("shop.items", taken=3),
    },
    fed_by=FED_BY,
    failed_by_reason={"tombstone": 2, "undecodable-avro": 1, "invalid-utf8": 2},
)
LETTERS = {"undecodable-avro": 1, "invalid-utf8": 2}


def _with(**changes) -> BatchIntake:
    return BatchIntake(**{**RECONCILED.__dict__, **changes})


def test_a_batch_whose_records_all_land_once_reconciles_per_table() -> None:
    assert discrepancies(RECONCILED, LETTERS, skip_tombstones=True) == []
    counts = ledger(RECONCILED, LETTERS, skip_tombstones=True)
    for identifier, table in counts["tables"].items():
        others = sum(n for route, n in RECONCILED.accepted.items() if route != table["route"])
        # records read = taken + before its start + other routes' + dead letters + tombstones
        assert counts["records_read"] == (
            table["taken"]
            + table["before_start"]
            + others
            + sum(counts["dead_letters"].values())
            + counts["skipped_tombstones"]
        ), identifier


def test_tombstones_that_are_dead_lettered_must_be_in_the_dead_letters() -> None:
    assert discrepancies(RECONCILED, {**LETTERS, "tombstone": 2}, skip_tombstones=False) == []
    assert discrepancies(RECONCILED, LETTERS, skip_tombstones=False) == [
        "2 records failed as tombstone while writing, but the dead-letter pass found 0"
    ]


def test_a_record_the_writing_pass_failed_but_the_dead_letter_pass_accepts_is_caught() -> None:
    # The arrow task rejected an invalid-UTF-8 datum that Spark's `from_avro` decodes: neither
    # written nor dead-lettered.
    assert discrepancies(RECONCILED, {"undecodable-avro": 1}, skip_tombstones=True) == [
        "2 records failed as invalid-utf8 while writing, but the dead-letter pass found 0"
    ]


def test_reasons_that_swap_between_the_passes_are_caught_though_the_totals_agree() -> None:
    # Each pass rejects a record the other accepts: one record lost, one written and sent.
    swapped = {"undecodable-avro": 2, "invalid-utf8": 1}
    assert discrepancies(RECONCILED, swapped, skip_tombstones=True) == [
        "2 records failed as invalid-utf8 while writing, but the dead-letter pass found 1",
        "1 records failed as undecodable-avro while writing, but the dead-letter pass found 2",
    ]


def test_without_reasons_the_totals_are_compared() -> None:
    totals_only = _with(failed_by_reason=None)
    assert discrepancies(totals_only, {"bad-magic-byte": 3}, skip_tombstones=True) == []
    assert discrepancies(totals_only, {"bad-magic-byte": 2}, skip_tombstones=True) == [
        "3 records failed while writing, but the dead-letter pass found 2 (skipped tombstones "
        "aside: 2)"
    ]


def test_records_of_a_route_no_table_was_written_for_are_caught() -> None:
    # `spark-sql` counts the routes it wrote tables for: a route it missed is short in the sum.
    missed = _with(accepted={"shop.orders": 12})
    assert discrepancies(missed, LETTERS, skip_tombstones=True) == [
        "20 records read, but 12 accepted by a route a table was written for and 5 failed: "
        "3 records in neither",
        "table shop.items took 3 records of route shop.items, which accepted none",
    ]
    unwritten = _with(tables={k: v for k, v in RECONCILED.tables.items() if k != "shop.items"})
    assert discrepancies(unwritten, LETTERS, skip_tombstones=True) == [
        "3 records accepted for route shop.items, but table shop.items was not written"
    ]


def test_a_table_of_a_fan_out_that_took_fewer_records_is_caught() -> None:
    short = _with(
        tables={
            **RECONCILED.tables,
            "shop.orders_audit": TableIntake("shop.orders", taken=7, before_start=4),
        }
    )
    assert discrepancies(short, LETTERS, skip_tombstones=True) == [
        "table shop.orders_audit took 7 records and has 4 before its start, but route "
        "shop.orders accepted 12"
    ]
    # Records before a table's own start are its already: not counting them is a discrepancy too.
    uncounted = _with(
        tables={**RECONCILED.tables, "shop.orders_audit": TableIntake("shop.orders", taken=8)}
    )
    assert len(discrepancies(uncounted, LETTERS, skip_tombstones=True)) == 1


def test_records_classified_twice_or_not_at_all_are_caught() -> None:
    assert discrepancies(_with(records=21), LETTERS, skip_tombstones=True) == [
        "21 records read, but 15 accepted by a route a table was written for and 5 failed: "
        "1 records in neither"
    ]
    assert discrepancies(_with(records=19), LETTERS, skip_tombstones=True) == [
        "19 records read, but 15 accepted by a route a table was written for and 5 failed: "
        "1 counted twice"
    ]


def test_an_empty_batch_and_a_batch_of_poison_reconcile() -> None:
    assert discrepancies(BatchIntake(0, 0, 0), {}, skip_tombstones=True) == []
    poison = BatchIntake(3, 3, 1, failed_by_reason={"tombstone": 1, "bad-magic-byte": 2})
    assert discrepancies(poison, {"bad-magic-byte": 2}, skip_tombstones=True) == []

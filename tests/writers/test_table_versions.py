"""Which versions feed which table, and the guess that spares the writer a pass (no services)."""

from __future__ import annotations

from icekeeper.common.config.model import TableSpec
from icekeeper.writers.routing import Routes
from icekeeper.writers.spark_sql_engine.sql_table_versions import prediction_held
from icekeeper.writers.table_versions import (
    only_pair,
    predicted_route_versions,
    schema_ids_of,
    versions_by_table,
)
from icekeeper.writers.version_shapes import VersionShape

V = [
    VersionShape(f"_ik_v{i}", True, [], schema_id=schema_id)
    for i, schema_id in enumerate((40, 41, 50))
]


def test_each_table_gets_only_the_versions_of_its_own_records_oldest_first() -> None:
    chosen = versions_by_table([("shop.orders", 1), ("shop.customers", 2), ("shop.orders", 0)], V)
    assert {table: [v.schema_id for v in versions] for table, versions in chosen.items()} == {
        "shop.customers": [50],
        "shop.orders": [40, 41],
    }


def test_the_last_batch_predicts_the_next_by_schema_id_not_by_position() -> None:
    last = schema_ids_of([("shop.orders", 1), ("shop.customers", 2)], V)
    reordered = [V[2], V[0], V[1]]  # the next batch lists its versions in another order
    assert predicted_route_versions(last, reordered) == [("shop.customers", 0), ("shop.orders", 2)]


def test_no_prediction_without_a_last_batch_ids_or_a_schema_that_is_gone() -> None:
    assert predicted_route_versions(None, V) is None
    assert predicted_route_versions({("shop.orders", 99)}, V) is None
    assert (
        predicted_route_versions({("web.clicks", None)}, [VersionShape("_ik_v0", False, [])])
        is None
    )  # type: ignore[arg-type]


def test_the_guess_holds_only_when_every_pair_has_records_and_they_are_all_the_records() -> None:
    predicted = [("shop.orders", 0), ("shop.customers", 1)]
    assert prediction_held(predicted, {"_ik_pair_0": 10, "_ik_pair_1": 5, "_ik_routed": 15})
    assert not prediction_held(
        predicted, {"_ik_pair_0": 10, "_ik_pair_1": 0, "_ik_routed": 10}
    )  # a version it no longer has
    assert not prediction_held(
        predicted, {"_ik_pair_0": 10, "_ik_pair_1": 5, "_ik_routed": 16}
    )  # a new table or version


def test_a_first_batch_guesses_its_pair_only_with_one_version_and_one_route() -> None:
    def table(identifier: str, topics: list[str]) -> TableSpec:
        return TableSpec(identifier=identifier, topics=topics)

    one = Routes([table("shop.orders", ["t.orders"])], None)
    assert only_pair(one, V[:1]) == [("shop.orders", 0)]
    assert only_pair(one, V[:2]) is None  # two versions: which table gets which is not known
    fan_out = Routes(
        [table("shop.orders", ["t.orders"]), table("audit.orders", ["t.orders"])], None
    )
    assert only_pair(fan_out, V[:1]) == [("shop.orders", 0)]  # followers share the route
    two = Routes([table("shop.orders", ["t.orders"]), table("shop.items", ["t.items"])], None)
    assert only_pair(two, V[:1]) is None
    assert (
        only_pair(Routes([table("shop.orders", ["t.orders"])], "cdc.{db}_{table}"), V[:1]) is None
    )

"""Which schema versions feed which table (`writers/table_versions.py`), counted in Spark SQL.

Without a guess, one small aggregate over route and version counts the batch's (table, version)
pairs (`route_versions`); with one, the first table's write also counts the guessed pairs and
all routed records (`prediction_checks`), and the guess held when they agree
(`prediction_held`).
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from icekeeper.writers.spark_sql_engine import sql
from icekeeper.writers.spark_sql_engine.columns import ROUTE, VERSION


def route_versions(routed: DataFrame) -> list[tuple[str, int]]:
    """The batch's distinct (table, schema version) pairs: which tables it feeds, and with what.

    Records that fail to decode count with the version their frame names: harmless (the
    version's columns come out null) and it keeps this pass from decoding anything when
    routing is by topic, since the route and the version then depend on the topic and the
    frame's first five bytes alone.
    """
    pairs = (
        routed.where(f"{ROUTE} IS NOT NULL AND {VERSION} IS NOT NULL")
        .groupBy(ROUTE, VERSION)
        .count()
        .collect()
    )
    return [(row[ROUTE], int(row[VERSION])) for row in pairs]


def prediction_checks(predicted: list[tuple[str, int]]) -> dict[str, str]:
    """Counts to observe while writing: each predicted pair's records, and all routed records.

    The guess held when every pair has records and together they are all the routed records:
    then no table got a version it has no records of, and no records went unwritten.
    """
    checks = {
        f"_ik_pair_{n}": f"count_if({ROUTE} = {sql.string(table)} AND {VERSION} = {index})"
        for n, (table, index) in enumerate(predicted)
    }
    checks["_ik_routed"] = f"count_if({ROUTE} IS NOT NULL AND {VERSION} IS NOT NULL)"
    return checks


def prediction_held(predicted: list[tuple[str, int]], observed: dict) -> bool:
    counts = [int(observed.get(f"_ik_pair_{n}") or 0) for n in range(len(predicted))]
    return all(counts) and sum(counts) == int(observed.get("_ik_routed") or 0)

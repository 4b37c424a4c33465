"""Which schema versions feed which table in a batch: a table's schema is its own records' schema.

A batch may mix topics, tables and schema versions. Flattening every table with the union of all
the batch's versions leaked columns from one table into another, failed the whole batch on a
column name two tables use with different types (`qty` INT beside `qty` VARCHAR), let an ALTER on
one table evolve the other, and kept a dropped column alive for as long as its old version stayed
registered. So the writer first learns which versions' records each table actually gets in this
batch (one small aggregate over route and version), and flattens each table with those alone.
"""

from __future__ import annotations

from collections.abc import Iterable

from icekeeper.writers import sql
from icekeeper.writers.decode import VersionShape
from icekeeper.writers.routing import Routes


def versions_by_table(
    route_versions: Iterable[tuple[str, int]], versions: list[VersionShape]
) -> dict[str, list[VersionShape]]:
    """Table identifier -> the versions (oldest registered first) whose records route to it.

    Args:
        route_versions: the distinct (table identifier, version index) pairs of the batch's records.
        versions: the batch's decoded versions, indexed as `route_versions` names them.
    """
    indices: dict[str, set[int]] = {}
    for table, index in route_versions:
        indices.setdefault(table, set()).add(index)
    return {
        table: [versions[index] for index in sorted(chosen)]
        for table, chosen in sorted(indices.items())
    }


def predicted_route_versions(
    last_batch: set[tuple[str, int]] | None, versions: list[VersionShape]
) -> list[tuple[str, int]] | None:
    """The previous batch's (table, schema id) pairs as this batch's (table, version index) pairs.

    A steady stream keeps its tables and schema versions from batch to batch, so the writer can
    skip the aggregate pass and check the guess while writing instead (`prediction_checks`).
    None when there is nothing to go on, or a version has no registry id (JSON), or a schema of
    the last batch is not among this batch's versions.
    """
    if not last_batch or any(version.schema_id is None for version in versions):
        return None
    index_of = {version.schema_id: index for index, version in enumerate(versions)}
    if any(schema_id not in index_of for _, schema_id in last_batch):
        return None
    return sorted((table, index_of[schema_id]) for table, schema_id in last_batch)


def only_pair(routes: Routes, versions: list[VersionShape]) -> list[tuple[str, int]] | None:
    """The guess when the batch has one schema version and records have one route to take.

    A writer's first batch has no batch before it to predict from; without this guess it would
    count (route, version) pairs in a pass of its own, reading and decoding the batch twice
    (measured: a fresh writer's 1M records in two batches took 12.7 s against 6.7 s for the bare
    pipeline). Like any prediction, it is checked while writing (`prediction_checks`).
    """
    route = routes.only_route()
    return [(route, 0)] if route is not None and len(versions) == 1 else None


def schema_ids_of(
    route_versions: Iterable[tuple[str, int]], versions: list[VersionShape]
) -> set[tuple[str, int]] | None:
    """(table, schema id) pairs to predict the next batch with; None when a version has no id."""
    pairs = {(table, versions[index].schema_id) for table, index in route_versions}
    return None if any(schema_id is None for _, schema_id in pairs) else pairs  # type: ignore[return-value]


def prediction_checks(predicted: list[tuple[str, int]], route: str, version: str) -> dict[str, str]:
    """Counts to observe while writing: each predicted pair's records, and all routed records.

    The guess held when every pair has records and together they are all the routed records:
    then no table got a version it has no records of, and no records went unwritten.
    """
    checks = {
        f"_ik_pair_{n}": f"count_if({route} = {sql.string(table)} AND {version} = {index})"
        for n, (table, index) in enumerate(predicted)
    }
    checks["_ik_routed"] = f"count_if({route} IS NOT NULL AND {version} IS NOT NULL)"
    return checks


def prediction_held(predicted: list[tuple[str, int]], observed: dict) -> bool:
    counts = [int(observed.get(f"_ik_pair_{n}") or 0) for n in range(len(predicted))]
    return all(counts) and sum(counts) == int(observed.get("_ik_routed") or 0)

"""Which schema versions feed which table in a batch: a table's schema is its own records' schema.

A batch may mix topics, tables and schema versions. Flattening every table with the union of
all the batch's versions leaked columns from one table into another, failed the whole batch on a
column name two tables use with different types (`qty` INT beside `qty` VARCHAR), let an ALTER
on one table evolve the other, and kept a dropped column alive for as long as its old version
stayed registered. So the writer first learns which versions' records each table actually gets
in this batch (one small aggregate over route and version), and flattens each table with those
alone.
"""

from __future__ import annotations

from typing import Iterable

from writers.decode import VersionShape


def versions_by_table(route_versions: Iterable[tuple[str, int]], versions: list[VersionShape]) -> dict[str, list[VersionShape]]:
    """Table identifier -> the versions (oldest registered first) whose records route to it.

    Args:
        route_versions: the distinct (table identifier, version index) pairs of the batch's records.
        versions: the batch's decoded versions, indexed as `route_versions` names them.
    """
    indices: dict[str, set[int]] = {}
    for table, index in route_versions:
        indices.setdefault(table, set()).add(index)
    return {table: [versions[index] for index in sorted(chosen)] for table, chosen in sorted(indices.items())}

"""Routing as Spark SQL: each record's route (`writers/routing.py`), and why a record cannot
become a row of its table.

A record claimed by no table, on a source without a template, is `unroutable`. The routed frame
also marks the other records that cannot become rows of their table (`missing-key`;
`delete-without-key` for a delete with neither a `before` image nor a record key that gives its
key columns; `unconvertible-value`).
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from icekeeper.common.config.model import TableSpec
from icekeeper.writers.routing import Routes, template_parts
from icekeeper.writers.spark_sql_engine import sql
from icekeeper.writers.spark_sql_engine.columns import (
    ERROR,
    KAFKA_OFFSET,
    KAFKA_PARTITION,
    KAFKA_TOPIC,
    ROUTE,
    SOURCE_DB,
    SOURCE_SERVER,
    SOURCE_TABLE,
)
from icekeeper.writers.spark_sql_engine.decoding import DecodedBatch
from icekeeper.writers.spark_sql_engine.sql_flatten import (
    helper_sql,
    row_value_is_null_sql,
    unconvertible_sql,
)
from icekeeper.writers.spark_sql_engine.sql_record_keys import delete_without_before_sql

_TEMPLATE_COLUMNS = {
    "topic": KAFKA_TOPIC,
    "server": SOURCE_SERVER,
    "db": SOURCE_DB,
    "table": SOURCE_TABLE,
}
"""Template field -> the helper column holding it."""


def route_sql(routes: Routes) -> str:
    """SQL for the route (a table identifier) of each row, or null when nothing claims it."""
    branches = [
        f"WHEN {_claim_sql(table)} THEN {sql.string(table.identifier)}"
        for table in routes.claiming()
    ]
    fallback = template_sql(routes.template) if routes.template else "CAST(NULL AS STRING)"
    return f"CASE {' '.join(branches)} ELSE {fallback} END" if branches else fallback


def _claim_sql(table: TableSpec) -> str:
    conditions = []
    if table.topics:
        conditions.append(sql.in_list(KAFKA_TOPIC, [sql.string(topic) for topic in table.topics]))
    if table.source_db:
        conditions.append(f"{SOURCE_DB} = {sql.string(table.source_db)}")
    if table.source_table:
        conditions.append(f"{SOURCE_TABLE} = {sql.string(table.source_table)}")
    return sql.all_of(conditions)


def template_sql(template: str) -> str:
    """`cdc.{db}_{table}` -> concat('cdc.', db, '_', table); null when a field is missing."""
    parts: list[str] = []
    for literal, field_name in template_parts(template):
        if literal:
            parts.append(sql.string(literal))
        if field_name is not None:
            parts.append(_TEMPLATE_COLUMNS[field_name])
    return f"concat({', '.join(parts)})"


def routed_rows(decoded: DecodedBatch, routes: Routes, tables: list[TableSpec]) -> DataFrame:
    """Batch-level frame: decoded + routing + error kinds (before any table's flattening).

    Args:
        tables: the config's tables (their primary keys decide `missing-key`).
    """
    helpers = helper_sql(decoded.versions)
    frame = decoded.frame.selectExpr(
        "*",
        *[
            f"{helpers[name]} AS {name}"
            for name in (
                KAFKA_TOPIC,
                KAFKA_PARTITION,
                KAFKA_OFFSET,
                SOURCE_DB,
                SOURCE_TABLE,
                SOURCE_SERVER,
            )
        ],
    )
    frame = frame.selectExpr("*", f"{route_sql(routes)} AS {ROUTE}")
    error = (
        f"CASE WHEN {ERROR} IS NOT NULL THEN {ERROR} WHEN {ROUTE} IS NULL THEN 'unroutable' WHEN "
        f"{_missing_key_sql(decoded, tables, routes)} THEN CASE WHEN "
        f"{_delete_without_before(decoded)} THEN 'delete-without-key' ELSE 'missing-key' END WHEN "
        f"{unconvertible_sql(decoded.versions)} THEN 'unconvertible-value' END"
    )
    return frame.selectExpr(
        *[sql.ident(c) for c in frame.columns if c != ERROR], f"{error} AS {ERROR}"
    )


def _delete_without_before(decoded: DecodedBatch) -> str:
    """True for Debezium deletes without a `before`
    image: a missing key is then a missing record key."""
    return sql.any_of(
        delete_without_before_sql(sql.ident(v.column)) for v in decoded.versions if v.is_debezium
    )


def _missing_key_sql(decoded: DecodedBatch, tables: list[TableSpec], routes: Routes) -> str:
    """True for rows routed to a table with a primary key whose key columns are null (a record
    that a keyed table of a fan-out cannot take goes to the dead letters for all of them).

    Each version's value is tested on its own (no coalesce across versions), so versions that
    give a key column different types never meet in one expression.
    """
    conditions = []
    for spec in tables:
        if spec.primary_key:
            any_null = sql.any_of(
                row_value_is_null_sql(key, decoded.versions, case_insensitive=True)
                for key in spec.primary_key
            )
            conditions.append(
                f"({ROUTE} = {sql.string(routes.route_of(spec.identifier))} AND {any_null})"
            )
    return sql.any_of(conditions)

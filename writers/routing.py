"""Which table each record goes to: by topic, by Debezium `source.db`/`source.table`, or a template.

A record claimed by no table, on a source without a template, goes to the dead-letter topic as
`unroutable`, so it is counted rather than silently dropped. The routed frame also marks the other
records that cannot become rows of their table (`missing-key`; `delete-without-key` for a delete
with neither a `before` image nor a record key that gives its key columns; `unconvertible-value`).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from functools import cached_property

from pyspark.sql import DataFrame

from icekeeper.common.config.model import KafkaSource, TableSpec
from icekeeper.writers import sql
from icekeeper.writers.columns import (
    ERROR,
    KAFKA_OFFSET,
    KAFKA_PARTITION,
    KAFKA_TOPIC,
    ROUTE,
    SOURCE_DB,
    SOURCE_SERVER,
    SOURCE_TABLE,
)
from icekeeper.writers.decode import DecodedBatch
from icekeeper.writers.flatten import helper_sql, row_value_is_null_sql, unconvertible_sql
from icekeeper.writers.record_keys import delete_without_before_sql

_TEMPLATE_FIELDS = {
    "topic": KAFKA_TOPIC,
    "server": SOURCE_SERVER,
    "db": SOURCE_DB,
    "table": SOURCE_TABLE,
}


@dataclass(frozen=True)
class Routes:
    """Routing of one source: explicit tables, then an optional template.

    Tables that claim records alike (the same topics, `source_db` and `source_table`) all get them:
    the first is the records' route, the others follow it (fan-out: an upsert mirror and a
    changelog audit table of one topic, say). Each record has one route, so the batch is decoded,
    routed and checked once however many tables it feeds.
    """

    tables: list[TableSpec]
    template: str | None

    def sql(self) -> str:
        """SQL for the route (a table identifier) of each row, or null when nothing claims it."""
        branches = [
            f"WHEN {_claims(table)} THEN {sql.string(table.identifier)}"
            for table in self.claiming()
        ]
        fallback = template_sql(self.template) if self.template else "CAST(NULL AS STRING)"
        return f"CASE {' '.join(branches)} ELSE {fallback} END" if branches else fallback

    @cached_property
    def _routes(self) -> dict[str, str]:
        """Table identifier -> its route, worked out once (`sql` and `fed_by` ask per table)."""
        first_by_claim: dict[str, str] = {}
        routes = {}
        for table in self.tables:
            claim = _claims(table)
            routes[table.identifier] = (
                table.identifier
                if claim is None
                else first_by_claim.setdefault(claim, table.identifier)
            )
        return routes

    def only_route(self) -> str | None:
        """The one route a record can take: a single table claims records and no template names
        others; None otherwise."""
        claiming = self.claiming()
        return claiming[0].identifier if len(claiming) == 1 and not self.template else None

    def claiming(self) -> list[TableSpec]:
        """The tables that claim records as their own route, in claim order (a follower of a
        fan-out claims nothing of its own; a table without topics, db or table claims nothing)."""
        return [
            table
            for table in self.tables
            if _claims(table) is not None and self.route_of(table.identifier) == table.identifier
        ]

    def route_of(self, identifier: str) -> str:
        """The route whose records table `identifier` gets:
        its own, or the first table claiming alike."""
        return self._routes.get(identifier, identifier)

    def fed_by(self, route: str) -> list[str]:
        """The tables that get the records of `route`: the route's own table, then its followers."""
        return [
            route,
            *[
                identifier
                for identifier, own in self._routes.items()
                if own == route and identifier != route
            ],
        ]


def _claims(table: TableSpec) -> str | None:
    conditions = []
    if table.topics:
        conditions.append(sql.in_list(KAFKA_TOPIC, [sql.string(topic) for topic in table.topics]))
    if table.source_db:
        conditions.append(f"{SOURCE_DB} = {sql.string(table.source_db)}")
    if table.source_table:
        conditions.append(f"{SOURCE_TABLE} = {sql.string(table.source_table)}")
    return sql.all_of(conditions) if conditions else None


def template_parts(template: str) -> list[tuple[str, str | None]]:
    """`cdc.{db}_{table}` -> [('cdc.', 'db'), ('_', 'table')]: each literal and the field after
    it (None at the end); the one reading of a template for both engines."""
    parts: list[tuple[str, str | None]] = []
    for literal, field_name, _, _ in string.Formatter().parse(template):
        if field_name is not None and field_name not in _TEMPLATE_FIELDS:
            raise ValueError(
                f"table_template {template!r}: unknown field {{{field_name}}}; use "
                f"{sorted(_TEMPLATE_FIELDS)}"
            )
        parts.append((literal, field_name))
    return parts


def template_sql(template: str) -> str:
    """`cdc.{db}_{table}` -> concat('cdc.', db, '_', table); null when a field is missing."""
    parts: list[str] = []
    for literal, field_name in template_parts(template):
        if literal:
            parts.append(sql.string(literal))
        if field_name is not None:
            parts.append(_TEMPLATE_FIELDS[field_name])
    return f"concat({', '.join(parts)})"


def routes_for(source: KafkaSource, tables: list[TableSpec]) -> Routes:
    return Routes([table for table in tables if table.source == source.name], source.table_template)


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
    frame = frame.selectExpr("*", f"{routes.sql()} AS {ROUTE}")
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

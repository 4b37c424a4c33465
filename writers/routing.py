"""Which table each record goes to: by topic, by Debezium `source.db`/`source.table`, or a template.

A table claims the records of its `topics` whose `source.db` and `source.table` are its
`source_db` and `source_table` (each condition only where given); records no table claims go to
the source's `table_template`, and without one they are `unroutable` dead letters, counted rather
than silently dropped. Both engines route by these claims, in this order (`Routes.claims`), and
fill templates alike (`template_parts`).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from functools import cached_property

from icekeeper.common.config.model import KafkaSource, TableSpec

TEMPLATE_FIELDS = ("topic", "server", "db", "table")
"""What a `table_template` may name: the Kafka topic, Debezium's `source.name`, `source.db` and
`source.table`."""


@dataclass(frozen=True)
class RouteClaim:
    """The records a route claims: all conditions given must hold."""

    route: str
    topics: tuple[str, ...]
    source_db: str | None
    source_table: str | None


def _claim_of(table: TableSpec) -> tuple[tuple[str, ...], str | None, str | None] | None:
    """What `table` claims, comparable between tables; None when it claims nothing."""
    if not (table.topics or table.source_db or table.source_table):
        return None
    return (tuple(table.topics), table.source_db or None, table.source_table or None)


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

    @cached_property
    def _routes(self) -> dict[str, str]:
        """Table identifier -> its route, worked out once (`fed_by` and `route_of` ask per
        table)."""
        first_by_claim: dict[tuple, str] = {}
        routes = {}
        for table in self.tables:
            claim = _claim_of(table)
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
            if _claim_of(table) is not None and self.route_of(table.identifier) == table.identifier
        ]

    def claims(self) -> list[RouteClaim]:
        """The routes' claims in claim order: the first that holds is a record's route."""
        return [
            RouteClaim(spec.identifier, tuple(spec.topics), spec.source_db, spec.source_table)
            for spec in self.claiming()
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

    def keyed_routes(self) -> dict[str, tuple[str, ...]]:
        """Route -> the primary-key columns of the tables it feeds, where any has one: a record of
        the route without them is a `missing-key` dead letter for all of them."""
        keyed: dict[str, tuple[str, ...]] = {}
        for spec in self.tables:
            if spec.primary_key:
                route = self.route_of(spec.identifier)
                keyed[route] = tuple(dict.fromkeys([*keyed.get(route, ()), *spec.primary_key]))
        return keyed


def template_parts(template: str) -> list[tuple[str, str | None]]:
    """`cdc.{db}_{table}` -> [('cdc.', 'db'), ('_', 'table')]: each literal and the field after
    it (None at the end); the one reading of a template for both engines."""
    parts: list[tuple[str, str | None]] = []
    for literal, field_name, _, _ in string.Formatter().parse(template):
        if field_name is not None and field_name not in TEMPLATE_FIELDS:
            raise ValueError(
                f"table_template {template!r}: unknown field {{{field_name}}}; use "
                f"{sorted(TEMPLATE_FIELDS)}"
            )
        parts.append((literal, field_name))
    return parts


def routes_for(source: KafkaSource, tables: list[TableSpec]) -> Routes:
    return Routes([table for table in tables if table.source == source.name], source.table_template)

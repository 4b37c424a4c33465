"""Which table each record goes to: by topic, by Debezium `source.db`/`source.table`, or a template.

A record claimed by no table, on a source without a template, goes to the dead-letter topic as
`unroutable`, so it is counted rather than silently dropped.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from pyspark.sql import Column as SparkColumn
from pyspark.sql import functions as F

from common.config.model import KafkaSource, TableSpec
from writers.flatten import KAFKA_TOPIC, SOURCE_DB, SOURCE_SERVER, SOURCE_TABLE

_TEMPLATE_FIELDS = {"topic": KAFKA_TOPIC, "server": SOURCE_SERVER, "db": SOURCE_DB, "table": SOURCE_TABLE}


@dataclass(frozen=True)
class Routes:
    """Routing of one source: explicit tables, then an optional template."""

    tables: list[TableSpec]
    template: str | None

    def column(self) -> SparkColumn:
        """The destination table identifier of each row, or null when nothing claims it."""
        route: SparkColumn | None = None
        for table in self.tables:
            condition = _claims(table)
            if condition is None:
                continue
            route = F.when(condition, F.lit(table.identifier)) if route is None else route.when(condition, F.lit(table.identifier))
        fallback = template_column(self.template) if self.template else F.lit(None).cast("string")
        return fallback if route is None else route.otherwise(fallback)


def _claims(table: TableSpec) -> SparkColumn | None:
    conditions = []
    if table.topics:
        conditions.append(F.col(KAFKA_TOPIC).isin(*table.topics))
    if table.source_db or table.source_table:
        by_source = F.lit(True)
        if table.source_db:
            by_source = by_source & (F.col(SOURCE_DB) == F.lit(table.source_db))
        if table.source_table:
            by_source = by_source & (F.col(SOURCE_TABLE) == F.lit(table.source_table))
        conditions.append(by_source)
    if not conditions:
        return None
    claim = conditions[0]
    for condition in conditions[1:]:
        claim = claim & condition
    return claim


def template_column(template: str) -> SparkColumn:
    """`cdc.{db}_{table}` -> concat('cdc.', db, '_', table); null when a field is missing."""
    parts: list[SparkColumn] = []
    for literal, field_name, _, _ in string.Formatter().parse(template):
        if literal:
            parts.append(F.lit(literal))
        if field_name is not None:
            if field_name not in _TEMPLATE_FIELDS:
                raise ValueError(f"table_template {template!r}: unknown field {{{field_name}}}; use {sorted(_TEMPLATE_FIELDS)}")
            parts.append(F.col(_TEMPLATE_FIELDS[field_name]))
    return F.concat(*parts)


def routes_for(source: KafkaSource, tables: list[TableSpec]) -> Routes:
    return Routes([table for table in tables if table.source == source.name], source.table_template)

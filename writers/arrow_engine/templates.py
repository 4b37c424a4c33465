"""Records no table claims, routed by the source's `table_template` with Arrow compute.

The same route as `sql_routing.template_sql` gives on `spark-sql`: the template's literals and
the record's topic, Debezium `source.name`, `source.db` and `source.table` joined, or null
(`unroutable`) when a field it names is missing, as Spark's `concat` gives null.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from icekeeper.writers.arrow_engine.arrow_flatten import VersionRows
from icekeeper.writers.routing import template_parts

_SOURCE_FIELDS = {"server": "name", "db": "db", "table": "table"}
"""Template field -> the Debezium `source` field it names (`{topic}` is the Kafka topic)."""


def template_routes(template: str, rows: VersionRows) -> pa.Array:
    """The table each of `rows` goes to by the template (null where a field is missing)."""
    count = len(rows.offsets)
    pieces: list[pa.Array] = []
    for literal, field_name in template_parts(template):
        if literal:
            pieces.append(pa.repeat(pa.scalar(literal, pa.string()), count))
        if field_name == "topic":
            pieces.append(pa.repeat(pa.scalar(rows.topic, pa.string()), count))
        elif field_name is not None:
            value = rows.source_field(_SOURCE_FIELDS[field_name])
            pieces.append(
                pa.nulls(count, pa.string()) if value is None else pc.cast(value, pa.string())
            )
    if not pieces:
        return pa.repeat(pa.scalar("", pa.string()), count)
    return pc.binary_join_element_wise(*pieces, "", null_handling="emit_null")


def topic_template_route(template: str, topic: str) -> str | None:
    """The template's route for a record of `topic` whose value did not decode: the template
    when it names no field but the topic (the others are null then), else None."""
    parts = template_parts(template)
    if any(field_name not in (None, "topic") for _, field_name in parts):
        return None
    return "".join(literal + (topic if field_name else "") for literal, field_name in parts)

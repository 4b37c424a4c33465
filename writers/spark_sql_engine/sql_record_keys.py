"""Deletes without a `before` image on `spark-sql`: their key columns read from the record key.

For such deletes each schema version gets one more decoded column: the record key read as the
version's primary-key columns (`writers/key_columns.py` says which, and for Avro keys with which
schemas), typed as the row types them. Flattening takes a delete's key columns from it when
`before` is null (`sql_flatten._carrier_sql`), with the row's conversions. The column is a
`CASE` on the decoded event, so other records cost one comparison and keys are never decoded for
them.
"""

from __future__ import annotations

import json

from icekeeper.writers.spark_sql_engine import sql


def delete_without_before_sql(event: str) -> str:
    """SQL true for a Debezium delete whose `before` image
    is null (`event`: SQL for the decoded envelope)."""
    return f"({event}.{sql.ident('op')} = 'd' AND {event}.{sql.ident('before')} IS NULL)"


def json_key_row_sql(single_column: str | None) -> str:
    """SQL for the record key as the JSON text of a row object, or null.

    The key is a JSON object, or Kafka Connect's `{"schema": .., "payload": ..}` around one; a
    primitive payload becomes `{"<single_column>": <payload>}`. Anything else is null (no key).
    """
    text = "CAST(key AS STRING)"
    enveloped = f"(array_sort(json_object_keys({text})) = array('payload', 'schema'))"
    payload = (
        f"to_json(CASE WHEN {enveloped} THEN variant_get(try_parse_json({text}), '$.payload') "
        f"ELSE try_parse_json({text}) END)"
    )
    primitive = (
        f"concat({sql.string('{' + json.dumps(single_column) + ':')}, {payload}, '}}')"
        if single_column
        else "NULL"
    )
    return f"CASE WHEN startswith({payload}, '{{') THEN {payload} ELSE {primitive} END"

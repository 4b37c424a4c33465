"""Names of the helper columns `spark-sql` adds to a batch's frame, all `_ik_`-prefixed.

They sit next to the Kafka columns and the row columns while a batch is decoded, routed,
flattened and written, and none of them reaches a Parquet file: `HELPER_COLUMNS`, `ROUTE`,
`VERSION` and `KEEP` are dropped before the write, the others never leave decoding. One place for
them keeps a new helper from colliding with an existing one. (Aliases of observed counts and
SQL lambda variables are not columns and stay with their code: `sql_table_versions.py`,
`formats/connect_schema.py`; each version's struct column is named by
`writers.version_shapes.version_column`.)
"""

from __future__ import annotations

# -- set by decoding (`decoding.py`, the formats' `*_sql.py`) --------------------------------------

ERROR = "_ik_error"
"""Null when the record decoded and can become a row, else why not (see `decoding.py`)."""
VERSION = "_ik_version"
"""Index into `DecodedBatch.versions` of the version whose schema the record names (null: none)."""
DECODE_BARRIER = "_ik_decode_barrier"
"""`spark_partition_id()`: a nondeterministic column
that keeps filters from being pushed into decoding."""
JSON_TEXT = "_ik_json"
"""The record's value as text."""
JSON_SCHEMA = "_ik_json_schema"
"""Debezium JSON: the record's Kafka Connect schema (`$.schema`) as JSON text; null without one."""
JSON_CORRUPT = "_ik_corrupt_record"
"""Set by `from_json` to the text of a record that does not parse into its version's type."""


def json_parsed_column(index: int) -> str:
    """JSON version `index`'s record as `from_json` parsed
    it, before conversion to the version's struct."""
    return f"_ik_j{index}"


def record_key_column(index: int) -> str:
    """Version `index`'s row as read from the Kafka record
    key, for deletes without `before` (`sql_record_keys.py`)."""
    return f"_ik_key{index}"


# -- per record, from the decoded versions (`sql_flatten.helper_sql`) ------------------------------

EVENT_MS = "_ik_event_ms"
SOURCE_DB = "_ik_source_db"
SOURCE_TABLE = "_ik_source_table"
SOURCE_SERVER = "_ik_source_server"
KAFKA_TOPIC, KAFKA_PARTITION, KAFKA_OFFSET = "_ik_topic", "_ik_partition", "_ik_offset"
HELPER_COLUMNS = (
    ERROR,
    EVENT_MS,
    SOURCE_DB,
    SOURCE_TABLE,
    SOURCE_SERVER,
    KAFKA_TOPIC,
    KAFKA_PARTITION,
    KAFKA_OFFSET,
)
"""Columns next to the row columns that the writer uses and drops before writing files."""

# -- routing and writing a table (`sql_routing.py`, `table_writer.py`) -----------------------------

ROUTE = "_ik_route"
"""The identifier of the table a record goes to; null when nothing claims it."""
KEEP = "_ik_keep"
"""True for the records of the table being written: routed to it, decoded, not before its start."""

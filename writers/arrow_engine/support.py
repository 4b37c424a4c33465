"""What the arrow engine takes: the reason a source's batch must run on `spark-sql` instead.

The arrow engine writes the same tables as `spark-sql` or none at all, so anything it has not
been built and tested for yet (JSON sources, Spark's rebalancing of partitioned tables' files,
Kafka client properties librdkafka does not take, semantic types without an Arrow conversion) is
named here and the batch runs on the `spark-sql` engine. A batch can also find out while it runs
that it needs `spark-sql` (`arrow_batch.py`): an upsert key in two Kafka partitions of one batch
(`arrow_upserts.py`), a delete without `before` whose record key the writer cannot read yet
(`arrow_record_keys.py`); the core then runs the batch on `spark-sql` (`writers/source_batch.py`)
and says so once per reason.
"""

from __future__ import annotations

from typing import Any

from icekeeper.common.config.model import KafkaSource, TableSpec
from icekeeper.common.schema import COLLECTION, WIDE_DECIMAL, envelope_shape, row_columns
from icekeeper.common.source_formats import source_format
from icekeeper.writers.arrow_engine.consumer_settings import refused_properties
from icekeeper.writers.registry import RegisteredSchema
from icekeeper.writers.semantic_types import AS_THEY_COME, CONVERTED

ENGINE = "arrow"


def unsupported_reason(
    source: KafkaSource, tables: list[TableSpec], schemas: list[RegisteredSchema]
) -> str | None:
    """Why the arrow engine cannot write this source's batch, or None when it can.

    Args:
        tables: the source's tables (routed explicitly).
        schemas: the registered value schemas the batch may hold.
    """
    if ENGINE not in source_format(source.format).decoders:
        return f"source format {source.format} (no arrow decoder registered)"
    refused = refused_properties(source.consumer_properties)
    if refused:
        return f"consumer_properties librdkafka does not take: {', '.join(refused)}"
    for schema in schemas:
        reason = _schema_reason(schema.resolved)
        if reason:
            return f"schema id {schema.schema_id}: {reason}"
    return None


def layout_reason(tables: list[TableSpec], distribution: str) -> str | None:
    """Why the arrow engine cannot lay out these tables' files as `spark-sql` does, or None.

    Its tasks write their own files of each partition (`writer.distribution: none`); a shuffle
    by partition (`rebalance`) is Spark's alone so far.
    """
    for table in tables:
        if table.partition_by and distribution == "rebalance":
            return f"writer.distribution rebalance on partitioned table {table.identifier}"
    return None


def _schema_reason(resolved: dict[str, Any]) -> str | None:
    try:
        shape = envelope_shape(resolved)
        columns = row_columns(shape)
    except ValueError as error:
        return str(error)
    for column in columns:
        semantic = column.semantic
        if semantic == COLLECTION:
            return f"column {column.name}: {semantic} values"
        if semantic and semantic.startswith(WIDE_DECIMAL):
            continue
        if semantic and semantic not in CONVERTED and semantic not in AS_THEY_COME:
            return f"column {column.name}: semantic type {semantic}"
    if _has_map(resolved):
        return "an Avro map (polars cannot decode maps)"
    return None


def _has_map(node: Any) -> bool:
    if isinstance(node, list):
        return any(_has_map(item) for item in node)
    if isinstance(node, dict):
        if node.get("type") == "map":
            return True
        return any(_has_map(value) for value in node.values())
    return False

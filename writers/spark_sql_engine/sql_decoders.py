"""The `spark-sql` engine's one decoder interface: a source format's records to a `DecodedBatch`.

Each source format has one module here whose `decode` has the signature of `SqlDecoder`
(`sql_avro_confluent.py`, `sql_debezium_json.py`, `sql_plain_json.py`,
`sql_unwrapped_avro.py`); which module decodes which format is registered with the format
(`common/source_formats.py`), so the engine never switches on a format's name.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession

from icekeeper.common.config.model import MetadataColumns
from icekeeper.common.source_formats import source_format
from icekeeper.writers.engines import SourceBatch
from icekeeper.writers.spark_sql_engine.decoding import DecodedBatch

ENGINE = "spark-sql"


class SqlDecoder(Protocol):
    def __call__(
        self, spark: SparkSession, raw: DataFrame, batch: SourceBatch, metadata: MetadataColumns
    ) -> DecodedBatch:
        """The batch's raw Kafka records (`kafka_source.read_raw`) decoded: Kafka columns,
        `_ik_error` (null, or why the record did not decode) and one struct column per version
        (`DecodedBatch`)."""
        ...


def sql_decoder(format_name: str) -> SqlDecoder:
    """The registered `spark-sql` decoder of `format_name`."""
    module = importlib.import_module(source_format(format_name).decoders[ENGINE])
    return module.decode

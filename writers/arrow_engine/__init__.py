"""The `arrow` writer engine: Spark schedules the tasks, each task's body is Arrow-native Python.

Each task reads its offset range with confluent-kafka (`kafka_read.py`), decodes the
Confluent-framed Avro datums in bulk as one Avro container block with polars (`avro_block.py`),
routes and flattens the records with Arrow compute (`task.py`, a source's table template:
`templates.py`; `flatten.py`, `conversions.py`), writes Parquet with pyarrow
(`common/arrow_parquet.py`, shared with the bookkeeper's purges), one file set per partition
value (`partitions.py`), and returns only file facts (`task.py`). The
driver (`engine.py`) plans the tasks, checks which schema versions fed which table, and builds
the same monikers as the `spark-sql` engine. What the engine does not take yet (`support.py`)
runs on `spark-sql`, logged once per reason: the two engines never differ in output.
"""

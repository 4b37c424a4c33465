"""The `arrow` writer engine: Spark schedules the tasks, each task's body is Arrow-native Python.

The driver (`arrow_batch.py`) cuts a source's batch into tasks (`task_ranges.py`; an upsert
batch's whole partitions: `arrow_upserts.py`), has the core plan each table's batch
(`writers/table_batch.py`), runs the tasks and adds up their file facts for the core
(`writers/engines.py`). Each task (`task.py`) reads its offset range with confluent-kafka
(`kafka_read.py`, the source's settings through `consumer_settings.py`), decodes the
Confluent-framed Avro datums in bulk with polars (`avro_block.py`), routes the records (a
table template: `templates.py`), flattens them with Arrow compute (`arrow_flatten.py`,
`arrow_conversions.py`; deletes' keys from record keys: `arrow_record_keys.py`), keeps each
key's last change for upsert tables (`arrow_upserts.py`), and writes Parquet with pyarrow
(`common/arrow_parquet.py`), one file set per partition value (`partitions.py`). What the engine
does not take yet (`support.py`) the core runs on `spark-sql`, logged once per reason: the two
engines never differ in output. Nothing here imports `spark_sql_engine/`.
"""

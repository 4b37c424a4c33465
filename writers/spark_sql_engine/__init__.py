"""The `spark-sql` writer engine: Spark reads, decodes and writes a batch's rows as Spark SQL.

The engine (`sql_batch.py`) reads a source's batch with Spark's Kafka source (`kafka_source.py`),
decodes it (`decoding.py`, by the source's format), routes it and marks the records that cannot
become rows (`sql_routing.py`), learns or predicts which schema versions feed which table
(`sql_table_versions.py`), has the core plan each table's batch (`writers/table_batch.py`) and
writes its rows (`table_writer.py`: flattened by `sql_flatten.py` with `sql_conversions.py`,
deletes' keys from record keys by `sql_record_keys.py`, each key's last change for upsert tables
by `sql_upserts.py`). Its dead-letter pass (`rejected_records.py`) finds the records a batch
rejected, whichever engine wrote it. Expressions are SQL text (`sql.py`) over helper columns
(`columns.py`): no row crosses into Python, so executors need no Python packages. Nothing here
imports `arrow_engine/`.
"""

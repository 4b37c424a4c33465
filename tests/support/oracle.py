"""Compare an Iceberg changelog table with the source database's `SELECT *`, through every engine.

The oracle tests run real statements against MariaDB or PostgreSQL, stream them through
Debezium, the writer and the bookkeeper, and then check what a user would: the latest row of
every live key equals the database's row, column by column and with the right types, read by
pyiceberg, DuckDB and Spark alike; and every Kafka record is in exactly one place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

# The latest live row per key and the value forms live
# where `icekeeper demo --source mariadb` uses them too.
from icekeeper.common.committed_state import committed_state
from icekeeper.common.config import IcekeeperConfig
from icekeeper.mirror import UTC, engine_rows, latest_live_rows, normalized, rows_by_key, time_text  # noqa: F401 - re-exported for the oracle tests
from tests.support.pipeline import pipeline_config
from tests.support.waiting import wait_until


def position(row: dict[str, Any]) -> tuple[str, int, int]:
    return (row["_kfk_topic"], row["_kfk_partition"], row["_kfk_offset"])


def topic_records(bootstrap_servers: str, topics: list[str]) -> int:
    """Records in `topics` (none was ever deleted: retention is off on the test stack)."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    metadata = admin.list_topics(timeout=10)
    partitions = [
        TopicPartition(topic, p) for topic in topics for p in metadata.topics[topic].partitions
    ]
    latest = admin.list_offsets({tp: OffsetSpec.latest() for tp in partitions}, request_timeout=10)
    return sum(future.result().offset for future in latest.values())


def oracle_config(
    tmp_path: Path,
    namespace: str,
    orders_topic: str,
    customers_topic: str,
    dead_letter_topic: str,
    customers_source: tuple[str, str],
    source_format: str = "avro-confluent",
    mode: str = "upsert",
) -> IcekeeperConfig:
    """Two tables of one Debezium source: `<namespace>.orders` keyed by (region, id) and routed by
    topic, `<namespace>.customers` keyed by id and routed by Debezium's `source.db` and
    `source.table` (`customers_source`), as multi-table topics need; both in `mode`."""
    database, table = customers_source
    return pipeline_config(
        tmp_path,
        orders_topic,
        {
            "ICEKEEPER__SOURCES__0__FORMAT": source_format,
            "ICEKEEPER__SOURCES__0__TOPICS": f"[{orders_topic}, {customers_topic}]",
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": dead_letter_topic,
            "ICEKEEPER__TABLES__0__IDENTIFIER": f"{namespace}.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[region, id]",
            "ICEKEEPER__TABLES__1__IDENTIFIER": f"{namespace}.customers",
            "ICEKEEPER__TABLES__1__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__1__SOURCE_DB": database,
            "ICEKEEPER__TABLES__1__SOURCE_TABLE": table,
            "ICEKEEPER__TABLES__0__MODE": mode,
            "ICEKEEPER__TABLES__1__MODE": mode,
        },
    )


class Pipeline:
    """A writer and a bookkeeper driven in-process, with every batch's report kept."""

    def __init__(self, config: IcekeeperConfig, spark) -> None:
        from icekeeper.bookkeeper.service import Bookkeeper
        from icekeeper.writers.job import WriterJob

        self.config = config
        self.job = WriterJob(config, spark=spark)
        self.bookkeeper = Bookkeeper(config)
        self.reports: list = []

    def sync(self) -> None:
        """Write what Kafka holds and commit it."""
        self.reports.extend(self.job.run(until_idle=True))
        for _ in range(5):
            if not self.bookkeeper.run_cycle().pending:
                break

    def sync_until(
        self, identifier: str, column: str, value: Any, timeout_s: float = 120.0
    ) -> None:
        """Sync until a row with `column` = `value` (the
        source's last statement) is in the table."""

        def arrived() -> bool:
            self.sync()
            rows = (
                self.bookkeeper.catalog.load_table(identifier)
                .scan(selected_fields=(column,))
                .to_arrow()
                .to_pylist()
            )
            return any(row[column] == value for row in rows)

        wait_until(arrived, timeout_s, f"the last statement to reach {identifier}", interval_s=1)

    def row_types(self, identifier: str) -> dict[str, str]:
        """The table's row columns (no metadata columns) and their Iceberg types."""
        schema = self.bookkeeper.catalog.load_table(identifier).schema()
        return {f.name: str(f.field_type) for f in schema.fields if not f.name.startswith("_")}

    def assert_mirrors(
        self,
        spark,
        expected_by_table: dict[str, tuple[list[str], list[dict[str, Any]]]],
        topics: list[str],
    ) -> None:
        """Each table equals the database's rows through every engine, and every Kafka record of
        `topics` is accounted for.

        An upsert table is compared as it is read, one row per key, with no read-time deduplication,
        and its committed offsets reach the end of every partition. A changelog table's latest live
        rows are compared, and each record is in exactly one table or is a skipped tombstone.

        Args:
            expected_by_table: identifier -> (key columns, the source's `SELECT *` as the table
                holds it).
        """
        from icekeeper.readers import duckdb_rows, spark_rows

        positions = []
        consumed: dict[tuple[str, int], int] = {}
        upserts = {
            identifier: self.config.table(identifier).upsert for identifier in expected_by_table
        }
        for identifier, (key, source_rows) in expected_by_table.items():
            table = self.bookkeeper.catalog.load_table(identifier)
            engines = engine_rows(
                table,
                lambda columns, identifier=identifier: spark_rows(
                    spark, self.config, identifier, columns
                ),
                duckdb_rows,
            )
            expected = {tuple(row[k] for k in key): row for row in source_rows}
            for engine, rows in engines.items():
                mirror = (
                    rows_by_key(rows, key) if upserts[identifier] else latest_live_rows(rows, key)
                )
                assert sorted(mirror) == sorted(expected), f"{identifier} via {engine}: keys differ"
                for identity, source_row in expected.items():
                    assert {name: mirror[identity][name] for name in source_row} == source_row, (
                        f"{identifier} {identity} via {engine}"
                    )
            if upserts[identifier]:
                for partition, offset in committed_state(table).offsets.items():
                    consumed[partition] = max(consumed.get(partition, 0), offset)
            else:
                positions += [position(row) for row in engines["pyiceberg"]]
        assert len(positions) == len(set(positions)), "a Kafka record is in a table twice"
        tombstones = sum(r.tombstones_skipped for r in self.reports)
        assert sum(r.dead_lettered for r in self.reports) == 0 and tombstones > 0
        records = topic_records(self.config.sources[0].bootstrap_servers, topics)
        if all(upserts.values()):
            assert sum(consumed.values()) == records, (
                "the tables' committed offsets do not reach every record"
            )
        else:
            assert len(positions) + tombstones == records

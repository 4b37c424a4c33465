"""Upsert tables end to end: a random CDC stream (inserts, repeated updates, deletes, re-inserts,
within and across batches, three partitions, schema changes on the way) leaves the table equal to
the stream's final state, read alike by pyiceberg, DuckDB and Spark."""

from __future__ import annotations

from pathlib import Path

import pytest

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.readers import duckdb_rows, spark_rows
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec, expected_state
from icekeeper.writers.job import WriterJob
from tests.support.pipeline import pipeline_config, register_catalog

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def keyed(rows: list[dict]) -> dict[int, tuple]:
    keys = [row["id"] for row in rows]
    assert len(keys) == len(set(keys)), "a key has two live rows"
    return {row["id"]: (row["customer"], row["amount"], row["status"]) for row in rows}


@pytest.mark.parametrize("delete_mode", ["hard", "soft"])
def test_a_random_stream_leaves_the_final_state_of_every_key(
    local_stack, spark, tmp_path: Path, unique_topic: str, delete_mode: str
) -> None:
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__DELETE_MODE": delete_mode,
            "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": "900",
        },
    )
    spec = SyntheticSpec(
        seed=41, keys=150, events=4000, update_ratio=0.6, delete_ratio=0.15, schema_changes=2
    )
    produce_synthetic(config, spec, topic=unique_topic, partitions=3, progress=lambda m: None)
    writer, bookkeeper = WriterJob(config, spark=spark), Bookkeeper(config)
    batches = 0
    while reports := writer.run(max_batches=1, until_idle=True):
        batches += len(reports)
        bookkeeper.run_cycle()  # a snapshot per batch: keys change across snapshots too
    assert batches >= 4
    while bookkeeper.run_cycle().committed_monikers:
        pass

    final = expected_state(spec)
    live = {
        key: (row["customer"], row["amount"], row["status"])
        for key, row in final.items()
        if row is not None
    }
    table = bookkeeper.catalog.load_table("shop.orders")
    assert list(table.schema().identifier_field_ids) == [table.schema().find_field("id").field_id]
    if delete_mode == "hard":
        assert keyed(table.scan().to_arrow().to_pylist()) == live
        assert keyed(duckdb_rows(table, "id, customer, amount, status")) == live
        register_catalog(spark, config)
        assert (
            keyed(spark_rows(spark, config, "shop.orders", "id, customer, amount, status")) == live
        )
        # Through position deletes (the bookkeeper's purges may have dropped the files they were
        # for since).
        added = [
            s.summary.additional_properties.get("added-position-deletes") for s in table.snapshots()
        ]
        assert sum(int(count or 0) for count in added) > 0
    else:
        # Soft deletes keep a deleted key's last row, flagged by its operation.
        rows = table.scan().to_arrow().to_pylist()
        assert {row["id"] for row in rows} == set(final)
        assert {row["id"]: row["_src_op"] == "d" for row in rows} == {
            key: row is None for key, row in final.items()
        }
        assert keyed([row for row in rows if row["_src_op"] != "d"]) == live

"""A writer that dies while publishing: its batch's poison records are already in the dead-letter
topic (a published moniker covers its whole offset range, so they would never be read again),
and a restarted writer loses nothing. The chaos suite found the opposite order losing records.

Checked by position, not by count: each record of the topic, read back from Kafka, is in the
table once with its own payload (as pyiceberg, DuckDB and Spark read it) or, if it does not
decode, in the dead-letter topic; dead letters are counted with their repeats."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from icekeeper.chaos_verify import (
    CHANGELOG_FAULTS,
    changelog_columns,
    dead_letter_positions,
    dead_letter_report,
    topic_changes,
    topic_offsets,
    verify_changelog,
)
from icekeeper.readers import spark_rows
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from icekeeper.writers.job import WriterJob
from tests.support.fsyncs import record_fsyncs
from tests.support.pipeline import commit_all, pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]


class Died(Exception):
    """Stands in for SIGKILL at the moment of publishing (the only injected failure here)."""


def test_dead_letters_are_durable_before_the_moniker_is_published(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    dead_letter_topic = unique_topic + ".dlq"
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": dead_letter_topic,
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
        },
    )
    spec = SyntheticSpec(seed=21, keys=100, events=1500, schema_changes=0, poison_ratio=0.03)
    produced = produce_synthetic(
        config, spec, topic=unique_topic, partitions=3, progress=lambda m: None
    )
    changes, undecodable = topic_changes(config.sources[0], unique_topic)
    topic_positions = topic_offsets(config.sources[0].bootstrap_servers, unique_topic)
    assert len(changes) == spec.events and len(undecodable) == sum(produced["poison"].values()) > 0
    assert len(topic_positions) == produced["records"] == len(changes) + len(undecodable)

    doomed = WriterJob(config, spark=spark)
    doomed.transport.publish = lambda moniker: (_ for _ in ()).throw(Died())
    with pytest.raises(Died):
        doomed.run_batch()  # one batch (up to 200,000 records) covers the whole topic
    # Every poison record of the batch, each exactly once, before any moniker is out.
    assert dead_letter_positions(config, dead_letter_topic) == Counter(undecodable)

    WriterJob(config, spark=spark).run(until_idle=True)
    table = commit_all(config).catalog.load_table("shop.orders")
    dead = dead_letter_positions(config, dead_letter_topic)
    columns = changelog_columns(table)
    spark_read = [
        [row[name] for name in columns]
        for row in spark_rows(spark, config, "shop.orders", ", ".join(columns))
    ]
    report = verify_changelog(
        table, columns, spark_read, changes, set(undecodable), topic_positions, dead
    )
    # Each decodable record in the table exactly once, at its own position, with its own payload,
    # alike in pyiceberg, DuckDB and Spark; no poison in it, nothing missing.
    assert {name: report[name] for name in CHANGELOG_FAULTS} == dict.fromkeys(
        CHANGELOG_FAULTS, 0
    ), report
    assert (
        report["rows"] == report["duckdb_rows"] == report["spark_rows"] == len(changes)
        and report["engines_disagreeing"] == 0
    ), report
    # The restarted writer sends the same dead letters again: delivery is at least once
    # (writers/dead_letters.py), so each poison record is there exactly twice, and the chaos
    # checker reports such a repeat.
    assert dead == Counter({position: 2 for position in undecodable})
    assert dead_letter_report(dead, set(undecodable))["dead_letter_duplicates"] == len(undecodable)


def test_a_batch_s_files_are_durable_before_its_moniker_is_published(
    local_stack, spark, tmp_path: Path, unique_topic: str, monkeypatch
) -> None:
    """A power cut, not a kill: the moniker is synced before it is published (`write_whole`), but
    the Parquet files it names were only closed, so after a power cut on a local or mounted
    warehouse the moniker could come back and its files empty; the bookkeeper then quarantines
    it as invalid, and its records are never committed (its writer has moved past them). Every
    file a published moniker names, and the folders naming it, are synced before it is out."""
    import os

    from icekeeper.common.storage import open_filesystem

    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
        },
    )
    spec = SyntheticSpec(seed=5, keys=50, events=400, schema_changes=0)
    produce_synthetic(config, spec, topic=unique_topic, partitions=2, progress=lambda m: None)
    synced = record_fsyncs(monkeypatch)
    writer = WriterJob(config, spark=spark)
    published: list[tuple[object, set[str]]] = []
    publish = writer.transport.publish

    def publish_once_synced(moniker) -> None:
        published.append((moniker, set(synced)))
        publish(moniker)

    writer.transport.publish = publish_once_synced
    writer.run_batch()
    named = [
        (moniker.id, os.path.realpath(open_filesystem(entry.path)[1]), synced_before)
        for moniker, synced_before in published
        for entry in (*moniker.files, *moniker.delete_files)
    ]
    assert named, "the batch published no data file"
    for moniker_id, path, synced_before in named:
        assert os.path.getsize(path) > 0
        assert path in synced_before, f"{moniker_id}: {path} not synced before its moniker"
        assert os.path.dirname(path) in synced_before, f"{moniker_id}: its folder not synced"
    table = commit_all(config).catalog.load_table("shop.orders")
    assert table.scan().to_arrow().num_rows == spec.events

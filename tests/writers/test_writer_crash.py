"""A writer that dies while publishing: its batch's poison records are already in the dead-letter
topic (a published moniker covers its whole offset range, so they would never be read again),
and a restarted writer loses nothing. The chaos suite found the opposite order losing records."""

from __future__ import annotations

from pathlib import Path

import pytest

from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from tests.conftest import pipeline_config
from tests.writers.test_writer_pipeline import _read_all, commit_all, table_rows
from writers.job import WriterJob

pytestmark = [pytest.mark.integration, pytest.mark.spark]


class Died(Exception):
    """Stands in for SIGKILL at the moment of publishing (the only injected failure here)."""


def test_dead_letters_are_durable_before_the_moniker_is_published(local_stack, spark, tmp_path: Path, unique_topic: str) -> None:
    dead_letter_topic = unique_topic + ".dlq"
    config = pipeline_config(tmp_path, unique_topic, {"ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": dead_letter_topic,
                                                       "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders", "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]", "ICEKEEPER__TABLES__0__MODE": "changelog"})
    spec = SyntheticSpec(seed=21, keys=100, events=1500, schema_changes=0, poison_ratio=0.03)
    produced = produce_synthetic(config, spec, topic=unique_topic, partitions=3, progress=lambda m: None)
    poison = sum(produced["poison"].values())

    doomed = WriterJob(config, spark=spark)
    doomed.transport.publish = lambda moniker: (_ for _ in ()).throw(Died())
    with pytest.raises(Died):
        doomed.run_batch()
    assert len({(h["icekeeper.source.partition"], h["icekeeper.source.offset"]) for _, h in _read_all(config, dead_letter_topic)}) == poison

    WriterJob(config, spark=spark).run(until_idle=True)
    rows = table_rows(commit_all(config), "shop.orders")
    dead = {(h["icekeeper.source.partition"], h["icekeeper.source.offset"]) for _, h in _read_all(config, dead_letter_topic)}
    assert len(rows) == spec.events and len(dead) == poison and len(rows) + len(dead) == produced["records"]

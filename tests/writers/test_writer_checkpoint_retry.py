"""A batch whose monikers are published but whose checkpoint write fails: what the writer's next
batch does (review of issue 29's F5, which counts a batch's records as soon as it is published).

The checkpoint is what moves a table the batch gave no rows; a retry planned without it read the
whole batch again for such a table: every dead letter sent twice, and the records counted twice
(once as published, once as read again)."""

from __future__ import annotations

from pathlib import Path

import pytest

from icekeeper.samples.produce import ensure_topic, produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from icekeeper.writers import job as job_module
from icekeeper.writers.job import WriterJob
from tests.support.pipeline import pipeline_config, topic_values_with_headers

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_a_batch_whose_checkpoint_failed_is_not_read_again_for_a_table_it_gave_no_rows(
    local_stack, spark, tmp_path: Path, unique_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One source, two tables, each from its own topic (as Debezium's one topic per table); the
    batch has changes of the first table only, and poison. Its checkpoint write fails once after
    its monikers are published; the loop retries. The retry must read nothing again: the dead
    letters are in their topic once, the records counted once, the checkpoint at Kafka's end."""
    other, dead_letter_topic = unique_topic + ".other", unique_topic + ".dlq"
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__TOPICS": f"[{unique_topic}, {other}]",
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": dead_letter_topic,
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
            "ICEKEEPER__TABLES__1__IDENTIFIER": "db_gb18030_test.tbl_quiet",
            "ICEKEEPER__TABLES__1__TOPICS": f"[{other}]",
            "ICEKEEPER__TABLES__1__MODE": "changelog",
        },
    )
    monkeypatch.setattr(job_module, "_MAX_RETRY_WAIT_S", 0.0)
    source = config.sources[0]
    ensure_topic(source, other, 3)  # there, and quiet in this batch
    spec = SyntheticSpec(seed=9, keys=50, events=150, schema_changes=0, poison_ratio=0.05)
    produced = produce_synthetic(
        config, spec, topic=unique_topic, partitions=3, progress=lambda _: None
    )
    poison = sum(produced["poison"].values())
    assert poison > 0
    job = WriterJob(config, spark=spark)
    advance = job.checkpoints.advance
    failed: list[int] = []

    def advance_failing_once(source, plan) -> None:
        if not failed:
            failed.append(plan.records)
            raise OSError("checkpoint store unavailable")
        advance(source, plan)

    job.checkpoints.advance = advance_failing_once
    reports = job.run(until_idle=True)

    registry = job.metrics.registry
    assert failed == [produced["records"]]  # the first try published, then failed
    assert registry.get_sample_value("icekeeper_writer_batches_total", {"outcome": "failed"}) == 1
    assert sum(report.records_read for report in reports) == 0  # nothing read again
    assert len(topic_values_with_headers(config, dead_letter_topic)) == poison
    assert (
        registry.get_sample_value("icekeeper_writer_records_read_total", {"source": source.name})
        == produced["records"]
    )
    # Counted once, as published (issue 29 F5: the count came after the checkpoint, never reached).
    dead_letters = sum(
        sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == "icekeeper_writer_dead_letters_total"
    )
    assert dead_letters == poison
    checkpoint = job.checkpoints.read(source)
    finished = sum(offset for (topic, _), offset in checkpoint.items() if topic == unique_topic)
    assert finished == produced["records"]  # the retry wrote the failed checkpoint

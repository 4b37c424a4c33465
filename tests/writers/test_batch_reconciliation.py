"""A batch whose counts do not add up fails loudly instead of losing records (issue 26, item 4),
unless `spark-sql` can write it instead of the arrow engine (issue 27, F2).

Each engine is made to lose a record the way the issue found it could (the rule itself is in
`test_reconciliation.py`): the dead-letter pass accepts a record the writing pass failed (the
arrow task and `spark-sql` disagreed on poison), or a table's write leaves out a record its
route accepted. A batch the arrow engine wrote that does not reconcile is written again on
`spark-sql`, so on arrow both engines are made to lose it. The batch must then publish nothing,
dead-letter nothing and leave no file, say why at error level with the counts, and its next
batch, without the fault, must land every record once. And a batch only the arrow engine
miscounts lands through `spark-sql`, its dead letters sent once, and the next batch is arrow's.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from icekeeper.common.config import IcekeeperConfig
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from icekeeper.writers.arrow_engine import task as arrow_task
from icekeeper.writers.arrow_engine.arrow_batch import ArrowEngine
from icekeeper.writers.dead_letters import REASON_HEADER, SOURCE_OFFSET_HEADER
from icekeeper.writers.job import WriterJob
from icekeeper.writers.reconciliation import TOMBSTONE, BatchUnreconciled
from icekeeper.writers.spark_sql_engine import table_writer
from icekeeper.writers.spark_sql_engine.rejected_records import (
    DeadLetterPass,
    RejectedRecords,
)
from tests.support.pipeline import (
    commit_all,
    pipeline_config,
    table_rows,
    topic_values_with_headers,
)
from tests.writers.test_registry_outage import _dead_letters

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TABLE = "shop.orders"
ENGINES = ["arrow", "spark-sql"]
SPEC = SyntheticSpec(seed=26, keys=20, events=40, schema_changes=0, poison_ratio=0.1)


def _config(tmp_path: Path, topic: str, engine: str) -> IcekeeperConfig:
    return pipeline_config(
        tmp_path,
        topic,
        {
            "ICEKEEPER__WRITER__ENGINE": engine,
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": topic + ".dlq",
            "ICEKEEPER__TABLES__0__IDENTIFIER": TABLE,
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
        },
    )


def _fails_loudly_then_lands(
    config: IcekeeperConfig,
    spark,
    tmp_path: Path,
    produced: dict,
    caplog: pytest.LogCaptureFixture,
    undo,
    problem: str,
) -> None:
    """`problem`: a pattern of the reason given."""
    job = WriterJob(config, spark=spark)
    with caplog.at_level(logging.ERROR, logger="icekeeper.writers.source_batch"):
        with pytest.raises(BatchUnreconciled) as raised:
            job.run_batch()
    assert re.search(problem, str(raised.value))
    [logged] = [r for r in caplog.records if "batch does not reconcile" in r.getMessage()]
    assert logged.records_read == produced["records"]
    assert re.search(problem, " ".join(logged.problems))
    # Nothing published, nothing dead-lettered, no file left, no progress.
    assert job.transport.pending(writer_id=None) == []
    assert _dead_letters(config) == 0
    assert not list((tmp_path / "warehouse").rglob("*.parquet"))
    assert job.checkpoints.read(config.sources[0]) == {}

    undo()
    report = job.run_batch()  # the same writer's next batch: the same records, once
    assert report.records_read == produced["records"]
    assert report.dead_lettered == sum(produced["poison"].values())
    rows = table_rows(commit_all(config), TABLE)
    assert len(rows) == report.rows_written == SPEC.events
    assert len(rows) + _dead_letters(config) == produced["records"]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_record_failed_while_writing_but_not_dead_lettered_fails_the_batch(
    local_stack,
    spark,
    tmp_path: Path,
    unique_topic: str,
    engine: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = _config(tmp_path, unique_topic, engine)
    produced = produce_synthetic(
        config, SPEC, topic=unique_topic, partitions=1, progress=lambda m: None
    )
    assert sum(produced["poison"].values()) >= 2
    original = DeadLetterPass.rejected

    def accepting_one(self, *args):
        # The dead-letter pass decodes one poison record the writing pass failed.
        rejected = original(self, *args)
        dead = rejected.frame
        first = dead.agg(F.min("offset")).collect()[0][0]
        rejected.release()
        return RejectedRecords(dead.where(F.col("offset") != first))

    monkeypatch.setattr(DeadLetterPass, "rejected", accepting_one)
    _fails_loudly_then_lands(
        config,
        spark,
        tmp_path,
        produced,
        caplog,
        monkeypatch.undo,
        "while writing, but the dead-letter pass found",
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_a_record_a_table_leaves_out_fails_the_batch(
    local_stack,
    spark,
    tmp_path: Path,
    unique_topic: str,
    engine: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = _config(tmp_path, unique_topic, engine)
    produced = produce_synthetic(
        config, SPEC, topic=unique_topic, partitions=1, progress=lambda m: None
    )
    if engine == "arrow":
        original = arrow_task._write_table

        def one_short(table, task, pieces, facts):
            # The task writes the table's rows but the last one.
            if pieces:
                last = pieces[-1]
                kept = last.rows.num_rows - 1
                pieces = [
                    *pieces[:-1],
                    replace(
                        last,
                        rows=last.rows.slice(0, kept),
                        event_ms=last.event_ms.slice(0, kept),
                        offsets=last.offsets.slice(0, kept),
                    ),
                ]
            original(table, task, pieces, facts)

        monkeypatch.setattr(arrow_task, "_write_table", one_short)
    # The table's write keeps the rows at or after its start, and here also drops offset 0 (on
    # arrow: when `spark-sql` writes the batch again, the problem it reports).
    monkeypatch.setattr(table_writer, "at_or_after_sql", lambda starts: "_ik_offset != 0")
    _fails_loudly_then_lands(
        config,
        spark,
        tmp_path,
        produced,
        caplog,
        monkeypatch.undo,
        # The record at offset 0 (on arrow, `spark-sql`'s write of the batch reports it).
        rf"table {TABLE} took 39 records and has 0 before its start, but route {TABLE} "
        rf"accepted {SPEC.events}",
    )


MISCOUNTED = "invalid-utf8"
"""The reason the arrow engine's tasks give one poison record in `test_a_batch_...by_arrow`."""


def test_a_batch_the_arrow_engine_miscounts_is_written_by_spark_sql_and_the_next_by_arrow(
    local_stack,
    spark,
    tmp_path: Path,
    unique_topic: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 27, F2: the engines disagreeing on poison, arrow's tasks count one poison record
    under another reason than the dead-letter pass (`spark-sql`) finds. The writer used to try
    the batch on arrow five times and stop, on every restart. Now its arrow files are discarded
    and the batch is written on `spark-sql`, its dead letters sent once with their reasons, and
    the writer's next batch runs on arrow again."""
    config = _config(tmp_path, unique_topic, "arrow")
    source = config.sources[0]
    produced = produce_synthetic(
        config, SPEC, topic=unique_topic, partitions=1, progress=lambda m: None
    )
    assert sum(produced["poison"].values()) >= 2
    original = ArrowEngine._run

    def miscounting(self, *args, **kwargs):
        facts = original(self, *args, **kwargs)
        poison = sorted(reason for reason, n in facts.errors.items() if n and reason != TOMBSTONE)
        if poison:
            facts.errors[poison[0]] -= 1
            facts.errors[MISCOUNTED] += 1
        return facts

    monkeypatch.setattr(ArrowEngine, "_run", miscounting)
    job = WriterJob(config, spark=spark)
    with caplog.at_level(logging.WARNING, logger="icekeeper.writers.source_batch"):
        [first] = job.run(until_idle=True)
        clean = SyntheticSpec(seed=27, keys=20, events=10, schema_changes=0)
        produce_synthetic(config, clean, topic=unique_topic, partitions=1, progress=lambda m: None)
        [second] = job.run(until_idle=True)

    poison = sum(produced["poison"].values())
    assert (first.records_read, first.rows_written, first.dead_lettered) == (
        produced["records"],
        SPEC.events,
        poison,
    )
    assert MISCOUNTED not in first.errors
    assert (second.records_read, second.rows_written, second.dead_lettered) == (10, 10, 0)
    # Counted as a fallback, logged once with the problem, never as a failed batch.
    fallbacks = {
        sample.labels["reason"]: sample.value
        for metric in job.metrics.registry.collect()
        if metric.name == "icekeeper_writer_engine_fallbacks"
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels["source"] == source.name
    }
    assert fallbacks == {"unreconciled": 1.0}
    [logged] = [r for r in caplog.records if getattr(r, "kind", None) == "unreconciled"]
    assert logged.seq == first.seq
    assert any(MISCOUNTED in problem for problem in logged.problems)
    assert not [r for r in caplog.records if "batch does not reconcile" in r.getMessage()]

    # The table has every good record once; the first batch's files are `spark-sql`'s (Spark's
    # names end in c000.zstd.parquet), the second's arrow's, and no file of the discarded
    # arrow attempt is left, let alone named by a moniker.
    bookkeeper = commit_all(config)
    assert len(table_rows(bookkeeper, TABLE)) == SPEC.events + clean.events
    files = [
        entry["file_path"]
        for entry in bookkeeper.catalog.load_table(TABLE).inspect.files().to_pylist()
        if entry["content"] == 0
    ]
    assert {
        (
            int(path.split("/data/")[1].split("/")[1].split("-")[0]),
            path.endswith("c000.zstd.parquet"),
        )
        for path in files
    } == {(first.seq, True), (second.seq, False)}
    on_disk = {path.name for path in (tmp_path / "warehouse").rglob("*.parquet")}
    assert on_disk == {path.rsplit("/", 1)[1] for path in files}

    # Each poison record dead-lettered once, with the reason `spark-sql` gives it.
    letters = topic_values_with_headers(config, source.dead_letter_topic)
    reasons = Counter(headers[REASON_HEADER] for _, headers in letters)
    assert reasons == Counter(first.errors) and sum(reasons.values()) == poison
    assert MISCOUNTED not in reasons
    offsets = [headers[SOURCE_OFFSET_HEADER] for _, headers in letters]
    assert len(set(offsets)) == len(offsets) == poison

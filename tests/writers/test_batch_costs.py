"""What a batch costs beyond its records, counted rather than timed (a loaded machine's wall
clock hides a few hundred milliseconds; counts do not): its Spark jobs, and its syncs to disk.

Issue 27's bench pairs found the arrow engine slower after the writer core by 0.26-1.4 s a run of
two batches; a profile of runs on old and new code, same data, showed the same Spark jobs and
fewer catalog loads, and the syncs of whole writes on local folders (added since) as the driver's
difference: each is a journal commit, which on a busy disk waits for every other process's
writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from icekeeper.writers.job import WriterJob
from tests.support.fsyncs import record_fsyncs
from tests.support.recreated_topic import produce, topic_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_a_batch_syncs_only_what_a_restart_reads_and_runs_one_spark_job(
    local_stack, spark, tmp_path: Path, unique_topic: str, monkeypatch
) -> None:
    """Per batch: one Spark job (the tasks; no counting pass once the table's versions are
    guessed), and the syncs a restart needs: the moniker and the checkpoint, each file then its
    folder, and the data files the moniker names with their folders. The
    claim on the batch folder is not synced: it protects the folder while the writer lives, and a
    power cut ends the writer and its batch alike."""
    config = topic_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__WRITER__ENGINE": "arrow",
            "ICEKEEPER__WRITER__DRIVER_BATCH_RECORDS": "0",  # a Spark job, as large batches run
            "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": "300",
        },
    )
    produce(config, unique_topic, seed=27, events=600)
    job = WriterJob(config, spark=spark)
    synced = record_fsyncs(monkeypatch)
    tracker = spark.sparkContext.statusTracker()
    jobs_before = len(tracker.getJobIdsForGroup())

    reports = job.run(until_idle=True)

    batches = len(reports)
    assert batches == 2 and sum(r.rows_written for r in reports) == 600
    assert len(tracker.getJobIdsForGroup()) - jobs_before == batches
    claims = [path for path in synced if "_in_flight" in path]
    assert claims == [], "a claim on a batch folder was synced to disk"
    transport = str(config.transport.uri)
    checkpoints = str(config.writer.checkpoint_uri)
    assert sum(path.startswith(transport) for path in synced) == 2 * batches, synced
    assert sum(path.startswith(checkpoints) for path in synced) == 2 * batches, synced
    # Beyond those: the batch's data files and the folders naming them (synced before the
    # moniker: `storage.sync_written`), nothing else.
    data_files = {path for path in synced if path.endswith(".parquet")}
    assert data_files and all("/data/" in path for path in data_files), sorted(set(synced))
    others = [
        path
        for path in synced
        if not path.startswith((transport, checkpoints)) and path not in data_files
    ]
    assert all(
        any(file.startswith(path.rstrip("/") + "/") for file in data_files) for path in others
    ), others

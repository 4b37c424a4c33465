"""`icekeeper status` against a real pipeline: pending work, writer lag, commits, dead letters."""

from __future__ import annotations

from pathlib import Path

import pytest

from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from icekeeper.status import collect_status, render_status
from icekeeper.writers.job import WriterJob
from tests.support.pipeline import commit_all, pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_status_shows_pending_work_lag_freshness_and_dead_letters(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": "600",
            "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": unique_topic + ".dlq",
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
        },
    )
    spec = SyntheticSpec(seed=3, keys=50, events=2000, schema_changes=0, poison_ratio=0.01)
    produced = produce_synthetic(
        config, spec, topic=unique_topic, partitions=3, progress=lambda m: None
    )
    first = WriterJob(config, spark=spark).run(max_batches=2)

    before = collect_status(config)
    [table] = before.tables
    assert table["exists"] is False and table["pending_monikers"] == 2
    assert table["pending_records"] == sum(r.rows_written for r in first)
    [writer] = before.writers
    assert writer["last_moniker"]["state"] == "pending" and writer["pending_monikers"] == 2
    assert writer["lag"] == produced["records"] - sum(r.records_read for r in first) > 0
    assert sum(p["end"] for p in writer["partitions"]) == produced["records"]

    commit_all(config)
    WriterJob(config, spark=spark).run(until_idle=True)
    commit_all(config)
    after = collect_status(config)
    [table] = after.tables
    poison = sum(produced["poison"].values())
    assert table["rows"] == produced["records"] - poison and table["pending_monikers"] == 0
    assert table["last_commit_age_s"] < 120 and table["freshness_s"] is not None
    [writer] = after.writers
    assert writer["lag"] == 0 and writer["last_moniker"]["state"] == "committed"
    assert (
        after.dead_letters[f"topic {unique_topic}.dlq"] == poison
        and after.dead_letters["monikers"] == 0
    )
    screen = render_status(after)
    assert "shop.orders" in screen and "lag 0" in screen and not after.problems

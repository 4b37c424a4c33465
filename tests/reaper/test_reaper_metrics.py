"""What Prometheus and a Kubernetes probe see of a reaper running on its schedule: `/metrics` counts
exactly what the reaper's JSON-lines report says its passes did, and `/healthz` and `/readyz`
answer while it runs and stop answering once it stops."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from icekeeper.bench.reaper import age_files
from icekeeper.reaper.service import Reaper
from tests.support.http_get import free_port, get
from tests.support.shop_items import SCHEMA, reaper_config, write_file
from tests.support.small_files import small_file_table
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TABLE = "shop.items"


def scrape(port: int) -> dict[str, float]:
    """Every sample of `/metrics`: `name{labels}` -> value."""
    status, body = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    samples = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def report_lines(path: str) -> list[dict]:
    file = Path(path)
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


def test_a_scheduled_reaper_serves_metrics_that_match_its_pass_reports(
    spark, tmp_path: Path
) -> None:
    port = free_port()
    config = reaper_config(tmp_path, reaper__http_port=str(port))
    table = small_file_table(spark, config, files=12)
    orphan = write_file(
        Path(table.location().removeprefix("file://")) / "data" / "crashed-writer" / "f.parquet",
        SCHEMA,
        [{"id": 1}],
    )
    age_files([orphan.path], 3600)

    reaper = Reaper(config, spark=spark)
    runner = threading.Thread(target=reaper.run, kwargs={"every_s": 1.0})
    runner.start()
    try:
        wait_until(lambda: get(f"http://127.0.0.1:{port}/healthz")[0] == 200, 30, "/healthz")
        wait_until(lambda: len(report_lines(config.reaper.report_path)) >= 2, 600, "two passes")

        def consistent() -> tuple[list[dict], dict[str, float]] | None:
            """The report and a scrape taken while no pass ended in between (the metrics count a
            pass just after its line is written)."""
            before = report_lines(config.reaper.report_path)
            samples = scrape(port)
            after = report_lines(config.reaper.report_path)
            passes = sum(
                v for k, v in samples.items() if k.startswith("icekeeper_reaper_passes_total{")
            )
            return (after, samples) if before == after and passes == len(after) else None

        lines, samples = wait_until(consistent, 120, "a scrape between two passes")
        status, ready = get(f"http://127.0.0.1:{port}/readyz")
        status_live, live = get(f"http://127.0.0.1:{port}/healthz")
    finally:
        reaper.stop.set()
        runner.join(timeout=120)
    assert not runner.is_alive()

    # The work was real: the first pass compacted the small files, expired their snapshots and
    # removed the orphan.
    assert lines[0]["files_compacted"] >= 12 and lines[0]["snapshots_expired"] >= 10
    assert lines[0]["orphans_removed"] >= 1 and not Path(orphan.path).exists()
    label = f'{{table="{TABLE}"}}'
    for metric, key in [
        ("files_compacted", "files_compacted"),
        ("files_added", "files_added"),
        ("snapshots_expired", "snapshots_expired"),
        ("orphans_removed", "orphans_removed"),
        ("files_deleted", "files_deleted"),
        ("deleted_bytes", "bytes_deleted"),
        ("retention_rows_deleted", "retention_rows_deleted"),
    ]:
        assert samples[f"icekeeper_reaper_{metric}_total{label}"] == sum(
            line[key] for line in lines
        ), metric
    for step in ("retention", "compaction", "manifests", "expiry", "orphans"):
        failed = sum(
            error.startswith(step + ":")
            for line in lines
            for table_report in line["tables"]
            for error in table_report["errors"]
        )
        # prometheus_client writes labels in name order
        failures = f'icekeeper_reaper_step_failures_total{{step="{step}",table="{TABLE}"}}'
        assert samples[failures] == failed, step
    assert samples['icekeeper_reaper_passes_total{outcome="ok"}'] == len(lines)
    assert samples["icekeeper_reaper_pass_duration_seconds_count"] == len(lines)
    assert samples["icekeeper_reaper_pass_duration_seconds_sum"] == pytest.approx(
        sum(line["seconds"] for line in lines), abs=0.001 * len(lines)
    )
    assert samples["icekeeper_reaper_last_pass_timestamp_seconds"] > 0

    assert status == 200 and json.loads(ready)["ok"] is True
    assert status_live == 200 and json.loads(live)["state"] in ("waiting", "passing")
    # Stopped: the port is closed, as a liveness probe must see.
    assert get(f"http://127.0.0.1:{port}/healthz")[0] == 0

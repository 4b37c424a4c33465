"""The reaper's schedule and filters as seed 000's `iceberg.maintenance.*` keys define them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from pyiceberg.schema import Schema
from pyiceberg.types import DateType, LongType, NestedField, StringType, TimestamptzType

from icekeeper.common.config import load_config
from icekeeper.reaper.maintenance import time_filter
from icekeeper.reaper.service import Reaper

REPO_ROOT = Path(__file__).resolve().parents[2]
SEED = REPO_ROOT / "examples" / "seed000.properties"


class _Table:
    """Just the schema a filter is typed by (a whole table is not needed to build SQL text)."""

    def __init__(self, schema: Schema) -> None:
        self._schema = schema

    def schema(self) -> Schema:
        return self._schema


def test_time_filters_follow_the_column_type() -> None:
    table = _Table(
        Schema(
            NestedField(1, "_src_ts_ms", LongType()),
            NestedField(2, "ts", TimestamptzType()),
            NestedField(3, "day", DateType()),
            NestedField(4, "name", StringType()),
        )
    )
    low, high = (
        datetime(2026, 11, 20, tzinfo=UTC),
        datetime(2026, 11, 21, tzinfo=UTC),
    )
    assert (
        time_filter(table, "_src_ts_ms", low, high)
        == "_src_ts_ms >= 1795132800000 AND _src_ts_ms < 1795219200000"
    )
    assert time_filter(table, "ts", upper=high) == "ts < TIMESTAMP '2026-11-21 00:00:00'"
    assert time_filter(table, "day", lower=low) == "day >= DATE '2026-11-20'"
    try:
        time_filter(table, "name", upper=high)
    except ValueError as error:
        assert "name is string" in str(error)
    else:
        raise AssertionError("a string column cannot be a time filter")


def test_first_pass_waits_for_the_triggering_time(tmp_path: Path) -> None:
    config = load_config(
        SEED, environ={"ICEKEEPER__STATE_DIR": str(tmp_path)}
    )  # triggering.time = 21:00:11
    evening = Reaper(
        config, clock=lambda: datetime(2026, 11, 22, 20, 0, tzinfo=UTC)
    )._first_run_at()
    night = Reaper(config, clock=lambda: datetime(2026, 11, 22, 22, 0, tzinfo=UTC))._first_run_at()
    assert evening == datetime(2026, 11, 22, 21, 0, 11, tzinfo=UTC)
    assert night == datetime(2026, 11, 23, 21, 0, 11, tzinfo=UTC)


def test_reaper_once_with_the_seed_properties_reports_a_json_line(tmp_path: Path) -> None:
    environ = {**os.environ, "ICEKEEPER__STATE_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "icekeeper.cli", "reaper", "--once", "--config", str(SEED)],
        capture_output=True,
        text=True,
        env=environ,
        cwd=REPO_ROOT,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["tables"] == [] and report["skipped"] == [
        "db_gb18030_test.tbl_test_1: no such table yet"
    ]
    assert (
        json.loads((tmp_path / "reports" / "reaper.jsonl").read_text().splitlines()[-1])["skipped"]
        == report["skipped"]
    )

"""A quick chaos run in the default tests: kill -9 writers, bookkeeper and reaper at random while
records arrive, pause a bookkeeper while a second takes over; every good record must be in the
table exactly once and every poison record in the dead-letter topic. The README documents a
long run (1M records, 50 kills) with `icekeeper chaos`."""

from __future__ import annotations

from pathlib import Path

import pytest

from icekeeper.chaos import run_chaos

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_quick_chaos_keeps_exactly_once(local_stack, stack_config, tmp_path: Path) -> None:
    base = stack_config.model_copy(update={"state_dir": str(tmp_path)})
    result = run_chaos(base, records=2000, kills=3, seed=2, progress=print, timeout_s=600)
    assert result["kills"] == 3 and result["fenced_exit_code"] == 3, result
    assert result["duplicates"] == 0 and result["missing"] == 0, result
    assert result["dead_lettered"] == result["poison_expected"] > 0 and result["poison_in_table"] == 0
    assert result["rows"] + result["dead_lettered"] == result["records_in"]
    assert result["spark_rows"] == result["duckdb_rows"] == result["rows"]

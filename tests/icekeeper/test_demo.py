"""The README's first command, `icekeeper demo --json`, as a new user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, TEST_STACK_PORTS, stack_environ

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_demo_commits_the_seed_sample_and_other_engines_read_it(tmp_path: Path) -> None:
    # Ports of its own: the demo starts (and stops) a stack of its own beside the session's.
    ports = {name: port + 700 for name, port in TEST_STACK_PORTS.items()}
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("ICEKEEPER__")}
    environ = {**inherited, **stack_environ(tmp_path, ports)}
    result = subprocess.run([sys.executable, "-m", "icekeeper.cli", "demo", "--json"], cwd=REPO_ROOT, env=environ,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["records_produced"] == 26
    assert summary["rows_committed"] + summary["dead_lettered"] == summary["records_produced"]
    assert summary["spark_rows"] == summary["duckdb_rows"] == summary["rows_committed"] == 26
    assert summary["snapshots"] >= 1 and summary["seconds"] > 0
    assert summary["reaper_files_compacted"] >= 2  # the writer leaves a file per batch and partition
    assert "|_src_name|_src_db" in result.stdout and "1646392418000" in result.stdout

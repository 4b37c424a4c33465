"""The README's first command, `icekeeper demo --json`, as a new user runs it; and
`--source mariadb`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from icekeeper import cli
from icekeeper.common.config import load_config
from icekeeper.demo_mariadb import expected_records
from icekeeper.localstack.debian import MARIADB_SERVER, missing_packages_message
from icekeeper.localstack.stack import StackError
from tests.support.stack import REPO_ROOT, TEST_STACK_PORTS, TEST_STACK_STATE_DIR, stack_environ


@pytest.mark.integration
@pytest.mark.spark
def test_demo_commits_the_seed_sample_and_other_engines_read_it(tmp_path: Path) -> None:
    # Ports of its own: the demo starts (and stops) a stack of its own beside the session's.
    ports = {name: port + 700 for name, port in TEST_STACK_PORTS.items()}
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("ICEKEEPER__")}
    environ = {**inherited, **stack_environ(tmp_path, ports)}
    result = subprocess.run(
        [sys.executable, "-m", "icekeeper.cli", "demo", "--json"],
        cwd=REPO_ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert (
        summary["records_produced"] == summary["records_read"] == 26
        and summary["dead_lettered"] == 0
    )
    # Seed 000's primary-key table is a mirror: the
    # article's five rows, one per key, in every engine.
    assert summary["spark_rows"] == summary["duckdb_rows"] == summary["rows_committed"] == 5
    assert summary["snapshots"] >= 1 and summary["seconds"] > 0
    # The reaper's pass compacts the writer's two small files while the bookkeeper runs, which
    # commits the compaction: in seconds, not after `reaper.rewrite_wait` (300 s) for a bookkeeper
    # that is not running, as it once waited.
    assert summary["reaper_files_compacted"] == 2, summary
    assert summary["reaper_seconds"] < 120, summary
    assert "bookkeeper: committed the reaper's compaction of db_gb18030_test.tbl_test_1" in (
        result.stdout
    )
    assert " replace " in result.stdout  # the snapshots listed: the compaction's
    assert "|_src_name|_src_db" in result.stdout and "1646392418000" in result.stdout
    # Spark's own routine warnings (a loopback hostname, no native-hadoop library, a truncated
    # plan) stay out of a newcomer's first screen: `spark.log_level` is error by default. Fails
    # without it: four such lines.
    spark_warnings = re.findall(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d WARN .*$", result.stderr, re.M)
    assert not spark_warnings, spark_warnings


@pytest.mark.integration
@pytest.mark.spark
def test_mariadb_demo_mirrors_select_star_and_its_figures_reconcile() -> None:
    # Ports of its own, as above; the state folder is not under tmp_path because as root MariaDB
    # runs as `mysql`, which must reach its data folder (pytest's tmp folders are private).
    ports = {name: port + 800 for name, port in TEST_STACK_PORTS.items()}
    state_dir = TEST_STACK_STATE_DIR.with_name(f"{TEST_STACK_STATE_DIR.name}-demo-mariadb")
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("ICEKEEPER__")}
    environ = {**inherited, **stack_environ(state_dir, ports)}
    try:
        result = subprocess.run(
            [sys.executable, "-m", "icekeeper.cli", "demo", "--source", "mariadb", "--json"],
            cwd=REPO_ROOT,
            env=environ,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
    finally:
        _stop_demo_stack(stack_environ(state_dir, ports))
        shutil.rmtree(state_dir, ignore_errors=True)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["equal"] is True and summary["differences"] == [], summary["differences"]
    assert any(line.startswith("verdict: EQUAL:") for line in lines)
    # Records Debezium wrote, as the statements' affected
    # rows predict, are rows or skipped tombstones.
    assert summary["records"] == summary["expected_records"] == 15
    assert (
        summary["records"]
        == summary["rows_committed"] + summary["tombstones_skipped"] + summary["dead_lettered"]
    )
    assert summary["dead_lettered"] == 0 and summary["tombstones_skipped"] == 1  # the one DELETE
    assert (
        summary["rows"]
        == summary["rows_committed"]
        == summary["spark_rows"]
        == summary["duckdb_rows"]
        == 14
    )
    assert summary["mariadb_rows"] == summary["live_keys"] == 7 and summary["statements"] == 11
    assert (
        summary["snapshots"] >= 3 and summary["seconds"] > 0
    )  # the snapshot, then each round of statements
    # MariaDB's rows beside the table's: every live key once per side, the deleted key on neither.
    grid = [line for line in lines if line.startswith("|")]
    for key in (1, 2, 3, 5, 6, 7, 8):
        assert any(line.startswith(f"|{key} |MariaDB|") for line in grid), key
        assert any(line.startswith(f"|{key} |Iceberg|same") for line in grid), key
    assert not any(line.startswith("|4 |") for line in grid)
    assert any(
        "|MariaDB|" in line and "王芳（已核实）" in line and "19:30:00" in line for line in grid
    )
    assert any("|MariaDB|" in line and "refunded" in line and "|0.00 " in line for line in grid)
    assert any(line.startswith("|updated_at|timestamp    |timestamptz") for line in grid)
    assert (
        "Spark SQL (iceberg-spark-runtime) on catalog icekeeper: 14 changelog rows -> 7 live keys, "
        "equal to MariaDB" in result.stdout
    )
    assert (
        "DuckDB iceberg_scan: 14 changelog rows -> 7 live keys, equal to MariaDB" in result.stdout
    )
    assert "deleted connector icekeeper-demo" in result.stdout


def _stop_demo_stack(environ: dict[str, str]) -> None:
    """Whatever the demo left running if it was killed
    (timeout): its own stack, never the session's."""
    from icekeeper.demo import demo_config
    from icekeeper.localstack.stack import LocalStack, started_optional_services

    config = demo_config(load_config(None, environ=environ))
    LocalStack(config, with_services=started_optional_services(config)).down(
        progress=lambda message: None
    )


def test_mariadb_demo_without_the_package_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_mariadb(*args: object, **kwargs: object) -> None:
        raise StackError(missing_packages_message([MARIADB_SERVER], "stack service mariadb"))

    monkeypatch.setattr("icekeeper.demo_mariadb.run_mariadb_demo", no_mariadb)
    assert cli.main(["demo", "--source", "mariadb"]) == 2
    captured = capsys.readouterr()
    assert (
        captured.err.count("\n") == 1 and "sudo apt-get install -y mariadb-server" in captured.err
    )
    assert captured.err.startswith(
        "icekeeper demo --source mariadb: stack service mariadb needs the Debian package(s) "
        "mariadb-server"
    )


def test_records_a_statement_makes_debezium_write() -> None:
    assert expected_records("INSERT INTO t VALUES (1), (2)", 2) == 2
    assert expected_records("update t SET a = 1", 3) == 3
    assert expected_records("DELETE FROM t WHERE id = 4", 1) == 2  # the change and its tombstone
    assert expected_records("ALTER TABLE t ADD COLUMN c INT", 0) == 0

"""A service started on a config that gives it nothing to do stops at once and says what to add.

The model lists no source and no table by default (common/config/required.py); these run the
commands a user would, on the embedded defaults or a small file, and read the one-line error.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.cli import main
from icekeeper.common.config import load_config


@pytest.fixture
def no_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The embedded defaults in a state folder of the test's own (no file, no overrides)."""
    monkeypatch.delenv("ICEKEEPER_CONFIG", raising=False)
    for name in [name for name in os.environ if name.startswith("ICEKEEPER__")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ICEKEEPER__STATE_DIR", str(tmp_path))
    return tmp_path


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_a_writer_with_no_source_says_to_add_one(
    no_config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    error = _error(capsys, ["writer", "--once"])
    assert error.startswith("config error in <embedded defaults>: sources: no source is listed")
    assert "the writer reads change data from them: add one, e.g. `sources: [{" in error
    assert not (no_config_file / "catalog.db").exists()  # stopped before opening anything


def test_a_writer_with_a_source_that_names_no_topic_says_which_key(
    no_config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = no_config_file / "c.yaml"
    path.write_text("sources: [{name: prod}]\n", encoding="utf-8")
    error = _error(capsys, ["writer", "--once", "--config", str(path)])
    assert f"config error in {path}: sources[0].topics: source 'prod' reads no topic" in error


def test_a_writer_with_no_table_says_to_add_one_or_a_table_template(
    no_config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = no_config_file / "c.yaml"
    path.write_text("sources: [{topics: [orders]}]\n", encoding="utf-8")
    error = _error(capsys, ["writer", "--once", "--config", str(path)])
    assert f"config error in {path}: tables: no table is listed and no source has a " in error
    assert "the writer routes records to them: add one, e.g. `tables: [{identifier:" in error


def test_a_bookkeeper_and_a_reaper_with_no_table_say_to_add_one(
    no_config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    error = _error(capsys, ["bookkeeper", "--once"])
    assert error.startswith("config error in <embedded defaults>: tables: no table is listed")
    assert "the bookkeeper commits to them: add one, e.g. `tables: [{" in error
    error = _error(capsys, ["reaper", "--once"])
    assert error.startswith("config error in <embedded defaults>: tables: no table is listed, ")
    assert "the reaper maintains them: add one" in error


def test_a_bookkeeper_of_templated_tables_needs_no_table_list(no_config_file: Path) -> None:
    path = no_config_file / "c.yaml"
    path.write_text("sources: [{topics: [orders], table_template: 'cdc.{table}'}]\n")
    report = Bookkeeper(load_config(path)).run_cycle()
    assert report.pending == 0 and report.committed_monikers == 0

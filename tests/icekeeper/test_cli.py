"""The command line as a user meets it (issue 29, item 4): `--version`, the log level from
anywhere, `config check` finding what the roles would stop for, one-line errors with exit 2, a
`status` that says in one line that Kafka is down, and one table of exit codes.

Each runs the command as a user would (a subprocess where the output's shape matters, `main` where
only the code and the level do) and reads what a user reads.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from icekeeper.cli import main
from icekeeper.common import exit_codes
from icekeeper.common.artifacts import download
from icekeeper.common.logs import PROGRESS_LOGGER, configure_logging
from tests.support.stack import REPO_ROOT

CLOSED_PORT = "127.0.0.1:9"
"""The discard port: nothing listens there, so a client is refused at once."""


@pytest.fixture(autouse=True)
def logging_restored() -> Iterator[None]:
    """`main` and `configure_logging` set the root logger's level and handler, and the library
    loggers' levels: put them back, so that the tests after these see logging as they expect."""
    names = ["", PROGRESS_LOGGER, "librdkafka", "py4j", "azure", "urllib3", "pyiceberg", "botocore"]
    names += ["s3fs", "fsspec"]
    levels = {name: logging.getLogger(name).level for name in names}
    handlers = list(logging.getLogger().handlers)
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    logging.getLogger().handlers[:] = handlers


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No config file, no overrides, a state folder of the test's own."""
    monkeypatch.delenv("ICEKEEPER_CONFIG", raising=False)
    for name in [name for name in os.environ if name.startswith("ICEKEEPER__")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ICEKEEPER__STATE_DIR", str(tmp_path / "state"))
    return tmp_path


def icekeeper(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`icekeeper <argv>` in a process of its own, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "icekeeper.cli", *argv],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        timeout=240,
    )


def write_config(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def unreachable_kafka_config(folder: Path) -> Path:
    """A complete config whose Kafka and registry refuse connections."""
    return write_config(
        folder,
        "down.yaml",
        f"state_dir: {folder / 'state'}\n"
        f"sources: [{{name: prod, bootstrap_servers: '{CLOSED_PORT}', "
        f"schema_registry_url: 'http://{CLOSED_PORT}', topics: [cdc.shop.orders]}}]\n"
        "tables: [{identifier: shop.orders, topics: [cdc.shop.orders], source: prod}]\n",
    )


# -- --version and the log level -------------------------------------------------------------------


def test_version_names_icekeeper_and_its_spark() -> None:
    shown = icekeeper("--version", env={"COLUMNS": "40"})  # a narrow terminal: still one line
    assert shown.returncode == 0, shown.stderr
    assert len(shown.stdout.splitlines()) == 1, shown.stdout
    assert re.match(r"icekeeper \d+\.\d+", shown.stdout), shown.stdout
    assert "pyspark 4.1" in shown.stdout


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        (["-v", "config", "docs"], {}, logging.INFO),
        (["config", "docs", "-v"], {}, logging.INFO),  # after the command: was an error
        (["config", "docs", "-vv"], {}, logging.DEBUG),
        (["config", "docs", "--log-level", "ERROR"], {}, logging.ERROR),
        (["--log-level", "debug", "config", "docs"], {}, logging.DEBUG),
        (["config", "docs"], {"ICEKEEPER__LOG_LEVEL": "info"}, logging.INFO),
        (["config", "docs", "--log-level", "error"], {"ICEKEEPER__LOG_LEVEL": "info"}, 40),
        (["config", "docs"], {}, logging.WARNING),
    ],
)
def test_the_log_level_comes_from_v_anywhere_the_option_or_the_environment(
    clean_environ: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    environ: dict[str, str],
    expected: int,
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == exit_codes.OK
    capsys.readouterr()
    assert logging.getLogger().level == expected


def test_the_log_level_comes_from_the_config_file_unless_the_command_line_says(
    clean_environ: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(clean_environ, "quiet.yaml", "log_level: error\n")
    assert main(["config", "show", "-c", str(path)]) == exit_codes.OK
    assert logging.getLogger().level == logging.ERROR
    assert main(["config", "show", "-c", str(path), "-v"]) == exit_codes.OK
    assert logging.getLogger().level == logging.INFO
    capsys.readouterr()


def test_a_download_shows_progress_at_the_default_level(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fails without the progress logger: fetches logged at INFO, hidden by default."""
    source = write_config(tmp_path, "artifact.jar", "x" * 100_000)
    configure_logging(0, environ={})
    download(source.as_uri(), tmp_path / "cache" / "artifact.jar")
    shown = capsys.readouterr().err
    assert "artifact.jar" in shown and PROGRESS_LOGGER in shown
    configure_logging(0, "error", environ={})
    download(source.as_uri(), tmp_path / "cache" / "other.jar")
    assert "other.jar" not in capsys.readouterr().err  # --log-level error hides it


# -- config check ----------------------------------------------------------------------------------


def test_config_check_reports_every_error_at_once_and_the_key_meant(clean_environ: Path) -> None:
    """Fails without the change: only the first error, and no suggestion."""
    path = write_config(
        clean_environ,
        "typos.yaml",
        "tabels: []\nbookkeeper: {max_files_per_comit: 3}\nreaper: {every: 10m}\n",
    )
    checked = icekeeper("config", "check", "-c", str(path))
    assert checked.returncode == exit_codes.USAGE
    errors = checked.stderr.strip().splitlines()
    assert errors[-1] == f"3 errors in {path}"
    assert any("tabels: unknown key: did you mean `tables`?" in line for line in errors)
    assert any(
        "bookkeeper.max_files_per_comit: unknown key: did you mean `max_files_per_commit`?" in line
        for line in errors
    )
    assert any("reaper.every: unknown key" in line for line in errors)
    assert "Traceback" not in checked.stderr


def test_config_check_runs_the_roles_own_checks(clean_environ: Path) -> None:
    """A source without topics and no table: `config check` said `ok`, then every role stopped."""
    path = write_config(clean_environ, "empty.yaml", "sources: [{name: prod}]\n")
    checked = icekeeper("config", "check", "-c", str(path))
    assert checked.returncode == exit_codes.USAGE, checked.stdout
    assert "sources[0].topics: source 'prod' reads no topic" in checked.stderr
    assert "stops the writer, the bookkeeper and the reaper" in checked.stderr
    assert checked.stderr.strip().endswith(f"2 errors in {path}")
    writer = icekeeper("writer", "--once", "-c", str(path))
    assert writer.returncode == exit_codes.USAGE
    assert "sources[0].topics" in writer.stderr and "tables" in writer.stderr


def test_config_check_connect_says_what_does_not_answer(clean_environ: Path) -> None:
    checked = icekeeper(
        "config", "check", "--connect", "-c", str(unreachable_kafka_config(clean_environ))
    )
    assert checked.returncode == exit_codes.UNAVAILABLE, checked.stdout + checked.stderr
    assert f"unreachable: kafka {CLOSED_PORT}" in checked.stdout
    assert f"unreachable: registry http://{CLOSED_PORT}" in checked.stdout
    assert "catalog: icekeeper opened" in checked.stdout
    assert "shop.orders: not created yet" in checked.stdout


@pytest.mark.integration
def test_config_check_connect_opens_the_stack(local_stack, stack_config, tmp_path: Path) -> None:
    from tests.support.stack import TEST_STACK_PORTS, TEST_STACK_STATE_DIR, stack_environ

    path = write_config(
        tmp_path,
        "stack.yaml",
        "sources: [{topics: [cdc.shop.orders]}]\n"
        "tables: [{identifier: shop.orders, topics: [cdc.shop.orders]}]\n",
    )
    checked = icekeeper(
        "config",
        "check",
        "--connect",
        "-c",
        str(path),
        # The stack's services; catalog and monikers in a folder of this test's own.
        env={
            **stack_environ(TEST_STACK_STATE_DIR, TEST_STACK_PORTS),
            "ICEKEEPER__STATE_DIR": str(tmp_path),
        },
    )
    assert checked.returncode == exit_codes.OK, checked.stdout + checked.stderr
    assert "unreachable" not in checked.stdout
    assert "kafka " in checked.stdout and "registry " in checked.stdout
    assert checked.stdout.strip().splitlines()[-1].startswith("ok:")


# -- one-line errors, exit 2 -----------------------------------------------------------------------


def test_a_bad_duration_is_one_line_and_exit_2(clean_environ: Path) -> None:
    """Fails without the fix: `reaper --every 10x` ended in a traceback (exit 1)."""
    bad = icekeeper("reaper", "--every", "10x")
    assert bad.returncode == exit_codes.USAGE
    assert bad.stderr.strip().splitlines() == [
        "icekeeper reaper: argument --every: '10x' is not a duration: use seconds or a string "
        "like '500ms', '10s', '5m', '2h', '7d' (see `icekeeper reaper --help`)"
    ]


def test_an_unknown_dead_letter_name_is_one_line_and_exit_2(clean_environ: Path) -> None:
    """Fails without the fix: nothing was printed and the exit was 0."""
    path = unreachable_kafka_config(clean_environ)
    replay = icekeeper("dead-letters", "replay", "--name", "m-nope", "-c", str(path))
    assert replay.returncode == exit_codes.USAGE
    [line] = replay.stderr.strip().splitlines()
    assert "named m-nope: nothing replayed" in line


def test_an_unknown_stack_service_is_one_line_and_exit_2(clean_environ: Path) -> None:
    """Fails without the fix: exit 1, the code of a failure, for a typo that changed nothing."""
    unknown = icekeeper("stack", "status", "--only", "kafak")
    assert unknown.returncode == exit_codes.USAGE
    [line] = unknown.stderr.strip().splitlines()
    assert line.startswith("icekeeper stack: no such service(s) ['kafak']")


def test_status_with_kafka_down_says_so_in_one_line_and_exits_4(clean_environ: Path) -> None:
    """Fails without the fix: 194 librdkafka lines, 13 s, exit 0."""
    path = unreachable_kafka_config(clean_environ)
    started = time.monotonic()
    status = icekeeper("status", "-c", str(path))
    elapsed = time.monotonic() - started
    assert status.returncode == exit_codes.UNAVAILABLE, status.stderr
    [line] = status.stderr.strip().splitlines()
    assert line.startswith(f"icekeeper status: Kafka at {CLOSED_PORT} (source prod) did not answer")
    assert "shop.orders" in status.stdout  # what could be read is still shown
    # One wait for the broker (5 s), not one for each topic it was asked about; the rest is
    # Python and pyiceberg starting, 3 s on an idle machine, 30 s with a load average of 45.
    assert elapsed < 60, elapsed


# -- the exit codes --------------------------------------------------------------------------------


def test_the_exit_code_table_in_the_docs_is_the_codes_the_commands_use() -> None:
    operations = (REPO_ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = operations.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\d+)` \| ([^|]+) \|", section, flags=re.MULTILINE)
    assert [(int(code), name.strip()) for code, name in rows] == list(exit_codes.EXIT_CODES.items())
    cli = (REPO_ROOT / "icekeeper" / "cli.py").read_text(encoding="utf-8")
    # Every command returns a named code: a bare number would escape the table.
    assert not re.findall(r"return [0-9]+\b", cli)

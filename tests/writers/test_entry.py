"""`spark-submit writers/__main__.py` runs the writer without the `icekeeper` command package,
with the same arguments as `icekeeper writer`."""

from __future__ import annotations

import subprocess
import sys

from tests.support.stack import REPO_ROOT


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*argv], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, check=False
    )


def test_the_spark_submit_entry_point_takes_the_writer_arguments() -> None:
    script = run(sys.executable, str(REPO_ROOT / "writers" / "__main__.py"), "--spark-packages")
    command = run(sys.executable, "-m", "icekeeper.cli", "writer", "--spark-packages")
    assert script.returncode == 0 == command.returncode, script.stderr
    assert script.stdout == command.stdout and "spark-sql-kafka" in script.stdout
    bad = run(
        sys.executable,
        str(REPO_ROOT / "writers" / "__main__.py"),
        "--config",
        str(REPO_ROOT / "missing.yaml"),
    )
    assert bad.returncode == 2 and "missing.yaml" in bad.stderr
    assert "icekeeper.cli" not in (REPO_ROOT / "writers" / "__main__.py").read_text()

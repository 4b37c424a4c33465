"""Each role on its own minimal install (issue 29, item 1), in clean virtual environments.

The base install (`pip install icekeeper`) has no pyspark and runs the bookkeeper; the `spark`
extra runs the writer. One wheel of this checkout is built, installed twice, and the two
environments run a pipeline between them as a deployment would: the writer's environment writes
a batch from the test stack's Kafka, the bookkeeper's commits it. Sizes of both are printed (the
README's table; `-s` shows them).

Installing takes minutes (pip's cache makes reruns faster); the packages come from the index
`pip` is configured with, as `make` installs them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from icekeeper.common.catalog import open_catalog
from icekeeper.common.config import load_config
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec, synthetic_events
from tests.support.pipeline import pipeline_config
from tests.support.stack import REPO_ROOT, TEST_STACK_PORTS
from tests.test_readme_example import readme_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]

INSTALL_TIMEOUT_S = 1800


def run(*command: str | Path, **options) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(part) for part in command],
        check=False,
        capture_output=True,
        text=True,
        timeout=options.pop("timeout", INSTALL_TIMEOUT_S),
        **options,
    )
    assert done.returncode == 0, f"{' '.join(map(str, command))}:\n{done.stdout}\n{done.stderr}"
    return done


def size_mb(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) // 1_000_000


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout as the wheel `pip install icekeeper` would install."""
    folder = tmp_path_factory.mktemp("wheel")
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", folder, REPO_ROOT)
    [built] = folder.glob("icekeeper-*.whl")
    return built


def clean_install(folder: Path, requirement: str) -> Path:
    """A new virtual environment with `requirement` installed; its bin folder."""
    run(sys.executable, "-m", "venv", folder)
    run(folder / "bin" / "python", "-m", "pip", "install", "-q", requirement)
    return folder / "bin"


def test_the_base_install_runs_the_bookkeeper_and_the_spark_extra_the_writer(
    local_stack,
    wheel: Path,
    tmp_path: Path,
    unique_topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = clean_install(tmp_path / "base", str(wheel))
    spark = clean_install(tmp_path / "spark", f"icekeeper[spark] @ {wheel.as_uri()}")

    missing = subprocess.run(
        [base / "python", "-c", "import pyspark"], capture_output=True, check=False
    )
    assert missing.returncode != 0  # the bookkeeper's install has no Spark at all
    assert "no pyspark" in run(base / "icekeeper", "--version").stdout
    assert "pyspark 4.1" in run(spark / "icekeeper", "--version").stdout
    without = subprocess.run(
        [base / "icekeeper", "writer", "--once"], capture_output=True, text=True, check=False
    )
    assert without.returncode == 2
    assert "pip install 'icekeeper[spark]'" in without.stderr.strip().splitlines()[-1]
    sizes = {name: size_mb(tmp_path / name) for name in ("base", "spark")}
    print(f"clean virtual environments, MB (du of the venv): {sizes}")

    (tmp_path / "my.yaml").write_text(readme_config(), encoding="utf-8")
    environ = {name: value for name, value in os.environ.items() if "ICEKEEPER" not in name}
    environ.update(
        {
            "ICEKEEPER__SOURCES__0__BOOTSTRAP_SERVERS": (
                f"127.0.0.1:{TEST_STACK_PORTS['kafka_port']}"
            ),
            "ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_URL": (
                f"http://127.0.0.1:{TEST_STACK_PORTS['registry_port']}/apis/ccompat/v7"
            ),
            "ICEKEEPER__SOURCES__0__TOPICS": f"[{unique_topic}]",
            "ICEKEEPER__TABLES__0__TOPICS": f"[{unique_topic}]",
            "ICEKEEPER__CACHE_DIR": str(REPO_ROOT / ".cache"),
            "ICEKEEPER__SPARK__MASTER": "local[2]",
        }
    )
    spec = SyntheticSpec(seed=9, keys=40, events=200, schema_changes=0)
    produce_synthetic(
        pipeline_config(tmp_path / "producer", unique_topic),
        spec,
        topic=unique_topic,
        partitions=2,
        progress=lambda message: None,
    )
    options = {"cwd": tmp_path, "env": environ, "timeout": 900}
    run(spark / "icekeeper", "writer", "--until-idle", "-c", "my.yaml", **options)
    run(base / "icekeeper", "bookkeeper", "--once", "-c", "my.yaml", **options)

    monkeypatch.chdir(tmp_path)  # where the commands ran: `state_dir` is relative to it
    config = load_config("my.yaml", environ=environ)
    table = open_catalog(config).load_table("shop.orders")
    rows = table.scan().to_arrow().to_pylist()
    assert sorted(row["id"] for row in rows) == live_keys(spec)


def live_keys(spec: SyntheticSpec) -> list[int]:
    """The keys an upsert table of `spec`'s stream holds: those whose last change is no delete."""
    alive: dict[int, bool] = {}
    for event in synthetic_events(spec):
        if event.poison is None:
            alive[event.key["id"]] = event.op != "d"
    return sorted(key for key, live in alive.items() if live)

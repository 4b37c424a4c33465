"""The README's "Point it at your own Kafka" (issue 29, item 5), run as a newcomer would: its
`my.yaml` copied from the README as written, its commands run in order, the table read back.

Only what the README says to change is changed, and through the environment, as the README says
any key can be: the Kafka and registry addresses (the test stack's) and the topic (the test's
own). The cache folder points at the checkout's, so the jars are not fetched again.
"""

from __future__ import annotations

import os
import re
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

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def readme_config() -> str:
    """The YAML block of the README that starts with `# my.yaml`."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    [block] = re.findall(r"```yaml\n(# my\.yaml\n.*?)```", readme, flags=re.DOTALL)
    return block


def test_the_readme_config_works_as_written(
    local_stack, tmp_path: Path, unique_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
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
            "ICEKEEPER__SPARK__MASTER": "local[2]",  # the test machine's cores, not the README's
        }
    )
    spec = SyntheticSpec(seed=5, keys=30, events=300, schema_changes=1)
    produce_synthetic(
        pipeline_config(tmp_path / "producer", unique_topic),
        spec,
        topic=unique_topic,
        partitions=2,
        progress=lambda message: None,
    )

    def icekeeper(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "icekeeper.cli", *argv, "-c", "my.yaml"],
            check=False,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=environ,
            timeout=900,
        )
        assert done.returncode == 0, f"icekeeper {' '.join(argv)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    assert "unreachable" not in icekeeper("config", "check", "--connect")
    icekeeper("writer", "--until-idle")
    icekeeper("bookkeeper", "--once")
    assert "shop.orders" in icekeeper("status")

    monkeypatch.chdir(tmp_path)  # where the commands ran: `state_dir` is relative to it
    config = load_config("my.yaml", environ=environ)
    assert Path(config.state_dir) == tmp_path / "icekeeper-state"  # relative to the cwd, as said
    rows = open_catalog(config).load_table("shop.orders").scan().to_arrow().to_pylist()
    alive: dict[int, bool] = {}
    for event in synthetic_events(spec):
        if event.poison is None:
            alive[event.key["id"]] = event.op != "d"
    assert sorted(row["id"] for row in rows) == sorted(key for key, live in alive.items() if live)

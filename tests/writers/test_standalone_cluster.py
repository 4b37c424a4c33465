"""The writer on a real Spark standalone cluster (a
master and two workers from the PySpark install).

Writers must run on any `spark.master`; this runs the same job as `local[*]` does, but with
executors in separate worker JVMs and Python workers, as on a cluster.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pyspark
import pytest
import yaml

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.samples.produce import produce_seed_sample
from tests.support.pipeline import pipeline_config
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def standalone_cluster(tmp_path: Path):
    """`spark://` master with two 1-core workers; stopped (process groups killed) afterwards."""
    spark_home = Path(pyspark.__file__).parent
    spark_class = str(spark_home / "bin" / "spark-class")
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(tmp_path / "logs"),
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
    }
    port, ui_port = free_port(), free_port()
    processes = [
        subprocess.Popen(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    ]
    master = f"spark://127.0.0.1:{port}"
    for _ in range(2):
        processes.append(
            subprocess.Popen(
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    master,
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--webui-port",
                    str(free_port()),
                    "--host",
                    "127.0.0.1",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
    try:

        def two_workers_alive() -> bool:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{ui_port}/json/", timeout=2
                ) as response:
                    return json.load(response).get("aliveworkers", 0) >= 2
            except OSError:  # the master's UI is not up yet
                return False

        wait_until(two_workers_alive, 90, "two workers in the standalone cluster", interval_s=0.5)
        yield master, ui_port
    finally:
        for process in processes:
            try:
                os.killpg(process.pid, 15)
            except ProcessLookupError:
                pass
        for process in processes:
            process.wait(timeout=30)


def test_writer_runs_on_a_standalone_cluster(
    local_stack, standalone_cluster, tmp_path: Path, unique_topic: str
) -> None:
    """`icekeeper writer` (its own process, as a user runs it) with spark.master = the cluster."""
    master, ui_port = standalone_cluster
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {"ICEKEEPER__SPARK__MASTER": master, "ICEKEEPER__TABLES__0__MODE": "changelog"},
    )
    config.spark.conf.update({"spark.executor.memory": "768m", "spark.cores.max": "2"})
    config_path = tmp_path / "writer.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")), encoding="utf-8")
    produce_seed_sample(config, topic=unique_topic, progress=lambda m: None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "icekeeper.cli",
            "writer",
            "--config",
            str(config_path),
            "--until-idle",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    batches = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert sum(batch["rows"] for batch in batches) == 26
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as response:
        apps = json.load(response)["completedapps"]
    assert [app["cores"] for app in apps] == [2]  # both workers ran executors for the writer
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    rows = bookkeeper.catalog.load_table("db_gb18030_test.tbl_test_1").scan().to_arrow()
    assert rows.num_rows == 26 and sorted(set(rows.column("_kfk_partition").to_pylist())) == [
        0,
        1,
        2,
    ]

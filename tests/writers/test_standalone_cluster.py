"""The writer on a real Spark standalone cluster: a master and two workers from the PySpark install,
each with its own work folder and a Python that has nothing installed (no icekeeper, pyarrow or
polars), as on a cluster that never heard of icekeeper.

The writer ships its executors the environment `icekeeper writer --executor-env` packs
(`spark.executor_env`, common/executor_env.py), runs as a user runs it (`icekeeper writer`, its
own process, `spark.master: spark://...`), and the bookkeeper commits what it published: the
table must hold every record of the topic once. The heavy variant kills a worker and its executor
(SIGKILL) while a batch's tasks run on it: Spark retries them on the other worker, and still no
record is lost or written twice.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pyspark
import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition

from icekeeper.common.config import IcekeeperConfig
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from tests.support.pipeline import commit_all
from tests.support.recreated_topic import TABLE, topic_config
from tests.support.stack import REPO_ROOT
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with nothing installed: what the workers' executors find on their own."""
    folder = tmp_path_factory.mktemp("bare-python") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    for module in ("icekeeper", "pyarrow", "polars", "confluent_kafka"):
        probe = subprocess.run(
            [str(python), "-c", f"import {module}"], capture_output=True, check=False, cwd=folder
        )
        assert probe.returncode != 0, f"{module} is importable in the workers' Python"
    return python


@pytest.fixture(scope="module")
def executor_archive() -> Path:
    """`icekeeper writer --executor-env`, as a user runs it before submitting: the archive's path
    on stdout alone, progress on stderr; built once, then reused from the cache."""
    result = subprocess.run(
        [sys.executable, "-m", "icekeeper.cli", "writer", "--executor-env"],
        env={**os.environ, "ICEKEEPER__CACHE_DIR": str(REPO_ROOT / ".cache")},
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    print(result.stderr[-2000:])
    archive = Path(result.stdout.strip())
    assert archive.is_file() and archive.name.endswith(".tar.gz"), result.stdout
    assert archive.is_relative_to((REPO_ROOT / ".cache" / "executor-env").resolve())
    return archive


@dataclass
class Worker:
    process: subprocess.Popen
    work_dir: Path


@dataclass
class StandaloneCluster:
    master: str
    ui_port: int
    workers: list[Worker]

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as answer:
            return json.load(answer)


def spark_daemon(
    spark_home: Path, daemon: str, arguments: list[str], env: dict[str, str]
) -> subprocess.Popen:
    """`spark-class org.apache.spark.deploy.<daemon>` on loopback, its output discarded, in a
    process group of its own: what it starts (a worker's executors) joins it, and is stopped
    with it."""
    return subprocess.Popen(
        [
            str(spark_home / "bin" / "spark-class"),
            f"org.apache.spark.deploy.{daemon}",
            *arguments,
            "--host",
            "127.0.0.1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.fixture
def standalone_cluster(tmp_path: Path, bare_python: Path):
    """`spark://` master with two 1-core workers, each with its own work folder and the bare
    Python as `PYSPARK_PYTHON` and first on its PATH; stopped (process groups killed) after."""
    spark_home = Path(pyspark.__file__).parent
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(tmp_path / "logs"),
    }
    env.pop("PYSPARK_PYTHON", None)
    port, ui_port = free_port(), free_port()
    master_process = spark_daemon(
        spark_home,
        "master.Master",
        ["--port", str(port), "--webui-port", str(ui_port)],
        env,
    )
    master = f"spark://127.0.0.1:{port}"
    workers = []
    for number in (1, 2):
        work_dir = tmp_path / f"worker-{number}"
        work_dir.mkdir()
        worker_env = {
            **env,
            "SPARK_WORKER_DIR": str(work_dir),
            "PYSPARK_PYTHON": str(bare_python),
            "PATH": f"{bare_python.parent}{os.pathsep}{env['PATH']}",
        }
        arguments = ["--cores", "1", "--memory", "1g", "--work-dir", str(work_dir)]
        process = spark_daemon(
            spark_home,
            "worker.Worker",
            [master, *arguments, "--webui-port", str(free_port())],
            worker_env,
        )
        workers.append(Worker(process, work_dir))
    cluster = StandaloneCluster(master, ui_port, workers)
    try:

        def two_workers_alive() -> bool:
            try:
                return cluster.state().get("aliveworkers", 0) >= 2
            except OSError:  # the master's UI is not up yet
                return False

        wait_until(two_workers_alive, 90, "two workers in the standalone cluster", interval_s=0.5)
        yield cluster
    finally:
        for process in [master_process, *(worker.process for worker in workers)]:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for process in [master_process, *(worker.process for worker in workers)]:
            process.wait(timeout=30)


def cluster_config(
    tmp_path: Path,
    topic: str,
    cluster: StandaloneCluster,
    archive: Path | None,
    engine: str,
    extra: dict[str, str] | None = None,
) -> tuple[IcekeeperConfig, Path]:
    """A changelog table on `topic`, written on the cluster with the packed environment; every
    arrow batch as a Spark job (`driver_batch_records: 0`), so its tasks run in the executors."""
    config = topic_config(
        tmp_path,
        topic,
        {
            "ICEKEEPER__SPARK__MASTER": cluster.master,
            "ICEKEEPER__SPARK__EXECUTOR_ENV": str(archive or ""),
            "ICEKEEPER__WRITER__ENGINE": engine,
            "ICEKEEPER__WRITER__DRIVER_BATCH_RECORDS": "0",
            **(extra or {}),
        },
    )
    config.spark.conf.update(
        {
            "spark.executor.memory": "768m",
            "spark.cores.max": "2",
            # The driver on loopback too, as the cluster is (not the host's own address).
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        }
    )
    config_path = tmp_path / "writer.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")), encoding="utf-8")
    return config, config_path


def start_writer(config_path: Path, *arguments: str) -> subprocess.Popen:
    """`icekeeper writer` in its own process, with nothing telling Spark which Python executors
    run (no `PYSPARK_PYTHON`): only the config does."""
    env = {**os.environ}
    env.pop("PYSPARK_PYTHON", None)
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    return subprocess.Popen(
        [sys.executable, "-m", "icekeeper.cli", "writer", "--config", str(config_path), *arguments],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def produce(config: IcekeeperConfig, topic: str, spec: SyntheticSpec) -> None:
    """`spec`'s records in `topic`, over three partitions: the writer's batches then have tasks
    for both workers."""
    produce_synthetic(config, spec, topic=topic, partitions=3, progress=lambda m: None)


def batches_of(stdout: str) -> list[dict]:
    """The writer's batch reports: its JSON lines on stdout."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def topic_offsets(config: IcekeeperConfig, topic: str) -> Counter:
    """(partition, offset) of every record in the topic now."""
    consumer = Consumer(
        {"bootstrap.servers": config.sources[0].bootstrap_servers, "group.id": "cluster-test"}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        offsets = Counter()
        for partition in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
            offsets.update((partition, offset) for offset in range(low, high))
        return offsets
    finally:
        consumer.close()


def committed_offsets(config: IcekeeperConfig) -> Counter:
    """(partition, offset) of every row the bookkeeper committed, counted (twice is a bug)."""
    table = commit_all(config).catalog.load_table(TABLE).scan().to_arrow()
    return Counter(
        zip(
            table.column("_kfk_partition").to_pylist(),
            table.column("_kfk_offset").to_pylist(),
            strict=True,
        )
    )


def unpacked_pythons(cluster: StandaloneCluster) -> list[Path]:
    """The archive's Python as Spark unpacked it into each executor's work folder."""
    return [
        python
        for worker in cluster.workers
        for python in worker.work_dir.glob("app-*/*/environment/bin/python")
    ]


# `spark-sql` (no Python in executors, three times the arrow run's time on the cluster) is heavy.
@pytest.mark.parametrize("engine", ["arrow", pytest.param("spark-sql", marks=pytest.mark.heavy)])
def test_writer_on_a_cluster_whose_executors_have_nothing_installed(
    local_stack,
    standalone_cluster: StandaloneCluster,
    executor_archive: Path,
    tmp_path: Path,
    unique_topic: str,
    engine: str,
) -> None:
    """Both engines, with their tasks in the two workers' executors; the table equals the topic."""
    config, config_path = cluster_config(
        tmp_path, unique_topic, standalone_cluster, executor_archive, engine
    )
    produce(config, unique_topic, SyntheticSpec(seed=28, keys=200, events=3000, schema_changes=1))
    writer = start_writer(config_path, "--until-idle")
    stdout, stderr = writer.communicate(timeout=900)
    assert writer.returncode == 0, stderr[-3000:]
    batches = batches_of(stdout)
    assert sum(batch["rows"] for batch in batches) == 3000
    apps = standalone_cluster.state()["completedapps"]
    assert [app["cores"] for app in apps] == [2]  # both workers ran executors for the writer
    # The arrow engine ships the archive, which each executor unpacked to run its tasks' Python;
    # `spark-sql` runs no Python there and ships nothing.
    assert len(unpacked_pythons(standalone_cluster)) == (2 if engine == "arrow" else 0)
    expected = topic_offsets(config, unique_topic)
    assert sum(expected.values()) == 3000
    assert committed_offsets(config) == expected


def test_executors_without_icekeeper_stop_the_writer_with_what_to_ship(
    local_stack, standalone_cluster: StandaloneCluster, tmp_path: Path, unique_topic: str
) -> None:
    """Without `spark.executor_env`, the arrow engine's tasks fail to import icekeeper in the bare
    Python: the writer stops at once (exit 2, nothing published) and says what executors need,
    rather than retrying a batch no retry can write."""
    config, config_path = cluster_config(tmp_path, unique_topic, standalone_cluster, None, "arrow")
    produce(config, unique_topic, SyntheticSpec(seed=27, keys=20, events=300, schema_changes=0))
    writer = start_writer(config_path, "--until-idle")
    stdout, stderr = writer.communicate(timeout=600)
    assert writer.returncode == 2, stderr[-3000:]
    last_line = stderr.strip().splitlines()[-1]
    assert "executors' Python cannot import 'icekeeper'" in last_line, stderr[-3000:]
    assert "spark.executor_env: packed" in last_line
    assert not batches_of(stdout)  # no batch
    assert not list((tmp_path / "txlog").rglob("*.json")), "a moniker was published"


def _python_workers_in(work_dir: Path) -> list[int]:
    """Python processes (Spark's Python workers) running in an executor's work folder."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
            command = (entry / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if cwd.is_relative_to(work_dir) and b"python" in command:
            found.append(int(entry.name))
    return found


@pytest.mark.heavy
def test_a_worker_killed_mid_batch_loses_no_row_and_writes_none_twice(
    local_stack,
    standalone_cluster: StandaloneCluster,
    executor_archive: Path,
    tmp_path: Path,
    unique_topic: str,
) -> None:
    """SIGKILL to worker 1, its executor JVM and its Python workers while they run a batch's tasks
    (arrow engine): Spark runs them again on worker 2, the writer publishes, the bookkeeper
    commits, and the table holds every record of the topic exactly once."""
    # Several batches: the kill lands in one of them, with others before and after it.
    config, config_path = cluster_config(
        tmp_path,
        unique_topic,
        standalone_cluster,
        executor_archive,
        "arrow",
        {"ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": "40000"},
    )
    events = 150_000
    spec = SyntheticSpec(seed=29, keys=5000, events=events, schema_changes=1)
    produce(config, unique_topic, spec)
    writer = start_writer(config_path, "--until-idle")
    doomed = standalone_cluster.workers[0]
    data = tmp_path / "warehouse" / "shop" / "orders" / "data"
    try:
        # Batch 2 (its schema versions known from batch 1: one Spark job, the writing one) has
        # begun writing its files, with worker 1's Python workers running its tasks.
        wait_until(
            lambda: list(data.glob("*/000000000002-*/*.parquet")), 900, "batch 2's first file"
        )
        assert _python_workers_in(doomed.work_dir), "worker 1 runs no Python task"
        os.killpg(doomed.process.pid, signal.SIGKILL)  # the worker, its executor, its Pythons
        doomed.process.wait(timeout=30)
        assert writer.poll() is None, "the writer ended before the kill"
        assert not list(data.glob("*/000000000003-*")), "the kill came after batch 2"
        stdout, stderr = writer.communicate(timeout=1200)
    finally:
        if writer.poll() is None:
            writer.kill()
    assert writer.returncode == 0, stderr[-3000:]
    assert "Lost executor" in stderr  # Spark's scheduler saw it go (its own ERROR line)
    batches = batches_of(stdout)
    assert len(batches) >= 3
    assert sum(batch["rows"] for batch in batches) == events
    state = standalone_cluster.state()
    assert state["aliveworkers"] == 1
    expected = topic_offsets(config, unique_topic)
    committed = committed_offsets(config)
    assert sum(expected.values()) == events
    assert not [key for key, count in committed.items() if count > 1], "rows written twice"
    assert committed == expected
    # Every committed file whole, as its manifest entry says; what the killed tasks left behind
    # (a partial file) is in no moniker, for the reaper's orphan removal.
    table = commit_all(config).catalog.load_table(TABLE)
    committed_files = table.inspect.files().to_pylist()
    for entry in committed_files:
        path = entry["file_path"].removeprefix("file://")
        assert pq.read_metadata(path).num_rows == entry["record_count"], path
    left_over = {str(p) for p in data.rglob("*.parquet")} - {
        entry["file_path"].removeprefix("file://") for entry in committed_files
    }
    print(f"files the killed tasks left, not committed: {sorted(left_over)}")


@pytest.mark.heavy
def test_spark_submit_with_the_documented_flags(
    local_stack,
    standalone_cluster: StandaloneCluster,
    executor_archive: Path,
    tmp_path: Path,
    unique_topic: str,
) -> None:
    """docs/operations.md's spark-submit command ("Writers on a Spark cluster"): the archive with
    `--archives ...#environment`, `PYSPARK_PYTHON=./environment/bin/python`, no
    `spark.executor_env`; jars from the cache with `--jars` instead of `--packages` (the same
    jars, without a resolver run)."""
    from icekeeper.common.spark import spark_jars

    config, config_path = cluster_config(tmp_path, unique_topic, standalone_cluster, None, "arrow")
    produce(config, unique_topic, SyntheticSpec(seed=30, keys=200, events=3000, schema_changes=1))
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = {
        **os.environ,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYSPARK_PYTHON": "./environment/bin/python",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    result = subprocess.run(
        [
            str(spark_submit),
            "--master",
            standalone_cluster.master,
            "--jars",
            ",".join(str(jar) for jar in spark_jars(REPO_ROOT / ".cache")),
            "--archives",
            f"{executor_archive}#environment",
            "--conf",
            "spark.driver.host=127.0.0.1",
            str(REPO_ROOT / "writers" / "__main__.py"),
            "--config",
            str(config_path),
            "--until-idle",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    batches = batches_of(result.stdout)
    assert sum(batch["rows"] for batch in batches) == 3000
    assert len(unpacked_pythons(standalone_cluster)) == 2
    assert committed_offsets(config) == topic_offsets(config, unique_topic)

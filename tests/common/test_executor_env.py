"""What ships the executors' Python environment: the Spark settings from `spark.executor_env`, and
the cache key of the packed archive (tests/writers/test_standalone_cluster.py runs it on a
cluster)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.executor_env import (
    EXECUTOR_PYTHON,
    ExecutorsLackPython,
    InstallSource,
    archive_path,
    env_key,
    install_source,
    installed_constraints,
    missing_executor_module,
    prune_cache,
    spark_archive_conf,
)
from icekeeper.common.spark import executor_env_conf
from tests.support.stack import REPO_ROOT


def test_the_archive_unpacks_as_environment_and_runs_its_python() -> None:
    assert spark_archive_conf("/c/env.tar.gz") == {"spark.archives": "/c/env.tar.gz#environment"}
    assert spark_archive_conf("s3a://b/env.tar.gz", "hdfs:///x.zip#x") == {
        "spark.archives": "hdfs:///x.zip#x,s3a://b/env.tar.gz#environment"
    }
    assert EXECUTOR_PYTHON == "./environment/bin/python"


def test_spark_executor_env_ships_an_archive_only_to_a_cluster() -> None:
    def conf(setting: str, master: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        config = IcekeeperConfig.model_validate(
            {"spark": {"executor_env": setting, "conf": extra or {}}}
        )
        return executor_env_conf(config, master)

    assert conf("", "spark://m:7077") == {}  # the executors' own Python
    assert conf("/envs/e.tar.gz", "local[2]") == {}  # local workers run the driver's Python
    assert conf("/envs/e.tar.gz", "spark://m:7077") == {
        "spark.archives": "/envs/e.tar.gz#environment"
    }
    assert conf("hdfs:///e.tgz", "yarn", {"spark.archives": "a.zip#a"}) == {
        "spark.archives": "a.zip#a,hdfs:///e.tgz#environment"
    }


def test_the_archive_is_rebuilt_when_icekeeper_or_a_pinned_version_changes() -> None:
    source = install_source()
    # This checkout is installed from its folder: pip installs it from there, with the extra.
    assert source.requirement == f"{REPO_ROOT}[executor]"
    constraints = installed_constraints()
    assert "pyarrow==" in constraints and "icekeeper==" not in constraints
    key = env_key(source, constraints)
    assert env_key(source, constraints) == key
    assert env_key(InstallSource(source.requirement, "other files"), constraints) != key
    assert env_key(source, constraints.replace("pyarrow==", "pyarrow==0")) != key
    assert archive_path(Path("/c"), key) == Path(f"/c/executor-env/icekeeper-executor-{key}.tar.gz")


def test_the_cache_keeps_the_newest_archives(tmp_path: Path) -> None:
    now = time.time()
    for age in range(5):
        archive = tmp_path / f"icekeeper-executor-{age}.tar.gz"
        archive.write_bytes(b"x")
        os.utime(archive, (now - age * 60, now - age * 60))
    dead_build = tmp_path / "icekeeper-executor-9.tar.gz.123.part"
    dead_build.write_bytes(b"x")
    os.utime(dead_build, (now - 2 * 86_400, now - 2 * 86_400))
    prune_cache(tmp_path, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"icekeeper-executor-{age}.tar.gz" for age in range(3)
    ]


def test_a_job_failure_names_the_module_the_executors_lack() -> None:
    failure = (
        "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "pyspark/cloudpickle/cloudpickle.py", line 649, in subimport\n'
        "ModuleNotFoundError: No module named 'icekeeper.writers'\n"
    )
    assert missing_executor_module(failure) == "icekeeper.writers"
    assert missing_executor_module("java.io.IOException: disk full") is None
    assert "spark.executor_env: packed" in str(ExecutorsLackPython("icekeeper"))

"""Shared fixtures: the real local stack, started once per test session.

Integration tests run against the same `LocalStack` code as `icekeeper stack up`, on ports of
their own (so a developer's running stack is left alone) and a state folder under
`.icekeeper/test-stack`. The stack is stopped at the end only if this session started it; set
`ICEKEEPER_TEST_KEEP_STACK=1` to leave it running for faster reruns.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from common.config import IcekeeperConfig, load_config

REPO_ROOT = Path(__file__).resolve().parent.parent
# ICEKEEPER_TEST_PORT_OFFSET shifts every port, so two checkouts can run their suites at once.
_PORT_OFFSET = int(os.environ.get("ICEKEEPER_TEST_PORT_OFFSET", "0"))
TEST_STACK_PORTS = {
    name: port + _PORT_OFFSET
    for name, port in {
        "kafka_port": 19092,
        "kafka_controller_port": 19093,
        "registry_port": 18081,
        "registry_management_port": 19001,
        "azurite_queue_port": 20001,
        "azurite_blob_port": 20000,
    }.items()
}


def stack_environ(state_dir: Path, ports: dict[str, int]) -> dict[str, str]:
    """Environment overrides that point a config at a stack on `ports` with state in `state_dir`."""
    environ = {
        "ICEKEEPER__STATE_DIR": str(state_dir),
        "ICEKEEPER__CACHE_DIR": str(REPO_ROOT / ".cache"),
        "ICEKEEPER__SOURCES__0__BOOTSTRAP_SERVERS": f"127.0.0.1:{ports['kafka_port']}",
        "ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_URL": f"http://127.0.0.1:{ports['registry_port']}/apis/ccompat/v7",
    }
    environ.update({f"ICEKEEPER__STACK__{key.upper()}": str(port) for key, port in ports.items()})
    return environ


@pytest.fixture(scope="session")
def stack_config() -> IcekeeperConfig:
    """Config of the session's stack (embedded defaults, test ports, test state folder)."""
    return load_config(None, environ=stack_environ(REPO_ROOT / ".icekeeper" / "test-stack", TEST_STACK_PORTS))


@pytest.fixture(scope="session")
def local_stack(stack_config: IcekeeperConfig):
    """The running stack (Kafka, registry, Azurite queue and blob), started once."""
    from icekeeper.localstack.stack import LocalStack

    stack = LocalStack(stack_config)
    report = stack.up(progress=lambda message: print(f"[stack] {message}"))
    print(f"[stack] up in {report.seconds:.1f}s (started: {report.started or 'none, reused'})")
    yield stack
    if report.started and not os.environ.get("ICEKEEPER_TEST_KEEP_STACK"):
        stack.down(progress=lambda message: None)


@pytest.fixture
def unique_topic() -> str:
    """A topic name no other test uses."""
    return f"test.{uuid.uuid4().hex[:10]}"


def pipeline_config(state_dir: Path, topic: str, extra: dict[str, str] | None = None) -> IcekeeperConfig:
    """A config for one test: the session stack, its own state folder, catalog and topic.

    The catalog name is unique per test because Spark's Iceberg JdbcCatalog stores its Spark
    catalog name in the catalog database, so a shared SparkSession registers one per test.
    """
    environ = stack_environ(state_dir, TEST_STACK_PORTS)
    environ.update({
        "ICEKEEPER__SOURCES__0__TOPICS": f"[{topic}]",
        "ICEKEEPER__TABLES__0__TOPICS": f"[{topic}]",
        "ICEKEEPER__CATALOG__NAME": f"cat_{uuid.uuid4().hex[:8]}",
        "ICEKEEPER__WRITER__SPARK_MASTER": "local[2]",
        "ICEKEEPER__WRITER__TRIGGER_INTERVAL": "0",
        "ICEKEEPER__BOOKKEEPER__COMMIT_INTERVAL": "0",
    })
    environ.update(extra or {})
    return load_config(None, environ=environ)


@pytest.fixture(scope="session")
def spark(stack_config: IcekeeperConfig):
    """One local SparkSession (2 cores) for the whole test session; starting one takes 10-20 s."""
    from common.spark import spark_session

    session = spark_session(stack_config, "icekeeper-tests", master="local[2]", extra_conf={"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


def register_catalog(spark, config: IcekeeperConfig) -> str:  # noqa: ANN001
    """Register the test's catalog in the shared SparkSession; returns its name."""
    from common.spark import iceberg_catalog_conf

    for key, value in iceberg_catalog_conf(config).items():
        spark.conf.set(key, value)
    return config.catalog.name

"""Shared fixtures: the real local stack, started once per test session.

Integration tests run against the same `LocalStack` code as `icekeeper stack up`, on ports of
their own (so a developer's running stack is left alone) and a state folder under
`.icekeeper/test-stack`. The stack is stopped at the end only if this session started it; set
`ICEKEEPER_TEST_KEEP_STACK=1` to leave it running for faster reruns. The CDC sources of
`stack up --with` (MariaDB, PostgreSQL, Kafka Connect with Debezium) start only when a test asks
for `mariadb_cdc`, `postgres_cdc` or `kafka_connect`, and likewise once per session.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
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
        "mariadb_port": 13306,
        "postgres_port": 15432,
        "connect_port": 18083,
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


# A shifted session gets its own state folder too: pid files there say which processes are its own.
TEST_STACK_STATE_DIR = (
    REPO_ROOT / ".icekeeper" / ("test-stack" if not _PORT_OFFSET else f"test-stack-{_PORT_OFFSET}")
)


@pytest.fixture(scope="session")
def stack_config() -> IcekeeperConfig:
    """Config of the session's stack (embedded defaults, test ports, test state folder)."""
    return load_config(None, environ=stack_environ(TEST_STACK_STATE_DIR, TEST_STACK_PORTS))


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


@contextlib.contextmanager
def _optional_service(config: IcekeeperConfig, name: str) -> Iterator[None]:
    """One of `stack up --with`'s services, started on entry and stopped on exit if this session
    started it."""
    from icekeeper.localstack.stack import LocalStack

    stack = LocalStack(config, only=[name], with_services=[name])
    report = stack.up(progress=lambda message: print(f"[stack] {message}"))
    print(
        f"[stack] {name} up in {report.seconds:.1f}s (started: {report.started or 'none, reused'})"
    )
    yield
    if report.started and not os.environ.get("ICEKEEPER_TEST_KEEP_STACK"):
        stack.down(progress=lambda message: None)


@pytest.fixture(scope="session")
def kafka_connect(local_stack, stack_config: IcekeeperConfig):
    """Kafka Connect with Debezium's connectors (`stack up --with connect`), started once; yields
    its REST client."""
    from icekeeper.localstack.cdc import ConnectClient

    with _optional_service(stack_config, "connect"):
        yield ConnectClient.for_stack(stack_config.stack)


@pytest.fixture(scope="session")
def mariadb_cdc(kafka_connect, stack_config: IcekeeperConfig):
    """The stack's MariaDB (binlog on) beside Kafka Connect, started once; yields a
    `MariaDbSource`."""
    from icekeeper.localstack.cdc import MariaDbSource

    with _optional_service(stack_config, "mariadb"):
        yield MariaDbSource(stack_config.stack)


@pytest.fixture(scope="session")
def postgres_cdc(kafka_connect, stack_config: IcekeeperConfig):
    """The stack's PostgreSQL (wal_level=logical) beside Kafka Connect, started once; yields a
    `PostgresSource`."""
    from icekeeper.localstack.cdc import PostgresSource

    with _optional_service(stack_config, "postgres"):
        source = PostgresSource(stack_config.stack)
        # left by an earlier session's killed worker; no connector runs yet
        source.drop_inactive_slots()
        yield source


@pytest.fixture
def unique_topic() -> str:
    """A topic name no other test uses."""
    return f"test.{uuid.uuid4().hex[:10]}"


def pipeline_config(
    state_dir: Path, topic: str, extra: dict[str, str] | None = None
) -> IcekeeperConfig:
    """A config for one test: the session stack, its own state folder, catalog and topic.

    The catalog name is unique per test because Spark's Iceberg JdbcCatalog stores its Spark
    catalog name in the catalog database, so a shared SparkSession registers one per test.
    """
    environ = stack_environ(state_dir, TEST_STACK_PORTS)
    environ.update(
        {
            "ICEKEEPER__SOURCES__0__TOPICS": f"[{topic}]",
            "ICEKEEPER__TABLES__0__TOPICS": f"[{topic}]",
            "ICEKEEPER__CATALOG__NAME": f"cat_{uuid.uuid4().hex[:8]}",
            "ICEKEEPER__WRITER__SPARK_MASTER": "local[2]",
            "ICEKEEPER__WRITER__TRIGGER_INTERVAL": "0",
            "ICEKEEPER__BOOKKEEPER__COMMIT_INTERVAL": "0",
        }
    )
    environ.update(extra or {})
    return load_config(None, environ=environ)


@pytest.fixture(scope="session")
def spark(stack_config: IcekeeperConfig):
    """One local SparkSession (2 cores) for the whole test session; starting one takes 10-20 s."""
    from common.spark import spark_session

    session = spark_session(
        stack_config,
        "icekeeper-tests",
        master="local[2]",
        extra_conf={"spark.sql.shuffle.partitions": "4"},
    )
    yield session
    session.stop()


def register_catalog(spark, config: IcekeeperConfig) -> str:
    """Register the test's catalog in the shared SparkSession; returns its name."""
    from common.spark import iceberg_catalog_conf

    for key, value in iceberg_catalog_conf(config).items():
        spark.conf.set(key, value)
    return config.catalog.name

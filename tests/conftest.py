"""Shared fixtures: the real local stack, started once per test session.

Integration tests run against the same `LocalStack` code as `icekeeper stack up`, on ports of
their own (so a developer's running stack is left alone) and a state folder under
`.icekeeper/test-stack` (tests/support/stack.py). The stack is stopped at the end only if this
session started it; set `ICEKEEPER_TEST_KEEP_STACK=1` to leave it running for faster reruns. The
CDC sources of `stack up --with` (MariaDB, PostgreSQL, Kafka Connect with Debezium) start only when
a test asks for `mariadb_cdc`, `postgres_cdc` or `kafka_connect`, and likewise once per session;
so do the S3 server and the Iceberg catalogs on it (`s3_storage`, `rest_catalog`, `nessie_catalog`,
`hive_metastore`, `pg_catalog`), which need no Kafka.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from icekeeper.common.config import IcekeeperConfig, load_config
from icekeeper.common.config.model import AzureQueueTransport
from icekeeper.localstack.services import Service
from icekeeper.localstack.settings import stack_settings
from tests.support.stack import TEST_STACK_PORTS, TEST_STACK_STATE_DIR, stack_environ


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
def _optional_service(config: IcekeeperConfig, name: str) -> Iterator[Service]:
    """One of `stack up --with`'s services, started on entry
    and stopped on exit if this session started it."""
    from icekeeper.localstack.stack import LocalStack

    stack = LocalStack(config, only=[name], with_services=[name])
    report = stack.up(progress=lambda message: print(f"[stack] {message}"))
    print(
        f"[stack] {name} up in {report.seconds:.1f}s (started: {report.started or 'none, reused'})"
    )
    yield stack.service(name)
    if report.started and not os.environ.get("ICEKEEPER_TEST_KEEP_STACK"):
        stack.down(progress=lambda message: None)


@pytest.fixture(scope="session")
def kafka_connect(local_stack, stack_config: IcekeeperConfig):
    """Kafka Connect with Debezium's connectors (`stack up --with connect`), started once; yields
    its REST client."""
    from icekeeper.localstack.cdc import ConnectClient

    with _optional_service(stack_config, "connect"):
        yield ConnectClient.for_stack(stack_settings(stack_config))


@pytest.fixture(scope="session")
def mariadb_cdc(kafka_connect, stack_config: IcekeeperConfig):
    """The stack's MariaDB (binlog on) beside Kafka Connect, started once; yields a
    `MariaDbSource`."""
    from icekeeper.localstack.cdc import MariaDbSource

    with _optional_service(stack_config, "mariadb"):
        yield MariaDbSource(stack_settings(stack_config))


@pytest.fixture(scope="session")
def postgres_cdc(kafka_connect, stack_config: IcekeeperConfig):
    """The stack's PostgreSQL (wal_level=logical) beside Kafka
    Connect, started once; yields a `PostgresSource`."""
    from icekeeper.localstack.cdc import PostgresSource

    with _optional_service(stack_config, "postgres"):
        source = PostgresSource(stack_settings(stack_config))
        # left by an earlier session's killed worker; no connector runs yet
        source.drop_inactive_slots()
        yield source


@pytest.fixture(scope="session")
def secured_services(local_stack, stack_config: IcekeeperConfig):
    """The secured broker (SASL_SSL, SCRAM, a CA made at start) and the basic-auth registry of
    `stack up --with kafka-sasl registry-auth`, started once; yields the two services."""
    from icekeeper.localstack.stack import LocalStack

    names = ["kafka-sasl", "registry-auth"]
    stack = LocalStack(stack_config, only=names, with_services=names)
    report = stack.up(progress=lambda message: print(f"[stack] {message}"))
    print(f"[stack] secured services up in {report.seconds:.1f}s (started: {report.started})")
    yield stack.service("kafka-sasl"), stack.service("registry-auth")
    if report.started and not os.environ.get("ICEKEEPER_TEST_KEEP_STACK"):
        stack.down(progress=lambda message: None)


@pytest.fixture(scope="session")
def s3_storage(stack_config: IcekeeperConfig):
    """The stack's S3 server (`stack up --with s3`: s3proxy, its bucket made at start), started
    once; yields its `S3Service`."""
    with _optional_service(stack_config, "s3") as service:
        yield service


@pytest.fixture(scope="session")
def rest_catalog(s3_storage, stack_config: IcekeeperConfig):
    """Iceberg's REST catalog server (`--with rest`), tables on `s3_storage`, started once;
    yields its `RestCatalogService`."""
    with _optional_service(stack_config, "rest") as service:
        yield service


@pytest.fixture(scope="session")
def nessie_catalog(s3_storage, stack_config: IcekeeperConfig):
    """Nessie's Iceberg REST catalog (`--with nessie`), tables on `s3_storage`, started once;
    yields its `NessieService`."""
    with _optional_service(stack_config, "nessie") as service:
        yield service


@pytest.fixture(scope="session")
def hive_metastore(s3_storage, stack_config: IcekeeperConfig):
    """Hive Metastore 3.1.3 (`--with hms`), tables on `s3_storage`, started once; yields its
    `HiveMetastoreService`."""
    with _optional_service(stack_config, "hms") as service:
        yield service


@pytest.fixture(scope="session")
def pg_catalog(s3_storage, stack_config: IcekeeperConfig):
    """A SQL catalog in PostgreSQL (`--with pg-catalog`), tables on `s3_storage`, started once;
    yields its `PostgresCatalogService`."""
    with _optional_service(stack_config, "pg-catalog") as service:
        yield service


STORES = ("local", "s3", "azure")


@pytest.fixture(params=STORES)
def store_root(request, tmp_path: Path) -> Iterator[str]:
    """A fresh folder on each store in turn (a local folder, the stack's S3 server, Azurite
    blob), with the storage door configured for it as `catalog.properties` would configure it: a
    test that takes it runs on every store (the object stores' runs are integration tests)."""
    from tests.support.object_stores import (
        azure_uri,
        azurite_blob_properties,
        new_container,
        storage_door,
    )

    if request.param == "local":
        with storage_door({}):
            yield str(tmp_path / "root")
        return
    request.applymarker(pytest.mark.integration)
    if request.param == "s3":
        service = request.getfixturevalue("s3_storage")
        with storage_door(service.pyiceberg_properties()):
            yield service.uri(f"door/{uuid.uuid4().hex[:10]}")
        return
    blob = request.getfixturevalue("local_stack").service("azurite-blob")
    properties = azurite_blob_properties(blob)
    with storage_door(properties):
        yield azure_uri(new_container(properties), "door")


@pytest.fixture
def unique_topic() -> str:
    """A topic name no other test uses."""
    return f"test.{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def spark(stack_config: IcekeeperConfig):
    """One local SparkSession (2 cores) for the whole test session; starting one takes 10-20 s.

    Its jars include those of the stack's S3 server and catalogs and Iceberg's ADLSFileIO for
    Azurite (they cannot be added to a running session), so a test can register any of those
    catalogs in it (`spark_catalog(name).conf`), or a catalog with its tables on Azure Blob.
    """
    from icekeeper.common.spark import spark_jars, spark_session
    from icekeeper.common.stores.azure import ICEBERG_AZURE_BUNDLE
    from icekeeper.localstack.stack import LocalStack

    cache_dir = Path(stack_config.cache_dir)
    client_jars = LocalStack(stack_config).spark_client_jars(
        progress=lambda message: print(f"[spark] {message}")
    )
    session = spark_session(
        stack_config,
        "icekeeper-tests",
        master="local[2]",
        extra_conf={
            "spark.sql.shuffle.partitions": "4",
            # After icekeeper's own, in Spark's class loader (not `extraClassPath`, which would
            # put iceberg-aws-bundle's unshaded commons-codec and caffeine before Spark's).
            "spark.jars": ",".join(
                str(jar) for jar in [*spark_jars(cache_dir, (ICEBERG_AZURE_BUNDLE,)), *client_jars]
            ),
        },
    )
    yield session
    session.stop()


@pytest.fixture
def azure_settings(local_stack, tmp_path: Path) -> AzureQueueTransport:
    """An Azure queue transport on the stack's Azurite, with queues of the test's own."""
    name = f"m-{uuid.uuid4().hex[:10]}"
    return AzureQueueTransport(
        connection_string=local_stack.service("azurite-queue").connection_string(),
        queue_name=name,
        dead_letter_queue_name=name + "-dlq",
        journal_uri=str(tmp_path / "journal"),
        dead_letter_uri=str(tmp_path / "dlq"),
    )

"""Spark (the writer's, the reaper's) opens the shared catalog the way pyiceberg (the
bookkeeper) opens it from the same `catalog.properties` (common/spark.py `iceberg_catalog_conf`):

- a REST catalog that takes requests only with credentials: the stack's Iceberg REST fixture
  server behind the relay (tests/support/relay.py), which refuses with 401 every request lacking
  the bearer token (or, with an OAuth2 `credential`, any bearer token) and the header the config
  names, as a secured server (Polaris, Unity, Gravitino) does; the secrets come through `${env:}`;
- a SQL catalog on PostgreSQL: `catalog.request_timeout` reaches PgJDBC, so Spark's read of a
  table whose catalog row another session holds locked fails at the timeout instead of hanging.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from icekeeper.common.catalog import open_catalog
from icekeeper.common.config import IcekeeperConfig, load_config
from tests.support.pipeline import register_catalog
from tests.support.relay import Relay, lacking, refuse

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROWS = 25
TENANT_HEADER = "X-Icekeeper-Tenant"


def catalog_config(
    tmp_path: Path, properties: dict[str, str], secrets: dict[str, str], timeout: str = "60s"
) -> IcekeeperConfig:
    """A config whose catalog is `properties` (secrets as `${env:NAME}`, from `secrets`), under a
    catalog name of its own: the test session shares one SparkSession."""
    return load_config(
        None,
        environ={
            "ICEKEEPER__STATE_DIR": str(tmp_path),
            "ICEKEEPER__CATALOG__NAME": f"cat_{uuid.uuid4().hex[:8]}",
            "ICEKEEPER__CATALOG__REQUEST_TIMEOUT": timeout,
            "ICEKEEPER__CATALOG__PROPERTIES": json.dumps(properties),
            **secrets,
        },
    )


def new_table(config: IcekeeperConfig) -> str:
    """A table of `ROWS` rows that pyiceberg (the bookkeeper's side) creates; its identifier."""
    catalog = open_catalog(config)
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    table = catalog.create_table(f"{namespace}.events", pa.schema([("id", pa.int64())]))
    table.append(pa.table({"id": pa.array(range(ROWS), pa.int64())}))
    return f"{namespace}.events"


def spark_count(spark, config: IcekeeperConfig, identifier: str) -> int:
    return spark.sql(f"SELECT count(*) FROM {config.catalog.name}.{identifier}").first()[0]


@pytest.mark.parametrize("auth", ["token", "credential"])
def test_spark_reads_through_a_rest_catalog_that_requires_credentials(
    rest_catalog, spark, tmp_path: Path, auth: str
) -> None:
    relay = Relay(rest_catalog.address())
    secret = f"s3cret-{uuid.uuid4().hex}"
    if auth == "token":
        bearer = f"Authorization: Bearer {secret}".encode()
        auth_properties = {"token": "${env:CATALOG_TOKEN}"}
    else:
        # Exchanged at the token endpoint (the fixture server answers it) for a bearer token.
        bearer = b"Authorization: Bearer "
        auth_properties = {
            "credential": "${env:CATALOG_TOKEN}",
            "scope": "catalog",
            "oauth2-server-uri": f"{relay.address}/v1/oauth/tokens",
        }
    relay.arm(
        lacking(bearer, f"{TENANT_HEADER}: shop".encode(), unless=b"/v1/oauth/tokens"),
        refuse(401),
        times=1_000_000,
    )
    try:
        config = catalog_config(
            tmp_path,
            {
                **rest_catalog.pyiceberg_properties(),
                "uri": relay.address,
                **auth_properties,
                f"header.{TENANT_HEADER}": "shop",
            },
            {"CATALOG_TOKEN": f"icekeeper:{secret}" if auth == "credential" else secret},
        )
        identifier = new_table(config)
        assert relay.faulted == 0  # pyiceberg authenticates (it always did)
        before = len(relay.requests)
        register_catalog(spark, config)
        assert spark_count(spark, config, identifier) == ROWS
        spark_requests = relay.requests[before:]
        assert any(line.startswith("GET /v1/config") for line in spark_requests), spark_requests
        assert any("/tables/events" in line for line in spark_requests), spark_requests
        if auth == "credential":
            assert any("POST /v1/oauth/tokens" in line for line in spark_requests), spark_requests
        assert relay.faulted == 0, f"refused without credentials: {spark_requests}"
    finally:
        relay.close()


def test_spark_s_postgresql_catalog_gives_up_at_the_request_timeout(
    pg_catalog, spark, tmp_path: Path
) -> None:
    import psycopg

    config = catalog_config(tmp_path, pg_catalog.pyiceberg_properties(), {}, timeout="2s")
    identifier = new_table(config)
    register_catalog(spark, config)
    assert spark_count(spark, config, identifier) == ROWS  # Spark's pool is connected

    conninfo = pg_catalog.pyiceberg_properties()["uri"].replace("postgresql+psycopg", "postgresql")
    with psycopg.connect(conninfo) as locker:
        # Another session holds the catalog's table (a stuck migration, a long transaction).
        locker.execute("LOCK TABLE iceberg_tables IN ACCESS EXCLUSIVE MODE")
        pid = locker.info.backend_pid

        def release() -> None:  # without the timeout, Spark's read would wait for ever
            with psycopg.connect(conninfo, autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s)", (pid,))

        releaser = threading.Timer(30, release)
        releaser.start()
        started = time.monotonic()
        try:
            with pytest.raises(Exception, match="statement timeout"):
                spark_count(spark, config, identifier)
            waited = time.monotonic() - started
        finally:
            releaser.cancel()
    assert waited < 15, f"Spark's read gave up after {waited:.1f}s, not at the 2s timeout"
    assert spark_count(spark, config, identifier) == ROWS  # the pool serves the next read

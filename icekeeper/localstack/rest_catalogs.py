"""The stack's Iceberg REST catalogs: Iceberg's own REST server and Nessie.

- `rest` (`stack up --with rest`): `RESTCatalogServer` from Iceberg's test fixtures, the server the
  Iceberg project tests its REST clients against. It wraps a JdbcCatalog, here on a SQLite file
  under the state folder so tables survive a restart, with S3FileIO on the stack's S3 server. It is
  a test fixture, not a production server: it listens on every interface (not configurable) and
  logs its configuration, S3 key included (the stack's published one).
- `nessie` (`stack up --with nessie`): Nessie 0.99, a production REST catalog (Quarkus), serving
  the Iceberg REST API under `/iceberg` with its warehouse on the stack's S3 server and its commits
  in RocksDB under the state folder. Needs Java 21+ (found like the registry's JDK).

Both are configured for clients the same way: `type=rest`, the server's URI, and the `s3.*`
properties (neither vends credentials).
"""

from __future__ import annotations

import json
import urllib.request

from icekeeper.common.artifacts import MavenBundle, Progress, maven_bundle, maven_file
from icekeeper.localstack.catalog_service import CatalogService
from icekeeper.localstack.java import find_java
from icekeeper.localstack.services import LaunchSpec, port_open

_JETTY_VERSION = "12.1.12"
_HADOOP_CLIENT_VERSION = "3.4.2"
_SQLITE_JDBC_VERSION = "3.54.1.0"
_SLF4J_VERSION = "2.0.17"


def _get_json(url: str, timeout_s: float = 2.0) -> dict | None:
    """The JSON body of a 200 answer to GET `url`, or None for any other answer or none."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return json.load(response) if response.status == 200 else None
    except (OSError, ValueError):
        return None


def _lists_namespaces(base_url: str) -> bool:
    """True when an Iceberg REST server at `base_url` answers `GET /v1/config` and then lists
    namespaces (under the prefix its config names)."""
    config = _get_json(f"{base_url}/v1/config")
    if config is None:
        return False
    prefix = (config.get("overrides") or {}).get("prefix") or (config.get("defaults") or {}).get(
        "prefix"
    )
    namespaces_url = f"{base_url}/v1/{prefix}/namespaces" if prefix else f"{base_url}/v1/namespaces"
    listed = _get_json(namespaces_url)
    return listed is not None and "namespaces" in listed


def _rest_duckdb_attach(alias: str, endpoint: str) -> str:
    # No vended credentials: DuckDB must use the S3 secret as configured.
    return (
        f"ATTACH '' AS {alias} (TYPE iceberg, ENDPOINT '{endpoint}', "
        "AUTHORIZATION_TYPE 'none', ACCESS_DELEGATION_MODE 'none')"
    )


class RestCatalogService(CatalogService):
    """Iceberg's REST fixture server: a SQLite catalog file, files on S3."""

    name = "rest"

    def address(self) -> str:
        return f"http://{self.stack.host}:{self.stack.rest_catalog_port}"

    def ports(self) -> list[int]:
        return [self.stack.rest_catalog_port]

    def bundle(self) -> MavenBundle:
        version = self.stack.iceberg_version
        return MavenBundle(
            name=f"iceberg-rest-fixture-{version}",
            # The test-fixtures jar's pom lists no dependencies: they are named here (Iceberg's
            # open-api/build.gradle): the JdbcCatalog and REST adapter in iceberg-core (and its
            # tests jar), S3FileIO, Jetty, Hadoop's configuration classes, SQLite, a logger.
            coordinates=(
                f"org.apache.iceberg:iceberg-open-api:{version}:test-fixtures",
                f"org.apache.iceberg:iceberg-core:{version}",
                f"org.apache.iceberg:iceberg-core:{version}:tests",
                f"org.apache.iceberg:iceberg-aws:{version}",
                f"org.apache.iceberg:iceberg-aws-bundle:{version}",
                f"org.eclipse.jetty.ee10:jetty-ee10-servlet:{_JETTY_VERSION}",
                f"org.eclipse.jetty.compression:jetty-compression-gzip:{_JETTY_VERSION}",
                f"org.eclipse.jetty.compression:jetty-compression-server:{_JETTY_VERSION}",
                f"org.apache.hadoop:hadoop-client-api:{_HADOOP_CLIENT_VERSION}",
                f"org.apache.hadoop:hadoop-client-runtime:{_HADOOP_CLIENT_VERSION}",
                f"org.xerial:sqlite-jdbc:{_SQLITE_JDBC_VERSION}",
                f"org.slf4j:slf4j-simple:{_SLF4J_VERSION}",
            ),
        )

    def prepare(self, progress: Progress) -> LaunchSpec:
        jars = maven_bundle(self.cache_dir, self.bundle(), progress)
        java = find_java(17, purpose=f"the Iceberg {self.stack.iceberg_version} REST catalog")
        self.home.mkdir(parents=True, exist_ok=True)
        command = [
            java,
            "-Xms64m",
            "-Xmx512m",
            "-Djava.awt.headless=true",
            "-cp",
            str(jars[0].parent / "*"),
            "org.apache.iceberg.rest.RESTCatalogServer",
        ]
        return LaunchSpec(command=command, cwd=self.home, environment=self._environment())

    def _environment(self) -> dict[str, str]:
        """The server's catalog properties: it reads `CATALOG_*` variables, `__` standing for `-`
        and `_` for `.` (CATALOG_S3_ACCESS__KEY__ID is `s3.access-key-id`)."""
        properties = {
            "rest.port": str(self.stack.rest_catalog_port),
            # A file, not the default in-memory SQLite: the catalog outlives a restart.
            "uri": f"jdbc:sqlite:{self.home / 'catalog.db'}",
            "jdbc.schema-version": "V1",
            "warehouse": self.warehouse(),
            **self.storage.iceberg_java_properties(),
        }
        return {
            "CATALOG_" + key.replace("-", "__").replace(".", "_").upper(): value
            for key, value in properties.items()
        }

    def healthy(self) -> bool:
        return port_open(self.stack.host, self.stack.rest_catalog_port) and _lists_namespaces(
            self.address()
        )

    def pyiceberg_properties(self) -> dict[str, str]:
        return {"type": "rest", "uri": self.address(), **self.storage.pyiceberg_properties()}

    def iceberg_catalog_properties(self) -> dict[str, str]:
        return {"type": "rest", "uri": self.address()}

    def duckdb_statements(self, alias: str) -> list[str]:
        return [*self.storage.duckdb_statements(), _rest_duckdb_attach(alias, self.address())]


class NessieService(CatalogService):
    """Nessie's Quarkus server: Iceberg REST under `/iceberg`, commits in RocksDB, files on S3."""

    name = "nessie"

    def address(self) -> str:
        return f"http://{self.stack.host}:{self.stack.nessie_port}/iceberg"

    def ports(self) -> list[int]:
        return [self.stack.nessie_port, self.stack.nessie_management_port]

    def prepare(self, progress: Progress) -> LaunchSpec:
        version = self.stack.nessie_version
        runner = maven_file(
            self.cache_dir,
            f"org.projectnessie.nessie:nessie-quarkus:{version}",
            classifier="runner",
            progress=progress,
        )
        java = find_java(21, self.stack.registry_java_home, purpose=f"Nessie {version}")
        self.home.mkdir(parents=True, exist_ok=True)
        command = [
            java,
            "-Xms64m",
            "-Xmx512m",
            "-Djava.awt.headless=true",
            # RocksDB's JNI library; without it Java 24+ warns at every start.
            "--enable-native-access=ALL-UNNAMED",
            *(f"-D{key}={value}" for key, value in self._settings().items()),
            "-jar",
            str(runner),
        ]
        return LaunchSpec(command=command, cwd=self.home)

    def _settings(self) -> dict[str, str]:
        host = self.stack.host
        s3 = "nessie.catalog.service.s3.default-options"
        secret = "icekeeper-stack.s3"
        return {
            "quarkus.http.host": host,
            "quarkus.http.port": str(self.stack.nessie_port),
            "quarkus.management.host": host,
            "quarkus.management.port": str(self.stack.nessie_management_port),
            "quarkus.otel.sdk.disabled": "true",
            "quarkus.log.level": "WARN",
            "quarkus.log.console.level": "WARN",
            # RocksDB under the state folder: branches and commits outlive a restart.
            "nessie.version.store.type": "ROCKSDB",
            "nessie.version.store.persist.rocks.database-path": str(self.home / "rocksdb"),
            "nessie.catalog.default-warehouse": "warehouse",
            "nessie.catalog.warehouses.warehouse.location": self.warehouse(),
            f"{s3}.endpoint": self.storage.address(),
            f"{s3}.path-style-access": "true",
            f"{s3}.region": self.stack.s3_region,
            f"{s3}.request-signing-enabled": "false",
            # Nessie takes keys only as references to secrets; this one is in its own config.
            f"{s3}.access-key": f"urn:nessie-secret:quarkus:{secret}",
            f"{secret}.name": self.stack.s3_access_key_id,
            f"{secret}.secret": self.stack.s3_secret_access_key,
        }

    def healthy(self) -> bool:
        return port_open(self.stack.host, self.stack.nessie_port) and _lists_namespaces(
            self.address()
        )

    def pyiceberg_properties(self) -> dict[str, str]:
        return {"type": "rest", "uri": self.address(), **self.storage.pyiceberg_properties()}

    def iceberg_catalog_properties(self) -> dict[str, str]:
        return {"type": "rest", "uri": self.address()}

    def duckdb_statements(self, alias: str) -> list[str]:
        return [*self.storage.duckdb_statements(), _rest_duckdb_attach(alias, self.address())]

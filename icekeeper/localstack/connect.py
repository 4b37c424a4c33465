"""Kafka Connect standalone with Debezium's MariaDB
and PostgreSQL connectors and Apicurio's converters.

The worker is Kafka's own (`connect-runtime` + `connect-json`, the stack's Kafka version) from
Maven Central, started once Kafka answers. Its `plugin.path` holds Debezium's connector plugins
(their `plugin` tar.gz, unpacked as published) and Apicurio's converter with its dependencies, so
a connector can write Avro in Confluent framing through the stack's registry. Connectors are
registered over the REST API (`icekeeper/localstack/cdc.py`); standalone mode keeps source offsets
in a file under the service's folder and forgets connectors on restart.
"""

from __future__ import annotations

from pathlib import Path

from icekeeper.common.artifacts import (
    MavenBundle,
    Progress,
    maven_bundle,
    maven_file_url,
    unpacked_archive,
)
from icekeeper.localstack.java import find_java
from icekeeper.localstack.services import LaunchSpec, Service, http_status

DEBEZIUM_CONNECTORS = ("mariadb", "postgres")
"""Debezium connector plugins on the worker's plugin path
(`io.debezium:debezium-connector-<name>`)."""

_LOG4J_VERSION = "2.25.5"


class KafkaConnectService(Service):
    """One Kafka Connect worker in standalone mode, REST on the stack's host and
    `stack.connect_port`."""

    name = "connect"
    needs = ("kafka",)

    def address(self) -> str:
        return f"http://{self.stack.host}:{self.stack.connect_port}"

    def ports(self) -> list[int]:
        return [self.stack.connect_port]

    @property
    def offsets_path(self) -> Path:
        return self.home / "connect.offsets"

    def runtime_bundle(self) -> MavenBundle:
        version = self.stack.kafka_version
        return MavenBundle(
            name=f"kafka-connect-{version}",
            coordinates=(
                f"org.apache.kafka:connect-runtime:{version}",
                f"org.apache.kafka:connect-json:{version}",
                # As for the broker: no logging backend in the
                # poms, and Kafka 4 logs through SLF4J 1.7.
                f"org.apache.logging.log4j:log4j-slf4j-impl:{_LOG4J_VERSION}",
                f"org.apache.logging.log4j:log4j-core:{_LOG4J_VERSION}",
            ),
        )

    def converter_bundle(self) -> MavenBundle:
        return MavenBundle(
            name=f"apicurio-registry-utils-converter-{self.stack.apicurio_converter_version}",
            coordinates=(
                f"io.apicurio:apicurio-registry-utils-converter:{self.stack.apicurio_converter_version}",
            ),
            # The worker provides Kafka's own classes. Connect never loads kafka-clients or
            # connect-api from a plugin, but does load connect-json from one: Apicurio's 3.9 copy
            # calls Utils.mkSet, gone in Kafka 4.
            exclusions=(
                "org.apache.kafka:kafka-clients",
                "org.apache.kafka:connect-api",
                "org.apache.kafka:connect-json",
            ),
        )

    def plugin_path(self, progress: Progress) -> list[Path]:
        """Folders for `plugin.path`, fetched on first use: each holds one plugin folder."""
        folders = []
        for connector in DEBEZIUM_CONNECTORS:
            coordinate = f"io.debezium:debezium-connector-{connector}:{self.stack.debezium_version}"
            url = maven_file_url(coordinate, classifier="plugin", extension="tar.gz")
            # Unpacks to <folder>/debezium-connector-<connector>/*.jar: one plugin.
            folders.append(
                unpacked_archive(
                    self.cache_dir,
                    f"debezium-connector-{connector}-{self.stack.debezium_version}",
                    url,
                    progress,
                )
            )
        converter_jars = maven_bundle(self.cache_dir, self.converter_bundle(), progress)
        folders.append(converter_jars[0].parent.parent)  # <bundle>/lib/*.jar: one plugin named lib
        return folders

    def prepare(self, progress: Progress) -> LaunchSpec:
        jars = maven_bundle(self.cache_dir, self.runtime_bundle(), progress)
        plugin_path = self.plugin_path(progress)
        java = find_java(17, purpose="Kafka Connect and Debezium 3")
        self.home.mkdir(parents=True, exist_ok=True)
        worker_properties = self.home / "worker.properties"
        worker_properties.write_text(self._worker_properties(plugin_path), encoding="utf-8")
        log_config = self.home / "log4j2.properties"
        log_config.write_text(_log4j2_console_properties(), encoding="utf-8")
        command = [
            java,
            "-Xms128m",
            "-Xmx512m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log_config}",
            "-cp",
            str(jars[0].parent / "*"),
            "org.apache.kafka.connect.cli.ConnectStandalone",
            str(worker_properties),
        ]
        return LaunchSpec(command=command, cwd=self.home)

    def _worker_properties(self, plugin_path: list[Path]) -> str:
        host, port = self.stack.host, self.stack.connect_port
        settings = {
            "bootstrap.servers": f"{host}:{self.stack.kafka_port}",
            "listeners": f"http://{host}:{port}",
            "rest.advertised.host.name": host,
            "rest.advertised.port": str(port),
            # Worker defaults; every connector cdc.py registers names its own converters.
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "offset.storage.file.filename": str(self.offsets_path),
            # Offsets reach the file (and GET /connectors/<name>/offsets) within a second.
            "offset.flush.interval.ms": "1000",
            "plugin.path": ",".join(str(folder) for folder in plugin_path),
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def healthy(self) -> bool:
        # The REST server answers 503 until the worker has scanned its plugins and started.
        return http_status(f"{self.address()}/connectors") == 200


def _log4j2_console_properties() -> str:
    # Standard output is the service's log file; Kafka's clients print every config at INFO.
    return (
        "status = error\n"
        "appender.out.type = Console\n"
        "appender.out.name = out\n"
        "appender.out.layout.type = PatternLayout\n"
        "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
        "rootLogger.level = INFO\n"
        "rootLogger.appenderRef.out.ref = out\n"
        "logger.clients.name = org.apache.kafka.clients\nlogger.clients.level = WARN\n"
        "logger.common.name = org.apache.kafka.common\nlogger.common.level = WARN\n"
        "logger.reflections.name = org.reflections\nlogger.reflections.level = ERROR\n"
        "logger.jetty.name = org.eclipse.jetty\nlogger.jetty.level = WARN\n"
    )

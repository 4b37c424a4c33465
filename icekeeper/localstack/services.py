"""The local services: Kafka (KRaft), Apicurio Registry, Azurite queue and blob.

Each service knows how to fetch what it runs on, how to start, and how to tell it is ready.
`stack.py` runs them as detached processes with pid files; nothing here keeps state. The
optional services `stack up --with ...` adds follow the same pattern in their own modules:
MariaDB and PostgreSQL in `databases.py`, Kafka Connect with Debezium in `connect.py`.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import urllib.error
import urllib.request
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from icekeeper.common.artifacts import (
    MavenBundle,
    Progress,
    maven_bundle,
    maven_file_url,
    npm_package,
    unpacked_archive,
)
from icekeeper.localstack.java import find_java
from icekeeper.localstack.settings import StackConfig

AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
"""Azurite's published development account and key (not a secret)."""


@dataclass(frozen=True)
class LaunchSpec:
    """How to start a service process.

    Attributes:
        command: the program and its arguments.
        cwd: its working folder.
        environment: variables added to ours.
        user: run it as this system user (we are root, the server refuses to be); it is then the
            process `stack down` signals, with no `runuser` in between to turn a clean shutdown
            into a kill.
    """

    command: list[str]
    cwd: Path
    environment: dict[str, str] = field(default_factory=dict)
    user: str | None = None


class Service(ABC):
    """One local service: fetch, prepare, launch and health-check."""

    name: str
    needs: tuple[str, ...] = ()
    """Services that must answer before this one is launched (Kafka Connect exits without Kafka)."""
    stop_signal: signal.Signals = signal.SIGTERM
    """What `stack down` sends the service's process group to stop it cleanly."""

    def __init__(self, stack: StackConfig, state_dir: Path, cache_dir: Path) -> None:
        self.stack = stack
        self.state_dir = state_dir
        self.home = state_dir / "stack" / self.name
        self.cache_dir = cache_dir

    @property
    def log_path(self) -> Path:
        return self.home / f"{self.name}.log"

    @abstractmethod
    def address(self) -> str:
        """What clients connect to."""

    @abstractmethod
    def prepare(self, progress: Progress) -> LaunchSpec:
        """Fetch what is missing, write config files, return how to launch."""

    @abstractmethod
    def healthy(self) -> bool:
        """True when the service answers its protocol, not merely listens."""

    def port_in_use(self) -> bool:
        return any(port_open(self.stack.host, port) for port in self.ports())

    @abstractmethod
    def ports(self) -> list[int]:
        """Ports this service binds."""


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout_s)
        return probe.connect_ex((host, port)) == 0


def http_status(url: str, timeout_s: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (OSError, ValueError):
        return None


class KafkaService(Service):
    """Apache Kafka 4.x, one combined broker + controller in KRaft mode, from Maven Central jars."""

    name = "kafka"

    def address(self) -> str:
        return f"{self.stack.host}:{self.stack.kafka_port}"

    def ports(self) -> list[int]:
        return [self.stack.kafka_port, self.stack.kafka_controller_port]

    def bundle(self) -> MavenBundle:
        log4j = "2.25.5"
        return MavenBundle(
            name=f"kafka-{self.stack.kafka_version}",
            coordinates=(
                f"org.apache.kafka:kafka_2.13:{self.stack.kafka_version}",
                # Kafka's pom has no logging backend; Kafka 4 still logs through SLF4J 1.7.
                f"org.apache.logging.log4j:log4j-slf4j-impl:{log4j}",
                f"org.apache.logging.log4j:log4j-core:{log4j}",
            ),
        )

    def prepare(self, progress: Progress) -> LaunchSpec:
        jars = maven_bundle(self.cache_dir, self.bundle(), progress)
        java = find_java(17, purpose="Kafka 4")
        classpath = str(jars[0].parent / "*")
        data_dir = self.home / "data"
        self.home.mkdir(parents=True, exist_ok=True)
        server_properties = self.home / "server.properties"
        server_properties.write_text(self._server_properties(data_dir), encoding="utf-8")
        log_config = self.home / "log4j2.properties"
        log_config.write_text(_log4j2_properties(self.home / "server.log"), encoding="utf-8")
        jvm = [
            java,
            "-Xms128m",
            "-Xmx512m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log_config}",
            "-cp",
            classpath,
        ]
        if not (data_dir / "meta.properties").exists():
            progress("formatting Kafka storage (KRaft)")
            cluster_id = subprocess.run(
                jvm + ["kafka.tools.StorageTool", "random-uuid"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            # A static quorum (controller.quorum.voters) is formatted without --standalone.
            subprocess.run(
                jvm
                + [
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(server_properties),
                    *self._format_options(),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
        return LaunchSpec(command=jvm + ["kafka.Kafka", str(server_properties)], cwd=self.home)

    def _format_options(self) -> list[str]:
        """Extra options of `kafka-storage format` (SCRAM users of a secured broker)."""
        return []

    def _listener_properties(self) -> dict[str, str]:
        """The broker's listeners: plaintext clients on `kafka_port`, the controller beside it."""
        host, port, controller = (
            self.stack.host,
            self.stack.kafka_port,
            self.stack.kafka_controller_port,
        )
        return {
            "controller.quorum.voters": f"1@{host}:{controller}",
            "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller}",
            "advertised.listeners": f"PLAINTEXT://{host}:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        }

    def _server_properties(self, data_dir: Path) -> str:
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            **self._listener_properties(),
            "log.dirs": str(data_dir),
            "num.partitions": "3",
            "auto.create.topics.enable": "true",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "5",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Keep records regardless of age: the seed sample carries its 2022 Kafka timestamps,
            # which time-based retention (7 days by default) deletes within a minute of start-up.
            "log.retention.ms": "-1",
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def client_config(self) -> dict[str, str]:
        """What a librdkafka client of this broker is given to connect."""
        return {"bootstrap.servers": self.address()}

    def healthy(self) -> bool:
        if not port_open(self.stack.host, self.ports()[0]):
            return False
        from confluent_kafka.admin import AdminClient  # heavy import, only when probing

        try:
            admin = AdminClient({**self.client_config(), "socket.timeout.ms": 2000})
            metadata = admin.list_topics(timeout=2)
            return bool(metadata.brokers)
        except Exception:  # noqa: BLE001 - any client error means "not ready yet"
            return False


def _log4j2_properties(log_file: Path) -> str:
    return (
        "status = error\n"
        "appender.file.type = File\n"
        "appender.file.name = file\n"
        f"appender.file.fileName = {log_file}\n"
        "appender.file.layout.type = PatternLayout\n"
        "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
        "rootLogger.level = INFO\n"
        "rootLogger.appenderRef.file.ref = file\n"
        "logger.kafka.name = kafka\nlogger.kafka.level = WARN\n"
        "logger.apache.name = org.apache.kafka\nlogger.apache.level = WARN\n"
    )


class RegistryService(Service):
    """Apicurio Registry 3.x, in-memory, serving the Confluent API under `/apis/ccompat/v7`."""

    name = "registry"

    def address(self) -> str:
        return f"http://{self.stack.host}:{self.stack.registry_port}/apis/ccompat/v7"

    def ports(self) -> list[int]:
        return [self.stack.registry_port, self.stack.registry_management_port]

    def prepare(self, progress: Progress) -> LaunchSpec:
        version = self.stack.registry_version
        url = maven_file_url(
            f"io.apicurio:apicurio-registry-app:{version}", classifier="all", extension="tar.gz"
        )
        unpacked = unpacked_archive(self.cache_dir, f"apicurio-registry-{version}", url, progress)
        # The archive's layout changed across 3.x releases; find the runner wherever it is.
        runner = next(iter(sorted(unpacked.rglob("quarkus-run.jar"))), None)
        if runner is None:
            raise FileNotFoundError(f"no quarkus-run.jar in {unpacked}")
        java = find_java(21, self.stack.registry_java_home, purpose=f"Apicurio Registry {version}")
        self.home.mkdir(parents=True, exist_ok=True)
        command = [
            java,
            "-Xms128m",
            "-Xmx512m",
            "-Djava.awt.headless=true",
            f"-Dquarkus.http.host={self.stack.host}",
            f"-Dquarkus.http.port={self.stack.registry_port}",
            f"-Dquarkus.management.host={self.stack.host}",
            f"-Dquarkus.management.port={self.stack.registry_management_port}",
            "-Dquarkus.otel.enabled=false",
            "-Dquarkus.otel.sdk.disabled=true",
            "-Dquarkus.http.access-log.enabled=false",
            "-Dquarkus.log.level=WARN",
            "-jar",
            str(runner),
        ]
        return LaunchSpec(command=command, cwd=self.home)

    def healthy(self) -> bool:
        return http_status(f"{self.address()}/subjects") == 200


class _AzuriteService(Service):
    """Azurite from npm (pinned); in-memory, silent, no telemetry."""

    binary: str
    port_option: str

    def port(self) -> int:
        raise NotImplementedError

    def ports(self) -> list[int]:
        return [self.port()]

    def address(self) -> str:
        return f"http://{self.stack.host}:{self.port()}/{AZURITE_ACCOUNT}"

    def prepare(self, progress: Progress) -> LaunchSpec:
        bin_dir = npm_package(self.cache_dir, "azurite", self.stack.azurite_version, progress)
        self.home.mkdir(parents=True, exist_ok=True)
        host_option = self.port_option.replace("Port", "Host")
        command = [
            str(bin_dir / self.binary),
            host_option,
            self.stack.host,
            self.port_option,
            str(self.port()),
            "--inMemoryPersistence",
            "--silent",
            "--disableTelemetry",
            "--skipApiVersionCheck",
        ]
        return LaunchSpec(command=command, cwd=self.home)

    def healthy(self) -> bool:
        # Any HTTP answer (Azurite says 400/403 to an unsigned request) means it serves.
        return http_status(f"{self.address()}?comp=list&probe={uuid.uuid4().hex[:6]}") is not None


class AzuriteQueueService(_AzuriteService):
    name = "azurite-queue"
    binary = "azurite-queue"
    port_option = "--queuePort"

    def port(self) -> int:
        return self.stack.azurite_queue_port

    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"QueueEndpoint={self.address()};"
        )


class AzuriteBlobService(_AzuriteService):
    name = "azurite-blob"
    binary = "azurite-blob"
    port_option = "--blobPort"

    def port(self) -> int:
        return self.stack.azurite_blob_port


def all_services(stack: StackConfig, state_dir: Path, cache_dir: Path) -> list[Service]:
    """The stack's services, in start order."""
    return [
        service(stack, state_dir, cache_dir)
        for service in (KafkaService, RegistryService, AzuriteQueueService, AzuriteBlobService)
    ]

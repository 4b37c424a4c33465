"""docker-compose.yaml cannot run here (no Docker), so check what a user would rely on."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from icekeeper.localstack.settings import StackConfig

REPO_ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((REPO_ROOT / "docker-compose.yaml").read_text(encoding="utf-8"))
SERVICES = COMPOSE["services"]
STACK = StackConfig()


def host_ports(service: str) -> set[int]:
    return {int(mapping.split(":")[-2]) for mapping in SERVICES[service].get("ports", [])}


def test_it_has_the_stack_services_and_a_cdc_source() -> None:
    assert {"kafka", "registry", "azurite", "mariadb", "connect"} <= set(SERVICES)


def test_images_are_official_and_pinned_to_the_embedded_stacks_versions() -> None:
    images = {name: service["image"] for name, service in SERVICES.items()}
    assert images["kafka"] == f"apache/kafka:{STACK.kafka_version}"
    assert images["registry"] == f"apicurio/apicurio-registry:{STACK.registry_version}"
    assert images["azurite"] == f"mcr.microsoft.com/azure-storage/azurite:{STACK.azurite_version}"
    assert images["mariadb"].startswith("mariadb:")
    assert images["connect"].startswith("quay.io/debezium/connect:")
    assert all(":" in image and not image.endswith(":latest") for image in images.values())


def test_host_ports_match_the_embedded_defaults_so_one_config_serves_both() -> None:
    assert host_ports("kafka") == {STACK.kafka_port}
    assert host_ports("registry") == {STACK.registry_port}
    assert host_ports("azurite") == {STACK.azurite_blob_port, STACK.azurite_queue_port}
    assert all(
        mapping.startswith("127.0.0.1:")
        for service in SERVICES.values()
        for mapping in service.get("ports", [])
    )


def test_kafka_runs_kraft_and_advertises_an_address_containers_can_reach() -> None:
    env = SERVICES["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert f"127.0.0.1:{STACK.kafka_port}" in env["KAFKA_ADVERTISED_LISTENERS"]
    internal = next(
        part.split("//")[1]
        for part in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
        if "kafka:" in part
    )
    assert SERVICES["connect"]["environment"]["BOOTSTRAP_SERVERS"] == internal


def test_connect_waits_for_healthy_dependencies_and_every_service_has_a_healthcheck() -> None:
    depends = SERVICES["connect"]["depends_on"]
    assert all(
        depends[name]["condition"] == "service_healthy" for name in ("kafka", "registry", "mariadb")
    )
    assert all(
        "healthcheck" in SERVICES[name]
        for name in ("kafka", "registry", "azurite", "mariadb", "connect")
    )


def test_mariadb_writes_a_row_binlog_and_the_connector_reads_it_into_seed_topics() -> None:
    command = SERVICES["mariadb"]["command"]
    assert (
        "--binlog-format=ROW" in command
        and "--binlog-row-image=FULL" in command
        and "--log-bin" in command
    )
    connector = json.loads(
        (REPO_ROOT / "docker" / "mariadb-connector.json").read_text(encoding="utf-8")
    )
    assert connector["connector.class"] == "io.debezium.connector.mariadb.MariaDbConnector"
    assert (
        connector["topic.prefix"] == "test"
        and connector["database.include.list"] == "db_gb18030_test"
    )
    for mount in SERVICES["mariadb"]["volumes"] + SERVICES["connector-init"]["volumes"]:
        assert (REPO_ROOT / mount.split(":")[0]).exists(), mount

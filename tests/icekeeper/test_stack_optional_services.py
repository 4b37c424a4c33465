"""Choosing and checking the stack's optional storage and catalog services, without running them:
what `--with` brings along, the JDK each runs on, and health checks that speak each service's
protocol rather than trusting an open port."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from icekeeper.common.config import load_config
from icekeeper.localstack import java
from icekeeper.localstack.stack import OPTIONAL_SERVICES, LocalStack, with_dependencies
from tests.support.stack import second_stack_ports, stack_environ


def test_a_catalog_brings_the_s3_server_and_a_database_brings_connect() -> None:
    assert with_dependencies(["rest"]) == ["s3", "rest"]
    wanted = ["pg-catalog", "nessie", "hms"]
    assert with_dependencies(wanted) == ["s3", "nessie", "hms", "pg-catalog"]
    assert with_dependencies(["s3"]) == ["s3"]
    assert with_dependencies(["mariadb"]) == ["mariadb", "connect"]


def test_every_optional_service_is_offered_by_the_command_line() -> None:
    from icekeeper.cli import OPTIONAL_SERVICE_NAMES, build_parser

    assert set(OPTIONAL_SERVICE_NAMES) == set(OPTIONAL_SERVICES)
    arguments = build_parser().parse_args(["stack", "up", "--with", "s3,rest", "nessie"])
    assert arguments.with_services == [["s3", "rest"], ["nessie"]]


def fake_jdk(root: Path, major: int) -> str:
    home = root / f"jdk-{major}"
    (home / "bin").mkdir(parents=True)
    program = home / "bin" / "java"
    program.write_text(f"#!/bin/sh\necho 'openjdk version \"{major}.0.1\" 2026-01-01' >&2\n")
    program.chmod(0o755)
    return str(program)


def test_a_program_a_newer_jdk_breaks_gets_the_newest_it_runs_on(
    tmp_path: Path, monkeypatch
) -> None:
    """The Hive Metastore's Hadoop 3.1 fails on Java 23+ (Subject.getSubject): with 17 and 25
    installed it must get 17, while everything else still gets the newest."""
    javas = [fake_jdk(tmp_path, 17), fake_jdk(tmp_path, 25)]
    monkeypatch.setattr(java, "candidate_javas", lambda preferred_home=None: javas)
    assert java.find_java(17) == javas[1]
    assert java.find_java(17, max_major=21) == javas[0]
    with pytest.raises(java.JavaNotFound, match="needs Java 18 to 21"):
        java.find_java(18, max_major=21)


@pytest.fixture
def impostor_ports(tmp_path: Path) -> Iterator[LocalStack]:
    """A stack config whose storage and catalog ports are held by a server that accepts
    connections and answers every request with an HTTP 404."""
    ports = second_stack_ports(6_500)
    config = load_config(None, environ=stack_environ(tmp_path / "state", ports))
    names = ["s3", "rest", "nessie", "hms", "pg-catalog"]
    stack = LocalStack(config, only=names, with_services=names)
    listeners = []
    for service in stack.services:
        listener = socket.create_server(("127.0.0.1", service.ports()[0]))
        listeners.append(listener)
        threading.Thread(target=_answer_404, args=(listener,), daemon=True).start()
    try:
        yield stack
    finally:
        for listener in listeners:
            listener.close()


def _answer_404(listener: socket.socket) -> None:
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        with connection:
            connection.settimeout(2)
            try:
                connection.recv(65536)
                connection.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass


@pytest.mark.timeout(120)
def test_a_port_that_answers_is_not_yet_a_healthy_service(impostor_ports: LocalStack) -> None:
    """Each health check speaks the service's protocol (ListBuckets, list namespaces, Thrift,
    a PostgreSQL login) instead of trusting an open port."""
    assert {service.name for service in impostor_ports.services} == {
        "s3",
        "rest",
        "nessie",
        "hms",
        "pg-catalog",
    }
    for service in impostor_ports.services:
        assert service.port_in_use()
        assert not service.healthy(), service.name

"""The local stack as `icekeeper stack up | down | status` runs it: real processes, real ports."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from icekeeper.common.config import load_config
from icekeeper.localstack.stack import LocalStack, StackError
from tests.support.stack import second_stack_ports, stack_environ

pytestmark = pytest.mark.integration


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_status_shows_every_service_running_with_its_address(local_stack: LocalStack) -> None:
    statuses = {status.name: status for status in local_stack.status()}
    assert set(statuses) == {"kafka", "registry", "azurite-queue", "azurite-blob"}
    assert all(status.state == "running" and status.pid for status in statuses.values())
    stack = local_stack.stack
    assert statuses["kafka"].address == f"127.0.0.1:{stack.kafka_port}"
    assert statuses["registry"].address.endswith(f":{stack.registry_port}/apis/ccompat/v7")


def test_up_again_is_idempotent(local_stack: LocalStack) -> None:
    pids_before = {status.name: status.pid for status in local_stack.status()}
    report = local_stack.up(progress=lambda message: None)
    assert report.started == []
    assert {status.name: status.pid for status in local_stack.status()} == pids_before


def test_a_whole_second_stack_starts_and_down_leaves_no_process(tmp_path: Path) -> None:
    ports = second_stack_ports(6_000)
    stack = LocalStack(load_config(None, environ=stack_environ(tmp_path / "state", ports)))
    started = time.monotonic()
    report = stack.up(progress=lambda message: None)
    print(f"second stack up in {time.monotonic() - started:.1f}s")
    try:
        assert sorted(report.started) == ["azurite-blob", "azurite-queue", "kafka", "registry"]
        pids = [status.pid for status in stack.status()]
        assert all(pid and pid_alive(pid) for pid in pids)
    finally:
        stopped = stack.down(progress=lambda message: None)
    assert sorted(stopped) == ["azurite-blob", "azurite-queue", "kafka", "registry"]
    assert not any(pid_alive(pid) for pid in pids)
    assert not any(port_open(port) for port in ports.values())
    assert all(status.state == "stopped" for status in stack.status())


def test_down_stops_only_what_up_started(tmp_path: Path) -> None:
    """A port held by someone else is reported as foreign, refused by `up`, untouched by `down`."""
    ports = second_stack_ports(6_100)
    stack = LocalStack(
        load_config(None, environ=stack_environ(tmp_path / "state", ports)), only=["azurite-queue"]
    )
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", ports["azurite_queue_port"]))
        squatter.listen()
        assert stack.status()[0].state == "foreign"
        with pytest.raises(StackError, match="already in use"):
            stack.up(progress=lambda message: None)
        assert stack.down(progress=lambda message: None) == []
        assert port_open(ports["azurite_queue_port"])

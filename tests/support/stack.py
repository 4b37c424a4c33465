"""The test session's local stack: its ports, its state folder, and the environment that points a
config at it.

Integration tests run against the same `LocalStack` code as `icekeeper stack up`, on ports of
their own (so a developer's running stack is left alone) and a state folder under
`.icekeeper/test-stack`; the fixtures that start it are in tests/conftest.py.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


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
        "kafka_sasl_port": 19094,
        "kafka_sasl_controller_port": 19095,
        "registry_auth_port": 18082,
        # The storage and catalog services, in a range of their own (23000-25999 after any
        # offset a checkout uses), clear of the ports above shifted by another's offset.
        "s3_port": 23900,
        "rest_catalog_port": 23181,
        "nessie_port": 23120,
        "nessie_management_port": 23121,
        "hive_metastore_port": 23083,
        "pg_catalog_port": 25433,
    }.items()
}


def second_stack_ports(shift: int) -> dict[str, int]:
    """The session's test ports moved by `shift`, for a second stack beside it. Keep every port
    below Linux's ephemeral range (32768+, `ip_local_port_range`): a port there can be taken by
    any outgoing connection between the stack's check and its server's bind (s3proxy "Failed to
    bind to 127.0.0.1:34300" failed a CI run); shifts of 3,000-7,200 clear the session's ports."""
    ports = {name: port + shift for name, port in TEST_STACK_PORTS.items()}
    if _PORT_OFFSET == 0:  # another checkout's offset is its own choice
        assert max(ports.values()) < 32768, f"shift {shift} reaches the ephemeral port range"
    return ports


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

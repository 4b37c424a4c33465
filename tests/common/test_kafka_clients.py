"""One source's security settings, as each client library is given them (no services needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from icekeeper.common.config import load_config
from icekeeper.common.config.loader import ConfigError
from icekeeper.common.config.model import KafkaSource
from icekeeper.common.config.secrets import MASK, masked_dump
from icekeeper.common.kafka_clients import (
    connection_environ,
    java_client_properties,
    librdkafka_config,
    registry_client_config,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SASL_PASSWORD = 'sasl-pw-"quoted"\\slash'
REGISTRY_PASSWORD = "registry-pw-9f8e7d"


def secured_environ() -> dict[str, str]:
    security = {
        "protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_username": "writer",
        "sasl_password": "${env:TEST_SASL_PASSWORD}",
        "ssl_ca_location": "/etc/kafka/ca.pem",
    }
    return {
        "ICEKEEPER__SOURCES__0__BOOTSTRAP_SERVERS": "broker-1:9094,broker-2:9094",
        "ICEKEEPER__SOURCES__0__SECURITY": json.dumps(security),
        "ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_URL": "https://registry:8081",
        "ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_USERNAME": "reader",
        "ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_PASSWORD": "${env:TEST_REGISTRY_PASSWORD}",
        "ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_CA_LOCATION": "/etc/registry/ca.pem",
        "TEST_SASL_PASSWORD": SASL_PASSWORD,
        "TEST_REGISTRY_PASSWORD": REGISTRY_PASSWORD,
    }


def test_the_java_client_gets_a_jaas_login_and_a_pem_trust_store() -> None:
    source = load_config(None, environ=secured_environ()).sources[0]
    assert java_client_properties(source) == {
        "bootstrap.servers": "broker-1:9094,broker-2:9094",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        # Quotes and backslashes in the password are escaped as Kafka's JAAS parser reads them.
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="writer" password="sasl-pw-\\"quoted\\"\\\\slash";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/etc/kafka/ca.pem",
        "ssl.endpoint.identification.algorithm": "https",
    }


def test_librdkafka_gets_the_same_settings_in_its_own_names() -> None:
    source = load_config(None, environ=secured_environ()).sources[0]
    assert librdkafka_config(source, {"group.id": "status"}) == {
        "bootstrap.servers": "broker-1:9094,broker-2:9094",
        "security.protocol": "sasl_ssl",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "writer",
        "sasl.password": SASL_PASSWORD,
        "ssl.ca.location": "/etc/kafka/ca.pem",
        "ssl.endpoint.identification.algorithm": "https",
        "group.id": "status",
    }
    # A plaintext source (the default) gets nothing beyond its servers and protocol.
    assert librdkafka_config(KafkaSource()) == {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "plaintext",
    }


def test_the_registry_client_gets_basic_auth_and_the_ca() -> None:
    source = load_config(None, environ=secured_environ()).sources[0]
    assert registry_client_config(source) == {
        "url": "https://registry:8081",
        "timeout": 30.0,
        "basic.auth.user.info": f"reader:{REGISTRY_PASSWORD}",
        "ssl.ca.location": "/etc/registry/ca.pem",
    }


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            {"ICEKEEPER__SOURCES__0__SECURITY": "{protocol: SASL_SSL, sasl_username: u}"},
            "needs sasl_username and sasl_password",
        ),
        (
            {"ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_USERNAME": "reader"},
            "set both schema_registry_username and schema_registry_password",
        ),
        (
            {
                "ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_URL": "http://a:b@registry:8081",
                "ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_USERNAME": "reader",
                "ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_PASSWORD": "pw",
            },
            "credentials given twice",
        ),
    ],
)
def test_incomplete_or_doubled_credentials_are_config_errors(
    overrides: dict[str, str], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config(None, environ=overrides)


def test_another_process_gets_the_connection_with_passwords_only_as_references() -> None:
    source = load_config(None, environ=secured_environ()).sources[0]
    environ = connection_environ(source)
    overrides = {key: value for key, value in environ.items() if key.startswith("ICEKEEPER__")}
    assert all(
        SASL_PASSWORD not in value and REGISTRY_PASSWORD not in value
        for value in overrides.values()
    )
    again = load_config(None, environ=environ).sources[0]
    assert again.security == source.security
    assert librdkafka_config(again) == librdkafka_config(source)
    assert registry_client_config(again) == registry_client_config(source)


def test_config_show_masks_the_sasl_and_registry_passwords() -> None:
    config = load_config(None, environ=secured_environ())
    dumped = masked_dump(config)["sources"][0]
    assert dumped["security"]["sasl_password"] == MASK
    assert dumped["schema_registry_password"] == MASK
    shown = subprocess.run(
        [sys.executable, "-m", "icekeeper.cli", "config", "show"],
        env={**os.environ, **secured_environ()},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(shown)["sources"][0]["security"]["sasl_username"] == "writer"
    for password in (SASL_PASSWORD, REGISTRY_PASSWORD, json.dumps(SASL_PASSWORD)[1:-1]):
        assert password not in shown and password not in repr(config)


def test_a_registry_that_never_answers_is_an_outage_not_a_hang() -> None:
    """A registry that takes connections and never answers (a stuck proxy, a paused JVM): the
    writer's registry client gives up after `schema_registry_timeout` and the writer pauses, as
    for any outage. Without a timeout the client waited for ever (chaos saw a 14-minute hang)."""
    import socket
    import threading

    from icekeeper.writers.registry import RegistryUnavailable, TopicSchemas

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held = []
    threading.Thread(
        target=lambda: [held.append(listener.accept()) for _ in range(16)], daemon=True
    ).start()
    source = KafkaSource(
        schema_registry_url=f"http://127.0.0.1:{listener.getsockname()[1]}",
        schema_registry_timeout="0.3s",
    )
    outcome: list[BaseException | None] = []

    def ask() -> None:
        try:
            TopicSchemas(source).subjects()
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - the test inspects it
            outcome.append(error)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    asker.join(30)
    listener.close()
    assert not asker.is_alive(), "the registry client still waits"
    assert isinstance(outcome[0], RegistryUnavailable)

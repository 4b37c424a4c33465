"""Secrets in the config: referenced, not written;
never printed by `config show`, `repr` or logs."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.config import ConfigError, load_config
from icekeeper.common.logs import JsonLineFormatter
from tests.support.shop_items import bookkeeper_config

REPO_ROOT = Path(__file__).resolve().parents[2]
ICEKEEPER_CLI = str(Path(sys.executable).parent / "icekeeper")
AZURITE_ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
REGISTRY_PASSWORD = "registry-pw-4f1c"
JAAS_PASSWORD = "jaas-pw-9d2e"
QUEUE_KEY = "queue-account-key-77aa"
CATALOG_TOKEN = "catalog-token-31bb"


def secret_config(tmp_path: Path) -> Path:
    """A config that takes each kind of secret from an environment variable or a file."""
    (tmp_path / "queue-key").write_text(f"{QUEUE_KEY}\n", encoding="utf-8")
    (tmp_path / "kafka.properties").write_text(
        "# mounted from the cluster's secret store\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="ik" password="{JAAS_PASSWORD}";\n',
        encoding="utf-8",
    )
    queue_connection = (
        "DefaultEndpointsProtocol=https;AccountName=prod;"
        f"AccountKey=${{file:{tmp_path}/queue-key}};EndpointSuffix=core.windows.net"
    )
    path = tmp_path / "icekeeper.yaml"
    path.write_text(
        f"""
state_dir: {tmp_path / "state"}
sources:
  - topics: [orders]
    schema_registry_url: "https://icekeeper:${{env:REGISTRY_PASSWORD}}@registry.example:8081/apis/ccompat/v7"
    consumer_properties:
      security.protocol: SASL_SSL
      sasl.mechanism: SCRAM-SHA-512
      sasl.jaas.config: "${{file:{tmp_path}/kafka.properties:sasl.jaas.config}}"
tables:
  - identifier: shop.orders
    topics: [orders]
transport:
  kind: azure-queue
  connection_string: "{queue_connection}"
catalog:
  properties: {{type: rest, uri: "https://catalog.example", token: "${{env:CATALOG_TOKEN}}"}}
""",
        encoding="utf-8",
    )
    return path


SECRET_ENVIRON = {"REGISTRY_PASSWORD": REGISTRY_PASSWORD, "CATALOG_TOKEN": CATALOG_TOKEN}
SECRETS = [REGISTRY_PASSWORD, JAAS_PASSWORD, QUEUE_KEY, CATALOG_TOKEN]


def test_secrets_come_from_environment_variables_and_files(tmp_path: Path) -> None:
    config = load_config(secret_config(tmp_path), environ=SECRET_ENVIRON)
    source = config.sources[0]
    assert (
        source.schema_registry_url
        == f"https://icekeeper:{REGISTRY_PASSWORD}@registry.example:8081/apis/ccompat/v7"
    )
    assert source.consumer_properties["sasl.jaas.config"].endswith(
        f'username="ik" password="{JAAS_PASSWORD}";'
    )
    assert source.consumer_properties["security.protocol"] == "SASL_SSL"
    assert config.transport.connection_string.get_secret_value() == (
        f"DefaultEndpointsProtocol=https;AccountName=prod;AccountKey={QUEUE_KEY};EndpointSuffix=core.windows.net"
    )
    assert config.catalog.properties["token"] == CATALOG_TOKEN


def test_an_environment_override_may_reference_a_secret_too(tmp_path: Path) -> None:
    config = load_config(
        None,
        environ={
            "ICEKEEPER__STATE_DIR": str(tmp_path),
            "KAFKA_KEY_PASSWORD": "k3y-pw",
            "ICEKEEPER__SOURCES__0__CONSUMER_PROPERTIES": "{ssl.key.password: "
            "'${env:KAFKA_KEY_PASSWORD}'}",
        },
    )
    assert config.sources[0].consumer_properties == {"ssl.key.password": "k3y-pw"}


def test_a_missing_variable_or_file_is_an_error_that_names_the_key(tmp_path: Path) -> None:
    path = secret_config(tmp_path)
    with pytest.raises(ConfigError) as missing_variable:
        load_config(path, environ={"CATALOG_TOKEN": CATALOG_TOKEN})
    assert str(missing_variable.value) == (
        f"config error in {path}: sources[0].schema_registry_url: "
        "${env:REGISTRY_PASSWORD}: environment variable REGISTRY_PASSWORD is not set"
    )
    (tmp_path / "queue-key").unlink()
    with pytest.raises(ConfigError) as missing_file:
        load_config(path, environ=SECRET_ENVIRON)
    assert "transport.connection_string" in str(
        missing_file.value
    ) and "queue-key}: no such file" in str(missing_file.value)
    (tmp_path / "kafka.properties").write_text("sasl.mechanism=PLAIN\n", encoding="utf-8")
    (tmp_path / "queue-key").write_text(QUEUE_KEY, encoding="utf-8")
    with pytest.raises(ConfigError) as missing_key:
        load_config(path, environ=SECRET_ENVIRON)
    assert "sources[0].consumer_properties.sasl.jaas.config" in str(missing_key.value)
    assert "has no key 'sasl.jaas.config'" in str(missing_key.value)


def test_config_show_prints_no_secret(tmp_path: Path) -> None:
    shown = subprocess.run(
        [ICEKEEPER_CLI, "config", "show", "--config", str(secret_config(tmp_path))],
        env={"PATH": "/usr/bin:/bin", **SECRET_ENVIRON},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for secret in SECRETS:
        assert secret not in shown
    resolved = json.loads(shown)
    assert (
        resolved["sources"][0]["schema_registry_url"]
        == "https://icekeeper:**********@registry.example:8081/apis/ccompat/v7"
    )
    assert resolved["sources"][0]["consumer_properties"] == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "**********",
    }
    assert resolved["transport"]["connection_string"] == "**********"
    assert resolved["catalog"]["properties"] == {
        "type": "rest",
        "uri": "https://catalog.example",
        "token": "**********",
    }


def test_config_show_hides_secrets_written_inline_as_well(tmp_path: Path) -> None:
    path = tmp_path / "inline.yaml"
    path.write_text(
        """
sources:
  - topics: [orders]
    schema_registry_url: "http://icekeeper:inline-registry-pw@127.0.0.1:8081/apis/ccompat/v7"
    consumer_properties: {ssl.key.password: inline-key-pw, max.poll.records: "500"}
tables: [{identifier: shop.orders, topics: [orders]}]
transport: {kind: azure-queue}
writer:
  spark_conf:
    spark.hadoop.fs.azure.account.key.prod.dfs.core.windows.net: inline-storage-key
    spark.sql.shuffle.partitions: "8"
""",
        encoding="utf-8",
    )
    shown = subprocess.run(
        [ICEKEEPER_CLI, "config", "show", "--config", str(path)],
        env={"PATH": "/usr/bin:/bin"},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for secret in [
        "inline-registry-pw",
        "inline-key-pw",
        "inline-storage-key",
        AZURITE_ACCOUNT_KEY,
    ]:
        assert secret not in shown
    assert '"max.poll.records": "500"' in shown and '"spark.sql.shuffle.partitions": "8"' in shown


def test_a_config_printed_whole_shows_no_secret(tmp_path: Path) -> None:
    config = load_config(secret_config(tmp_path), environ=SECRET_ENVIRON)
    for printed in (
        repr(config),
        str(config),
        f"{config.sources[0]}",
        repr(config.transport),
        repr(config.catalog),
    ):
        for secret in SECRETS:
            assert secret not in printed
    assert "**********" in repr(config.transport)


def test_log_lines_mask_secrets_that_reach_them(tmp_path: Path, monkeypatch) -> None:
    from icekeeper.common.config import secrets

    # The secrets this process remembered so far are masked too: earlier tests' (a catalog
    # password "icekeeper", say) would mask the user name this test expects to see.
    monkeypatch.setattr(secrets, "known_secret_values", set())
    config = load_config(secret_config(tmp_path), environ=SECRET_ENVIRON)
    jaas = config.sources[0].consumer_properties["sasl.jaas.config"]
    try:
        raise ConnectionError(
            f"cannot connect with {config.transport.connection_string.get_secret_value()}"
        )
    except ConnectionError:
        record = logging.getLogger("icekeeper.test").makeRecord(
            "icekeeper.test",
            logging.ERROR,
            __file__,
            1,
            "registry %s refused the login",
            (config.sources[0].schema_registry_url,),
            sys.exc_info(),
            extra={"consumer": jaas, "settings": {"token": CATALOG_TOKEN}},
        )
    line = JsonLineFormatter().format(record)
    for secret in SECRETS:
        assert secret not in line
    logged = json.loads(line)
    assert (
        logged["msg"]
        == "registry https://icekeeper:**********@registry.example:8081/apis/ccompat/v7 refused "
        "the login"
    )
    assert logged["exc"].endswith("ConnectionError: cannot connect with **********")


def test_log_lines_mask_passwords_nobody_declared() -> None:
    record = logging.makeLogRecord(
        {
            "name": "icekeeper.test",
            "levelno": logging.WARNING,
            "levelname": "WARNING",
            "msg": "retrying http://svc:undeclared-pw@10.0.0.1:8081 with "
            "password=other-pw;AccountKey=abc123==",
        }
    )
    line = JsonLineFormatter().format(record)
    assert "undeclared-pw" not in line and "other-pw" not in line and "abc123" not in line


@pytest.mark.parametrize(
    ("overrides", "host"), [({}, "127.0.0.1"), ({"bookkeeper__http_host": "0.0.0.0"}, "0.0.0.0")]
)
def test_the_metrics_endpoint_listens_on_loopback_unless_configured(
    tmp_path: Path, overrides: dict[str, str], host: str
) -> None:
    bookkeeper = Bookkeeper(bookkeeper_config(tmp_path, **overrides))
    bookkeeper.serve_http(port=0)
    try:
        assert bookkeeper.http.server.server_address[0] == host
    finally:
        bookkeeper.http.stop()

"""pyiceberg's REST catalog properties as Spark's Iceberg RESTCatalog takes them
(common/rest_catalog.py, common/spark.py `iceberg_catalog_conf`): the credentials, headers and
signing pyiceberg authenticates with reach Spark under Java's names, with the same timeouts;
nothing secret is shown by what icekeeper prints. Without services; the check against a real
REST server is in tests/common/test_spark_catalogs.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

from icekeeper.common.config import load_config
from icekeeper.common.config.secrets import MASK, mask_text, masked_dump
from icekeeper.common.rest_catalog import rest_catalog_packages, rest_catalog_properties
from icekeeper.common.spark import SECRET_CONF_REGEX, iceberg_catalog_conf, storage_packages

OAUTH2 = {
    "type": "rest",
    "uri": "https://polaris.example.com/api/catalog",
    "warehouse": "lake",
    "credential": "client-id:client-secret",
    "scope": "PRINCIPAL_ROLE:ALL",
    "oauth2-server-uri": "https://polaris.example.com/api/catalog/v1/oauth/tokens",
    "audience": "polaris",
    "resource": "urn:lake",
    "token-refresh-enabled": "true",
    "prefix": "lake",
    "header.X-Iceberg-Access-Delegation": "vended-credentials",
    "header.X-Tenant": "shop",
    "py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO",
    "ssl.cabundle": "/etc/ssl/ca.pem",
    "s3.region": "eu-west-1",
}


def test_oauth2_credentials_headers_and_addressing_reach_spark_under_the_same_names() -> None:
    mapped = rest_catalog_properties(OAUTH2)
    assert mapped == {
        "uri": "https://polaris.example.com/api/catalog",
        "warehouse": "lake",
        "credential": "client-id:client-secret",
        "scope": "PRINCIPAL_ROLE:ALL",
        "oauth2-server-uri": "https://polaris.example.com/api/catalog/v1/oauth/tokens",
        "audience": "polaris",
        "resource": "urn:lake",
        "token-refresh-enabled": "true",
        "prefix": "lake",
        "header.X-Iceberg-Access-Delegation": "vended-credentials",
        "header.X-Tenant": "shop",
    }
    assert rest_catalog_properties({"type": "rest", "uri": "http://r", "token": "t0k3n"}) == {
        "uri": "http://r",
        "token": "t0k3n",
    }
    assert rest_catalog_packages(OAUTH2, "1.11.0") == ()


def test_sigv4_signing_takes_java_names_and_the_aws_sdk() -> None:
    glue = {
        "type": "rest",
        "uri": "https://glue.eu-west-1.amazonaws.com/iceberg",
        "warehouse": "123456789012",
        "rest.sigv4-enabled": "true",
        "rest.signing-name": "glue",
        "client.region": "eu-west-1",
        "client.access-key-id": "AKIAEXAMPLE",
        "client.secret-access-key": "aws-secret",
        "client.session-token": "aws-session",
    }
    assert rest_catalog_properties(glue) == {
        "uri": "https://glue.eu-west-1.amazonaws.com/iceberg",
        "warehouse": "123456789012",
        "rest.auth.type": "sigv4",
        "rest.signing-name": "glue",
        "rest.signing-region": "eu-west-1",
        "rest.access-key-id": "AKIAEXAMPLE",
        "rest.secret-access-key": "aws-secret",
        "rest.session-token": "aws-session",
    }
    # Java's own names, where the properties give them, win over pyiceberg's.
    assert (
        rest_catalog_properties({**glue, "rest.signing-region": "us-east-1"})["rest.signing-region"]
        == "us-east-1"
    )
    assert rest_catalog_packages(glue, "1.11.0") == (
        "org.apache.iceberg:iceberg-aws-bundle:1.11.0",
    )


def test_the_request_timeout_bounds_spark_s_rest_client_unless_set() -> None:
    mapped = rest_catalog_properties({"type": "rest", "uri": "http://r"}, 2.5)
    assert mapped["rest.client.connection-timeout-ms"] == "2500"
    assert mapped["rest.client.socket-timeout-ms"] == "2500"
    own = {"type": "rest", "uri": "http://r", "rest.client.socket-timeout-ms": "900000"}
    assert rest_catalog_properties(own, 2.5)["rest.client.socket-timeout-ms"] == "900000"


def test_a_config_s_secrets_reach_spark_and_are_shown_nowhere(tmp_path: Path) -> None:
    environ = {
        "ICEKEEPER__STATE_DIR": str(tmp_path),
        "ICEKEEPER__CATALOG__NAME": "lake",
        "ICEKEEPER__CATALOG__REQUEST_TIMEOUT": "30s",
        "ICEKEEPER__CATALOG__PROPERTIES": json.dumps(
            {
                "type": "rest",
                "uri": "http://rest.example:8181",
                "credential": "${env:CATALOG_CLIENT}",
                "header.Authorization": "Bearer literal-bearer-value",
                "rest.sigv4-enabled": "true",
                "client.secret-access-key": "${file:" + str(tmp_path / "aws-secret") + "}",
            }
        ),
        "CATALOG_CLIENT": "lake-client:client-secret-value",
    }
    (tmp_path / "aws-secret").write_text("aws-secret-value\n")
    config = load_config(None, environ=environ)
    conf = iceberg_catalog_conf(config)
    assert conf["spark.sql.catalog.lake.credential"] == "lake-client:client-secret-value"
    assert conf["spark.sql.catalog.lake.header.Authorization"] == "Bearer literal-bearer-value"
    assert conf["spark.sql.catalog.lake.rest.secret-access-key"] == "aws-secret-value"
    assert conf["spark.sql.catalog.lake.rest.client.socket-timeout-ms"] == "30000"
    assert "org.apache.iceberg:iceberg-aws-bundle:1.11.0" in storage_packages(config)

    shown = json.dumps(masked_dump(config)) + mask_text(str(conf))
    for secret in ("client-secret-value", "literal-bearer-value", "aws-secret-value"):
        assert secret not in shown
    assert MASK in shown
    # Spark redacts the same settings wherever it lists its own (event logs, --verbose).
    for key in conf:
        if any(name in key for name in ("credential", "Authorization", "secret-access-key")):
            assert re.search(SECRET_CONF_REGEX, key), key

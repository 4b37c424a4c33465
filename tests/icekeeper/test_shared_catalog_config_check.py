"""`config check --connect` on the shared catalogs (issue 28, items 3 and 6): it opens the
configured Hive Metastore or PostgreSQL catalog and names what fails, in one line each, and
never prints a secret: not the password a user got wrong, not one in a catalog URL."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from icekeeper.common import exit_codes
from tests.icekeeper.test_cli import CLOSED_PORT, icekeeper

WRONG_PASSWORD = "not-the-pw-8d1f"


def catalog_config(folder: Path, properties: dict[str, str]) -> Path:
    """A complete config on `properties`; its Kafka and registry refuse connections."""
    path = folder / "icekeeper.yaml"
    path.write_text(
        f"state_dir: {folder / 'state'}\n"
        f"sources: [{{name: prod, bootstrap_servers: '{CLOSED_PORT}', "
        f"schema_registry_url: 'http://{CLOSED_PORT}', topics: [cdc.shop.orders]}}]\n"
        "tables: [{identifier: shop.orders, topics: [cdc.shop.orders], source: prod}]\n"
        f"catalog: {{name: shared, properties: {json.dumps(properties)}}}\n",
        encoding="utf-8",
    )
    return path


def catalog_lines(output: str) -> list[str]:
    """The report's lines about the catalog (what was opened, what failed)."""
    return [
        line
        for line in output.splitlines()
        if line.split(": ", 1)[-1].startswith("catalog:") or line.strip().startswith("catalog:")
    ]


@pytest.mark.integration
def test_a_wrong_postgres_password_is_named_without_the_password(
    pg_catalog, tmp_path: Path
) -> None:
    properties = pg_catalog.pyiceberg_properties()
    right = properties["uri"].split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    wrong = {**properties, "uri": properties["uri"].replace(f":{right}@", f":{WRONG_PASSWORD}@")}
    checked = icekeeper("config", "check", "--connect", "-c", str(catalog_config(tmp_path, wrong)))
    output = checked.stdout + checked.stderr
    assert checked.returncode != exit_codes.OK, output
    [line] = catalog_lines(checked.stdout)
    assert line.startswith("unreachable: catalog:") and "password authentication failed" in line
    assert WRONG_PASSWORD not in output and "Traceback" not in output

    good = icekeeper(
        "config", "check", "--connect", "-c", str(catalog_config(tmp_path, properties))
    )
    assert "catalog: shared opened" in good.stdout, good.stdout + good.stderr
    assert properties["uri"] not in good.stdout + good.stderr


@pytest.mark.integration
def test_the_metastore_is_opened_and_an_unreachable_one_is_one_line(
    hive_metastore, tmp_path: Path
) -> None:
    properties = hive_metastore.pyiceberg_properties()
    good = icekeeper(
        "config", "check", "--connect", "-c", str(catalog_config(tmp_path, properties))
    )
    assert "catalog: shared opened" in good.stdout, good.stdout + good.stderr
    assert properties["s3.secret-access-key"] not in good.stdout + good.stderr

    down = {**properties, "uri": f"thrift://{CLOSED_PORT}"}
    checked = icekeeper("config", "check", "--connect", "-c", str(catalog_config(tmp_path, down)))
    assert checked.returncode == exit_codes.UNAVAILABLE, checked.stdout + checked.stderr
    [line] = catalog_lines(checked.stdout)
    assert line.startswith("unreachable: catalog:") and CLOSED_PORT.split(":")[1] in line
    assert "Traceback" not in checked.stdout + checked.stderr


def test_a_sql_catalog_spark_cannot_open_is_named_without_its_password(tmp_path: Path) -> None:
    properties = {
        "type": "sql",
        "uri": f"mysql+pymysql://icekeeper:{WRONG_PASSWORD}@db.example:3306/catalog",
        "warehouse": f"file://{tmp_path}/warehouse",
    }
    checked = icekeeper("config", "check", "-c", str(catalog_config(tmp_path, properties)))
    output = checked.stdout + checked.stderr
    assert checked.returncode == exit_codes.USAGE, output
    assert "catalog.properties" in output and re.search(r"icekeeper:\*+@db\.example", output)
    assert WRONG_PASSWORD not in output


def test_a_secret_an_error_quotes_is_masked_in_the_report(tmp_path: Path) -> None:
    """A client's error that quotes a secret of the config (a REST catalog's `credential` or
    `header.Authorization` value, resolved from `${env:}`) is reported with it masked."""
    from icekeeper.common.config import load_config
    from icekeeper.config_check import ConfigCheck

    secret = "client-id:s3cret-for-the-check"
    config = load_config(
        None,
        environ={
            "ICEKEEPER__STATE_DIR": str(tmp_path),
            "ICEKEEPER__CATALOG__PROPERTIES": json.dumps(
                {"type": "rest", "uri": "http://rest.example", "credential": "${env:CLIENT}"}
            ),
            "CLIENT": secret,
        },
    )
    check = ConfigCheck("icekeeper.yaml", config)
    check.unreachable.append(f"catalog: OAuthError: invalid_client for {secret}")
    report = "\n".join(check.lines())
    assert "unreachable: catalog: OAuthError: invalid_client for" in report
    assert secret not in report

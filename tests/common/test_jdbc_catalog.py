"""pyiceberg's SQL catalog URL as Spark's JdbcCatalog takes it (common/jdbc_catalog.py): the same
database, the credentials apart, and a URL Spark cannot open named without its password."""

from __future__ import annotations

import pytest

from icekeeper.common.jdbc_catalog import (
    POSTGRES_JDBC_DRIVER,
    jdbc_catalog_properties,
    jdbc_driver,
    redacted,
)


def test_a_postgres_url_becomes_a_jdbc_url_with_its_credentials_apart() -> None:
    uri = "postgresql+psycopg://ice%40keeper:p%3Ass@db.example:5433/catalog?sslmode=require"
    assert jdbc_catalog_properties(uri) == {
        "uri": "jdbc:postgresql://db.example:5433/catalog?sslmode=require",
        "jdbc.schema-version": "V1",
        "jdbc.user": "ice@keeper",
        "jdbc.password": "p:ss",
    }
    assert jdbc_driver(uri) == POSTGRES_JDBC_DRIVER


def test_sqlite_stays_as_it_was() -> None:
    # `//tmp/...`: the same absolute path to SQLite's JDBC driver, as before this module.
    assert jdbc_catalog_properties("sqlite:////tmp/state/catalog.db") == {
        "uri": "jdbc:sqlite://tmp/state/catalog.db",
        "jdbc.schema-version": "V1",
    }
    assert jdbc_driver("sqlite:////tmp/state/catalog.db") is None


def test_a_database_spark_cannot_open_is_named_without_its_password() -> None:
    with pytest.raises(ValueError, match=r"mysql\+pymysql://me:\*\*\*@db:3306/c") as raised:
        jdbc_catalog_properties("mysql+pymysql://me:secret@db:3306/c")
    assert "secret" not in str(raised.value)
    assert redacted("postgresql://me@db/c") == "postgresql://me@db/c"

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


def test_a_postgres_catalog_gets_the_driver_s_timeouts() -> None:
    """`catalog.request_timeout` bounds Spark's JdbcCatalog as it bounds pyiceberg's SqlCatalog:
    PgJDBC's own properties (JdbcCatalog hands it `jdbc.*`), the server's through `options`."""
    uri = "postgresql+psycopg://icekeeper:pw@db.example:5432/catalog?sslmode=require"
    assert jdbc_catalog_properties(uri, 10) == {
        "uri": "jdbc:postgresql://db.example:5432/catalog?sslmode=require",
        "jdbc.schema-version": "V1",
        "jdbc.user": "icekeeper",
        "jdbc.password": "pw",
        "jdbc.connectTimeout": "10",
        "jdbc.loginTimeout": "10",
        "jdbc.socketTimeout": "12",
        "jdbc.tcpKeepAlive": "true",
        "jdbc.options": "-c statement_timeout=10000 -c idle_in_transaction_session_timeout=10000",
    }
    assert jdbc_catalog_properties(uri) == jdbc_catalog_properties(uri, None)
    assert "jdbc.connectTimeout" not in jdbc_catalog_properties(uri)
    assert "jdbc.options" not in jdbc_catalog_properties("sqlite:////tmp/c.db", 10)


def test_what_the_url_sets_itself_is_kept_for_spark_too() -> None:
    uri = (
        "postgresql://u:p@h/d?connect_timeout=30&keepalives=0&socketTimeout=600"
        "&options=-c%20statement_timeout%3D5000%20-c%20search_path%3Dcatalogs&sslmode=verify-full"
    )
    properties = jdbc_catalog_properties(uri, 10)
    # libpq's names give PgJDBC's theirs; PgJDBC's own in the URL win there (not set again).
    assert properties["jdbc.connectTimeout"] == "30"
    assert properties["jdbc.tcpKeepAlive"] == "false"
    assert "jdbc.socketTimeout" not in properties
    # The URL's options, with what they do not name added, move to the property.
    assert properties["jdbc.options"] == (
        "-c statement_timeout=5000 -c search_path=catalogs "
        "-c idle_in_transaction_session_timeout=10000"
    )
    assert properties["uri"] == (
        "jdbc:postgresql://h/d?connect_timeout=30&keepalives=0&socketTimeout=600"
        "&sslmode=verify-full"
    )
    # An empty `options=` (PgBouncer refuses them) adds none; the URL stays as written.
    bouncer = jdbc_catalog_properties("postgresql://u:p@h:6432/d?options=", 10)
    assert "jdbc.options" not in bouncer
    assert bouncer["uri"] == "jdbc:postgresql://h:6432/d?options="

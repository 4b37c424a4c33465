"""A pyiceberg SQL catalog as Spark opens it: Iceberg's JdbcCatalog on the same database.

pyiceberg's `SqlCatalog` takes an SQLAlchemy URL (`sqlite:///...`,
`postgresql+psycopg://user:password@host:port/database`); Iceberg's `JdbcCatalog` takes a JDBC URL
with the credentials apart (`jdbc.user`, `jdbc.password`) and the driver's jar on Spark's
classpath. Both keep the catalog's tables in the same `iceberg_tables` layout (Iceberg's schema
V1, which pyiceberg writes) under the catalog's name, so the writer, the bookkeeper and the reaper
see the same tables when Spark's catalog name is pyiceberg's.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

POSTGRES_JDBC_DRIVER = "org.postgresql:postgresql:42.7.8"
SQLITE_JDBC_DRIVER = "org.xerial:sqlite-jdbc:3.50.3.0"

_POSTGRES_SCHEMES = ("postgresql", "postgresql+psycopg", "postgresql+psycopg2", "postgres")


def redacted(uri: str) -> str:
    """`uri` with the password of its user part, if any, replaced by `***`: fit for a message."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.rsplit("@", 1)
    return uri.replace(netloc[0] + "@", f"{parts.username}:***@", 1)


def jdbc_catalog_properties(uri: str) -> dict[str, str]:
    """Iceberg JdbcCatalog properties (`uri`, `jdbc.*`) for pyiceberg's SqlCatalog `uri`;
    `ValueError` (naming the URL without its password) for a database Spark cannot open here."""
    if uri.startswith("sqlite:///"):
        return {"uri": "jdbc:sqlite:" + uri.removeprefix("sqlite://"), "jdbc.schema-version": "V1"}
    parts = urlsplit(uri)
    if parts.scheme in _POSTGRES_SCHEMES and parts.hostname:
        address = parts.hostname + (f":{parts.port}" if parts.port else "")
        properties = {
            "uri": f"jdbc:postgresql://{address}{parts.path}"
            + (f"?{parts.query}" if parts.query else ""),
            "jdbc.schema-version": "V1",
        }
        if parts.username:
            properties["jdbc.user"] = unquote(parts.username)
        if parts.password is not None:
            properties["jdbc.password"] = unquote(parts.password)
        return properties
    raise ValueError(
        f"catalog.properties.uri {redacted(uri)!r}: Spark opens SQL catalogs on SQLite and "
        "PostgreSQL here; use a REST catalog otherwise"
    )


def jdbc_driver(uri: str) -> str | None:
    """Maven coordinates of the JDBC driver Spark needs for SqlCatalog `uri` beyond SQLite's."""
    return POSTGRES_JDBC_DRIVER if urlsplit(uri).scheme in _POSTGRES_SCHEMES else None

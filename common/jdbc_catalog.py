"""A pyiceberg SQL catalog as Spark opens it: Iceberg's JdbcCatalog on the same database.

pyiceberg's `SqlCatalog` takes an SQLAlchemy URL (`sqlite:///...`,
`postgresql+psycopg://user:password@host:port/database`); Iceberg's `JdbcCatalog` takes a JDBC URL
with the credentials apart (`jdbc.user`, `jdbc.password`) and the driver's jar on Spark's
classpath. Both keep the catalog's tables in the same `iceberg_tables` layout (Iceberg's schema
V1, which pyiceberg writes) under the catalog's name, so the writer, the bookkeeper and the reaper
see the same tables when Spark's catalog name is pyiceberg's.

Iceberg's JdbcCatalog hands its `jdbc.*` properties (prefix dropped) to the driver, which is how
a PostgreSQL catalog gets the same bounds pyiceberg's gets (`catalog.request_timeout`,
common/catalog.py `postgresql_uri_with_timeouts`) through PgJDBC's own connection properties.
"""

from __future__ import annotations

import math
import re
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

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


def jdbc_catalog_properties(uri: str, timeout_s: float | None = None) -> dict[str, str]:
    """Iceberg JdbcCatalog properties (`uri`, `jdbc.*`) for pyiceberg's SqlCatalog `uri`;
    `ValueError` (naming the URL without its password) for a database Spark cannot open here.

    Args:
        timeout_s: `catalog.request_timeout`: a PostgreSQL catalog's driver gets the timeouts
            `postgresql_jdbc_timeouts` says (none when None).
    """
    if uri.startswith("sqlite:///"):
        return {"uri": "jdbc:sqlite:" + uri.removeprefix("sqlite://"), "jdbc.schema-version": "V1"}
    parts = urlsplit(uri)
    if parts.scheme in _POSTGRES_SCHEMES and parts.hostname:
        address = parts.hostname + (f":{parts.port}" if parts.port else "")
        query = parse_qsl(parts.query, keep_blank_values=True)
        timeouts = {} if timeout_s is None else postgresql_jdbc_timeouts(dict(query), timeout_s)
        url_query = parts.query
        if "jdbc.options" in timeouts and "options" in dict(query):
            # Merged into the property (PgJDBC takes a URL's parameter over a property of the
            # same name): the URL keeps the rest of its query.
            url_query = urlencode([(name, value) for name, value in query if name != "options"])
        properties = {
            "uri": f"jdbc:postgresql://{address}{parts.path}"
            + (f"?{url_query}" if url_query else ""),
            "jdbc.schema-version": "V1",
        }
        if parts.username:
            properties["jdbc.user"] = unquote(parts.username)
        if parts.password is not None:
            properties["jdbc.password"] = unquote(parts.password)
        return {**properties, **timeouts}
    raise ValueError(
        f"catalog.properties.uri {redacted(uri)!r}: Spark opens SQL catalogs on SQLite and "
        "PostgreSQL here; use a REST catalog otherwise"
    )


_LIBPQ_TO_PGJDBC = {"connect_timeout": "connectTimeout", "keepalives": "tcpKeepAlive"}
"""libpq's connection parameters (pyiceberg's URL) with a PgJDBC equivalent of their own."""


def postgresql_jdbc_timeouts(query: dict[str, str], timeout_s: float) -> dict[str, str]:
    """PgJDBC connection properties (as JdbcCatalog's `jdbc.*`) that bound a PostgreSQL catalog's
    sessions in Spark (the writer's, the reaper's) as `postgresql_uri_with_timeouts` bounds
    pyiceberg's, for a URL whose query is `query`; what the URL sets itself is kept.

    Without them PgJDBC waits forever: to connect to a host that drops packets, for the answer of
    a server that stalls (a lock another session holds), and a reaper pass hung with it.

    - `connectTimeout`, `loginTimeout`: to open the connection, and to be let in;
    - `socketTimeout`: a read waits at most a quarter longer than the timeout, so that the
      server's own cancel below comes first when the server still answers;
    - `tcpKeepAlive`: the OS's probes find a peer gone silent (PgJDBC cannot tune them as libpq
      does: the OS's defaults apply);
    - `options`: the server cancels a statement running longer (`statement_timeout`) and ends a
      session its client left idle in a transaction (`idle_in_transaction_session_timeout`).
      Not `idle_session_timeout`, which pyiceberg's side sets: Iceberg's connection pool keeps
      connections idle between the reaper's passes, and the server's `57P05` on the next use is
      not among the states the pool reconnects on (`08000`, `08003`, `08006`, `08007`).

    libpq's `connect_timeout` and `keepalives` in the URL give theirs; PgJDBC's own names in the
    URL win over these properties in the driver; an `options` naming a setting keeps it, and an
    empty `options=` adds none (PgBouncer refuses `options`)."""
    seconds = max(1, math.ceil(timeout_s))
    milliseconds = max(1, round(timeout_s * 1000))
    timeouts = {
        "connectTimeout": str(seconds),
        "loginTimeout": str(seconds),
        "socketTimeout": str(seconds + max(1, seconds // 4)),
        "tcpKeepAlive": "true",
    }
    for libpq_name, pgjdbc_name in _LIBPQ_TO_PGJDBC.items():
        if libpq_name in query:
            value = query[libpq_name]
            timeouts[pgjdbc_name] = (
                ("false" if value.strip() == "0" else "true")
                if pgjdbc_name == "tcpKeepAlive"
                else value
            )
    timeouts = {name: value for name, value in timeouts.items() if name not in query}
    options = query.get("options")
    if options is None or options.strip():
        server_settings = {
            "statement_timeout": milliseconds,
            "idle_in_transaction_session_timeout": milliseconds,
        }
        added = [
            f"-c {name}={value}"
            for name, value in server_settings.items()
            if not re.search(rf"\b{name}\b", options or "")
        ]
        if added:
            timeouts["options"] = " ".join([options or "", *added]).strip()
    return {f"jdbc.{name}": value for name, value in timeouts.items()}


def jdbc_driver(uri: str) -> str | None:
    """Maven coordinates of the JDBC driver Spark needs for SqlCatalog `uri` beyond SQLite's."""
    return POSTGRES_JDBC_DRIVER if urlsplit(uri).scheme in _POSTGRES_SCHEMES else None

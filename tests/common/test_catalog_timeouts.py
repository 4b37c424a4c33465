"""A PostgreSQL catalog's sessions cannot hang for longer than `catalog.request_timeout` (review
finding H2): the URL pyiceberg gets carries the server's and libpq's timeouts
(common/catalog.py). Without services; the bookkeeper's cycles through a real stalled PostgreSQL
and metastore are in tests/bookkeeper/test_shared_catalog_outages.py, the metastore's socket
timeout in tests/common/test_internals.py."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from sqlalchemy.engine import make_url

from icekeeper.common.catalog import postgresql_uri_with_timeouts


def connect_args(uri: str) -> dict[str, str]:
    """What SQLAlchemy's psycopg dialects hand libpq for `uri` (its query, decoded)."""
    return dict(make_url(uri).query)


def test_a_postgresql_url_gets_the_timeouts() -> None:
    password = "p@ss:w/rd?&= +"
    uri = f"postgresql+psycopg://icekeeper:{quote(password, safe='')}@db.example:5432/catalog"
    timed = postgresql_uri_with_timeouts(uri, 10)
    url = make_url(timed)
    assert (url.username, url.password, url.host, url.port, url.database) == (
        "icekeeper",
        password,
        "db.example",
        5432,
        "catalog",
    )
    assert connect_args(timed) == {
        "connect_timeout": "10",
        "keepalives": "1",
        "keepalives_idle": "2",
        "keepalives_interval": "1",
        "keepalives_count": "3",
        "tcp_user_timeout": "10000",
        "options": "-c statement_timeout=10000 -c idle_in_transaction_session_timeout=10000 "
        "-c idle_session_timeout=10000",
    }
    assert postgresql_uri_with_timeouts(timed, 10) == timed  # nothing added twice


def test_what_the_url_sets_itself_is_kept() -> None:
    uri = (
        "postgresql://u:p@h/d?connect_timeout=30&options=-c%20statement_timeout%3D5000"
        "%20-c%20search_path%3Dcatalogs"
    )
    arguments = connect_args(postgresql_uri_with_timeouts(uri, 60))
    assert arguments["connect_timeout"] == "30"
    assert arguments["options"] == (
        "-c statement_timeout=5000 -c search_path=catalogs "
        "-c idle_in_transaction_session_timeout=60000 -c idle_session_timeout=60000"
    )
    # An empty `options=` adds no server setting (PgBouncer refuses `options`); libpq's own
    # timeouts still apply.
    arguments = connect_args(
        postgresql_uri_with_timeouts("postgresql+psycopg2://u:p@h/d?options=", 60)
    )
    assert "options" not in arguments and arguments["tcp_user_timeout"] == "60000"


@pytest.mark.parametrize(
    "uri",
    [
        "sqlite:////tmp/catalog.db",
        "postgresql+pg8000://u:p@h/d",
        "thrift://metastore:9083",
        "http://rest:8181",
        "",
    ],
)
def test_other_urls_are_left_alone(uri: str) -> None:
    assert postgresql_uri_with_timeouts(uri, 60) == uri

"""Catalog access shared by every role: open the configured pyiceberg catalog, find tables."""

from __future__ import annotations

import math
import re
from pathlib import Path

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from icekeeper.common.config.model import IcekeeperConfig, TableSpec
from icekeeper.common.internals import set_hive_socket_timeout, set_rest_request_timeout
from icekeeper.common.locations import normalize_location
from icekeeper.common.storage import StorageSettings, configure_storage

DEFAULT_TABLE_PROPERTIES = {
    "format-version": "2",
    # Keep the manifest count bounded as commits pile up (merge-append merges past this many).
    "commit.manifest-merge.enabled": "true",
    "commit.manifest.min-count-to-merge": "100",
    # Old metadata.json files are deleted as new ones are written, keeping the last 10.
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "10",
    "write.parquet.compression-codec": "zstd",
    # Parquet gives up a column's dictionary once it outgrows this. CDC rows carry many
    # high-cardinality columns (Kafka offsets, GTIDs, binlog positions, timestamps) whose values
    # would be hashed until a 1-2 MB dictionary overflows, then re-encoded: a small limit spares
    # that and keeps dictionaries for the low-cardinality columns (measured ~10% of a writer's CPU).
    "write.parquet.dict-size-bytes": str(64 * 1024),
}
"""Properties of tables the bookkeeper creates (a table's own settings win over these)."""


ACCEPT_ENCODING_PROPERTY = "header.Accept-Encoding"
"""The bookkeeper asks a REST catalog for its answers uncompressed unless `catalog.properties`
sets this header itself (`gzip` over a slow link). Every commit's answer is the table's whole
metadata (an hour of snapshots at one commit a second: ~3.3 MB), and the `requests` library asks
for gzip by default: Iceberg's REST fixture then compresses each answer on the server and the
client inflates it, ~25 ms of the answer's 50 ms at 1.4 MB (`loadTable`, measured on the stack's
server; 25 ms uncompressed), more than sending the 1.4 MB takes at a gigabit (~11 ms). Across a
slow link (a hosted catalog over the internet: ~10x the bytes, 3.3 MB a commit a table) gzip can
win: set the header. (pyiceberg names headers `header.<Name>`, that prefix case-sensitive, the
name not.) Spark's REST client (the writer's, the reaper's) is not changed."""


def open_catalog(config: IcekeeperConfig) -> Catalog:
    """The pyiceberg catalog of the config; local SQLite and warehouse folders are created.

    The storage door (`common/storage.py`) is configured here with the same properties, so every
    role that opens its catalog reads and writes its own files with the credentials pyiceberg
    uses for the tables'."""
    configure_storage(StorageSettings.from_properties(config.catalog.properties))
    properties = dict(config.catalog.properties)
    uri = properties.get("uri", "")
    if properties.get("type") == "sql" and uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    warehouse = properties.get("warehouse", "")
    if warehouse.startswith("file://"):
        Path(warehouse.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    # pyiceberg opens the tables' files through the door, as every other icekeeper file is
    # opened (its own IO cannot even open abfss://<container>@<account>..., door_fileio.py); a
    # FileIO the config names stays the user's choice. A REST catalog may hand out credentials
    # per table (vended with `load_table`), which pyiceberg's own IO applies and the door's one
    # set of settings would override: there the door opens only what pyiceberg's IO cannot.
    locations = [warehouse] + [table.location or "" for table in config.tables]
    if properties.get("type") != "rest" or any(
        location.startswith(AZURE_SCHEMES) for location in locations
    ):
        properties.setdefault("py-io-impl", DOOR_FILE_IO)
    if properties.get("type") == "rest" and not any(
        key.startswith("header.") and key.lower() == ACCEPT_ENCODING_PROPERTY.lower()
        for key in properties
    ):
        properties[ACCEPT_ENCODING_PROPERTY] = "identity"
    timeout_s = config.catalog.request_timeout
    timed_uri = postgresql_uri_with_timeouts(uri, timeout_s)
    if properties.get("type") == "sql" and timed_uri != uri:
        properties["uri"] = timed_uri
        # The server ends sessions idle for longer than the timeout (`idle_session_timeout`):
        # a pooled connection it ended is found so before use and replaced, not failed on.
        properties.setdefault("pool_pre_ping", "true")
    catalog = load_catalog(config.catalog.name, **properties)
    if "py-io-impl" not in catalog.properties and not properties.get("s3.signer"):
        # A REST catalog's tables keep pyiceberg's own IO (above), writing small S3 files in one
        # PUT; set after the server's configuration is merged, so a FileIO the server names
        # (its `defaults` or `overrides`) stays the server's choice, as with any other client.
        catalog.properties["py-io-impl"] = SINGLE_PUT_FILE_IO
    set_rest_request_timeout(catalog, timeout_s)
    set_hive_socket_timeout(catalog, timeout_s)
    return catalog


POSTGRESQL_DRIVERS = ("postgresql", "postgresql+psycopg", "postgresql+psycopg2")
"""SQLAlchemy's PostgreSQL dialects on libpq, which take libpq's connection parameters from the
URL's query (`postgresql+pg8000` and the async drivers have their own: left as they are)."""


def postgresql_uri_with_timeouts(uri: str, timeout_s: float) -> str:
    """A SQL catalog's PostgreSQL URL whose sessions cannot hang for longer than about
    `timeout_s` (`catalog.request_timeout`); other URLs, and parameters the URL already sets,
    are left as they are.

    Neither pyiceberg's `SqlCatalog` nor libpq sets a timeout: a server that stalls (a lock
    held by another session), a network that drops packets,
    or a proxy that stops forwarding held the bookkeeper's cycle forever while its lease lapsed.
    With these, the statement fails (SQLAlchemy's `OperationalError`), a commit's of unknown
    outcome that the commit path settles by reading the table back:

    - `statement_timeout`: the server cancels a statement that runs longer (a `COMMIT` too);
    - `idle_in_transaction_session_timeout`: the server ends a session whose client stopped
      mid-transaction, so a commit stuck on the way (a stalled proxy, a paused bookkeeper) can
      neither land later nor keep the table's catalog row locked from the next bookkeeper;
    - `idle_session_timeout`: likewise a session whose client never heard an answer (the
      server answered and went idle): a proxy in between then closes the client's side too;
    - `connect_timeout`, TCP keepalives and `tcp_user_timeout`: the client gives up on a server
      or network that went silent (nothing else tells it when no packet comes back)."""
    if not uri.startswith("postgresql"):
        return uri
    from sqlalchemy.engine import make_url  # SQLAlchemy: only where a SQL catalog is used

    url = make_url(uri)
    if url.drivername not in POSTGRESQL_DRIVERS:
        return uri
    seconds = max(1, math.ceil(timeout_s))
    milliseconds = max(1, round(timeout_s * 1000))
    options = " ".join(_query_values(url.query.get("options")))
    server_settings = {
        "statement_timeout": milliseconds,
        "idle_in_transaction_session_timeout": milliseconds,
        "idle_session_timeout": milliseconds,
    }
    # Those the URL's `options` names are the user's; an empty `options=` adds none (PgBouncer
    # refuses `options`, servers before 14 refuse `idle_session_timeout`: set them on the role).
    added = [
        f"-c {name}={value}"
        for name, value in server_settings.items()
        if name not in options and not re.search(r"[?&]options=(&|$)", uri)
    ]
    parameters = {
        "connect_timeout": str(max(2, seconds)),  # libpq's least
        "keepalives": "1",
        # Probes after a quarter of the timeout without a packet, three of them an eighth
        # apart: a peer gone silent is found within about five eighths of it.
        "keepalives_idle": str(max(1, seconds // 4)),
        "keepalives_interval": str(max(1, seconds // 8)),
        "keepalives_count": "3",
        "tcp_user_timeout": str(milliseconds),  # sent bytes unacknowledged for this long
    }
    query = {name: value for name, value in parameters.items() if name not in url.query}
    if added:
        query["options"] = " ".join([options, *added]).strip()
    if not query:
        return uri
    return url.update_query_dict(query).render_as_string(hide_password=False)


def _query_values(value: str | tuple[str, ...] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


AZURE_SCHEMES = ("abfs://", "abfss://", "wasb://", "wasbs://")
DOOR_FILE_IO = "icekeeper.common.door_fileio.DoorFileIO"
SINGLE_PUT_FILE_IO = "icekeeper.common.door_fileio.SinglePutFileIO"
"""pyiceberg's own FileIO, small S3 files in one PUT (`door_fileio.SinglePutFileIO`)."""


def load_table_or_none(catalog: Catalog, identifier: str) -> Table | None:
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        return None


REQUESTED_LOCATION = "icekeeper.requested-location"
"""Table property: the location the bookkeeper asked the catalog to create the table at, kept
only when the catalog chose another (a REST catalog may: Nessie appends `_<uuid>`). Writers place
the files of batches they write before the table exists under the location they compute
(`default_table_location`); this says those files are the table's too."""


def monikers_location(table: Table, moniker_location: str) -> str:
    """The location a moniker's files are checked against (its data folder, its batch folders):
    the table's, or the location the table was asked for (`REQUESTED_LOCATION`) when the moniker
    was written for that one, before the table existed."""
    requested = table.properties.get(REQUESTED_LOCATION)
    if requested and normalize_location(moniker_location).rstrip("/") == normalize_location(
        requested
    ).rstrip("/"):
        return requested
    return table.location()


def default_table_location(config: IcekeeperConfig, identifier: str) -> str:
    """Where a table not yet created will live: its configured location, else pyiceberg's default.

    pyiceberg places new tables at `<warehouse>/<namespace>/<table>`; writers compute the same so
    their first files land where the bookkeeper then creates the table.
    """
    for table in config.tables:
        if table.identifier == identifier and table.location:
            return table.location.rstrip("/")
    namespace, _, name = identifier.rpartition(".")
    warehouse = config.catalog.properties.get("warehouse")
    if not warehouse:
        raise ValueError("catalog.properties.warehouse is needed to place new tables")
    return f"{warehouse.rstrip('/')}/{namespace}/{name}"


def table_properties(table: Table | None, spec: TableSpec) -> dict[str, str]:
    """A table's properties; for a table still to be created, those the bookkeeper will give it."""
    if table is not None:
        return dict(table.properties)
    return {**DEFAULT_TABLE_PROPERTIES, **spec.properties}

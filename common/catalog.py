"""Catalog access shared by every role: open the configured pyiceberg catalog, find tables."""

from __future__ import annotations

from pathlib import Path

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from common.config.model import IcekeeperConfig


def open_catalog(config: IcekeeperConfig) -> Catalog:
    """The pyiceberg catalog of the config; local SQLite and warehouse folders are created."""
    properties = dict(config.catalog.properties)
    uri = properties.get("uri", "")
    if properties.get("type") == "sql" and uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    warehouse = properties.get("warehouse", "")
    if warehouse.startswith("file://"):
        Path(warehouse.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    return load_catalog(config.catalog.name, **properties)


def load_table_or_none(catalog: Catalog, identifier: str) -> Table | None:
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        return None


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

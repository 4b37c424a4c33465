"""icekeeper's roles on the stack's shared catalogs: Hive Metastore 3.1.3 and a SQL catalog in
PostgreSQL (`stack up --with s3 hms pg-catalog`), the warehouse on the stack's S3 server.

A test's fixture runs it once per catalog of `LAYOUTS` (`catalog_layout_for`), with a config
whose `catalog.properties` are what a user would write for that catalog: the service's own
pyiceberg properties, with a warehouse of the test's own. The `shop.items` helpers
(tests/support/shop_items.py) name their table `shop.items`: a SQL catalog keeps each catalog
name's tables apart, a metastore does not, so a Hive test's `shop.items` from an earlier test is
dropped first (its files stay on S3, under that test's warehouse).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hive_metastore.ttypes import ShowLocksRequest, UnlockRequest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.hive import HiveCatalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

from icekeeper.common.catalog import default_table_location, open_catalog
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.internals import hive_metastore_client
from icekeeper.common.moniker import FileEntry, Moniker
from icekeeper.localstack.catalog_service import CatalogService
from tests.support.shop_items import SCHEMA, UpsertWriter, bookkeeper_config, write_file_at

LAYOUTS = ("hive_metastore", "pg_catalog")
"""The fixtures of the two catalogs, in the order tests run on them."""


@dataclass(frozen=True)
class CatalogLayout:
    """One of the stack's shared catalogs, as a test points icekeeper's roles at it."""

    service: CatalogService
    warehouse: str
    """The test's own warehouse on the S3 server: `<service warehouse>/<test id>`."""

    @property
    def kind(self) -> str:
        return "hive" if self.service.name == "hms" else "postgresql"

    def properties(self, **overrides: str) -> dict[str, str]:
        """`catalog.properties` as a user writes them for this catalog."""
        return {
            **self.service.pyiceberg_properties(),
            "warehouse": self.warehouse,
            **overrides,
        }

    def environ(self, **overrides: str) -> dict[str, str]:
        """Environment overrides (`ICEKEEPER__CATALOG__...`) that point a config at this
        catalog, with a catalog name of the test's own."""
        return {
            "ICEKEEPER__CATALOG__NAME": f"cat_{uuid.uuid4().hex[:8]}",
            "ICEKEEPER__CATALOG__PROPERTIES": json.dumps(self.properties(**overrides)),
        }

    def bookkeeper_config(
        self, state_dir: Path, mode: str = "changelog", **overrides: str
    ) -> IcekeeperConfig:
        """`shop_items.bookkeeper_config` on this catalog, `shop.items` not there yet."""
        config = bookkeeper_config(
            state_dir,
            mode,
            **{
                "catalog__name": f"cat_{uuid.uuid4().hex[:8]}",
                "catalog__properties": json.dumps(self.properties()),
                **overrides,
            },
        )
        forget_table(open_catalog(config), "shop.items")
        return config


def forget_table(catalog: Catalog, identifier: str) -> None:
    """Drop `identifier` from the catalog if an earlier test left it (its files stay), and in a
    metastore the locks an earlier test's cut connection left on it (see bookkeeper/hive_locks.py:
    Hive Metastore 3.1.3 keeps them)."""
    try:
        catalog.drop_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError):
        pass
    if isinstance(catalog, HiveCatalog):
        for lock_id in table_locks(catalog, identifier):
            with hive_metastore_client(catalog) as client:
                client.unlock(UnlockRequest(lockid=lock_id))


def table_locks(catalog: Catalog, identifier: str) -> list[int]:
    """The metastore's locks on a Hive catalog's table, held or waiting."""
    database, _, name = identifier.rpartition(".")
    with hive_metastore_client(catalog) as client:
        locks = client.show_locks(ShowLocksRequest()).locks or []
    return [lock.lockid for lock in locks if (lock.dbname, lock.tablename) == (database, name)]


def catalog_layout_for(service: CatalogService) -> CatalogLayout:
    return CatalogLayout(service, f"{service.warehouse()}/t{uuid.uuid4().hex[:10]}")


class S3UpsertWriter(UpsertWriter):
    """`UpsertWriter` whose files go to the table's location on the S3 server (through the
    storage door), as a writer's would."""

    def batch(self, changes: list[tuple[int, int | None]]) -> Moniker:
        last = self.last_changes(changes)
        self.seq += 1
        folder = f"{self.location}/data/{self.writer_id}/{self.seq:012d}"
        rows = [
            {"id": k, "amount": a, "_kfk_partition": 0, "_kfk_offset": o}
            for k, (a, o) in last.items()
            if a is not None
        ]
        files = (
            [write_file_at(f"{folder}/{uuid.uuid4().hex}.parquet", SCHEMA, rows)] if rows else []
        )
        gone = [
            {"id": k, "amount": None, "_kfk_partition": 0, "_kfk_offset": o}
            for k, (a, o) in last.items()
            if a is None
        ]
        deleted: list[FileEntry] = []
        if gone:
            entry = write_file_at(
                f"{folder}/ik_deleted=true/{uuid.uuid4().hex}.parquet", SCHEMA, gone
            )
            deleted = [entry.model_copy(update={"content": "deleted-keys"})]
        return self.moniker(len(changes), files, deleted)


def table_location(config: IcekeeperConfig) -> str:
    return default_table_location(config, "shop.items")


def config_file(config: IcekeeperConfig, path: Path, extra: Mapping[str, object] = ()) -> Path:
    """`config` written as a YAML file a role or `config check` can be started with."""
    import yaml

    document = {**config.model_dump(mode="json"), **dict(extra)}
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path

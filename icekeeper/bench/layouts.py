"""Where a benchmark keeps its tables: local disk, the stack's S3 server, or S3 behind a REST
catalog.

Issue 28's figures compare the production layouts with the local one on the same machine, in the
same run. A layout is a catalog (its pyiceberg properties) and a root under which the bench puts
its tables and files; each run gets a root of its own, removed at the end:

- `local`: a SQLite catalog and a warehouse folder under the bench's work folder (as before);
- `s3`: the same SQLite catalog (local), the warehouse on the stack's S3 server
  (`stack up --with s3`, s3proxy): every data file, manifest and metadata file goes over HTTP;
- `s3-rest`: Iceberg's REST catalog server (`stack up --with rest`, which brings `s3`), tables on
  the same S3 server; the table's namespace is the run's own (the server outlives the run).

On an object-store layout the monikers' transaction-log folder is there too, as the production
layouts keep it (docs/deployment.md): each moniker is a PUT, a GET and a DELETE on the store.
The benches' other state (checkpoints) stays in the local work folder; they run bookkeeper cycles,
not its service loop, so they hold no lease.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.exit_codes import UsageError

if TYPE_CHECKING:
    from icekeeper.localstack.services import Service

LAYOUT_SERVICES: dict[str, tuple[str, ...]] = {
    "local": (),
    "s3": ("s3",),
    "s3-rest": ("s3", "rest"),
}
"""Each layout and the optional stack services (`stack up --with`) it needs."""

LAYOUT_NAMES = tuple(LAYOUT_SERVICES)


def parse_layouts(text: str) -> list[str]:
    """`--layout(s)` names, comma-separated, each once, in the order given."""
    names = list(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in LAYOUT_SERVICES]
    if unknown or not names:
        raise UsageError(
            f"no layout {', '.join(unknown) or '(none given)'}; choose from "
            f"{', '.join(LAYOUT_NAMES)}"
        )
    return names


def services_for(layouts: Sequence[str]) -> list[str]:
    """The optional stack services the layouts need, each once (for `--start-stack`)."""
    return list(dict.fromkeys(name for layout in layouts for name in LAYOUT_SERVICES[layout]))


@dataclass(frozen=True)
class BenchLayout:
    """One run's catalog and file root on one layout.

    Attributes:
        name: `local`, `s3` or `s3-rest`.
        catalog_properties: pyiceberg catalog properties (storage `s3.*` ones included).
        root: where this run's tables and files go (a local folder or `s3://<bucket>/...`).
        namespace: the namespace of this run's tables (`bench`, or a run's own on a shared
            REST catalog).
    """

    name: str
    catalog_properties: dict[str, str] = field(hash=False)
    root: str
    namespace: str = "bench"

    def location(self, *parts: str) -> str:
        """A location under the run's root (a path on local disk, a URI on S3)."""
        return "/".join([self.root.rstrip("/"), *parts])

    @property
    def on_object_store(self) -> bool:
        return self.root.startswith("s3://")

    def transport_settings(self, name: str) -> dict[str, str]:
        """Config (environment form) putting the transaction log of the bench's config `name`
        under the run's root on an object store; none on local disk (the state folder's)."""
        if not self.on_object_store:
            return {}
        return {
            "ICEKEEPER__TRANSPORT__URI": self.location("txlog", name, "monikers"),
            "ICEKEEPER__TRANSPORT__DEAD_LETTER_URI": self.location("txlog", name, "dead-letter"),
        }


def open_layout(name: str, stack_config: IcekeeperConfig, work: Path) -> BenchLayout:
    """This run's catalog and root on layout `name`; the stack services it needs must be up.

    Args:
        stack_config: the config of the stack whose S3 server and REST catalog to use (ports,
            state folder: `icekeeper stack up --with s3 rest` with the same config).
        work: the run's local work folder (the SQLite catalog of `local` and `s3`).
    """
    run = uuid.uuid4().hex[:8]
    if name == "local":
        return BenchLayout(
            name=name,
            catalog_properties={
                "type": "sql",
                "uri": f"sqlite:///{work / 'catalog.db'}",
                "warehouse": (work / "warehouse").as_uri(),
            },
            root=str(work / "warehouse"),
        )
    from icekeeper.localstack.object_store import S3Service
    from icekeeper.localstack.rest_catalogs import RestCatalogService

    services = _running_services(name, stack_config)
    s3 = services["s3"]
    assert isinstance(s3, S3Service)
    if name == "s3":
        root = s3.uri(f"bench/{work.name}-{run}")
        return BenchLayout(
            name=name,
            catalog_properties={
                "type": "sql",
                "uri": f"sqlite:///{work / 'catalog.db'}",
                "warehouse": root,
                **s3.pyiceberg_properties(),
            },
            root=root,
        )
    rest = services["rest"]
    assert isinstance(rest, RestCatalogService)
    root = f"{rest.warehouse()}/bench_{run}"
    return BenchLayout(
        name=name,
        catalog_properties={**rest.pyiceberg_properties(), "warehouse": root},
        root=root,
        namespace=f"bench_{run}",
    )


def _running_services(layout: str, stack_config: IcekeeperConfig) -> dict[str, Service]:
    """The stack services `layout` needs, by name; a `UsageError` naming the command that starts
    them when one does not answer (rather than a connection error deep in pyiceberg)."""
    from icekeeper.localstack.stack import LocalStack

    names = list(LAYOUT_SERVICES[layout])
    stack = LocalStack(stack_config, only=names, with_services=names)
    services = {name: stack.service(name) for name in names}
    down = [name for name, service in services.items() if not service.healthy()]
    if down:
        raise UsageError(
            f"layout {layout} needs the stack's {' and '.join(down)} "
            f"(not answering): icekeeper stack up --with {','.join(names)}, or bench --start-stack"
        )
    return services


def remove_layout_files(layout: BenchLayout) -> None:
    """Remove what the run left on an object store (its root) and, on a shared REST catalog, its
    tables and namespace; a local root goes with the work folder."""
    if not layout.on_object_store:
        return
    from icekeeper.common.storage import configure_storage, delete_folder, storage_settings

    if layout.name == "s3-rest":
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchNamespaceError

        catalog = load_catalog("bench-cleanup", **layout.catalog_properties)
        try:
            for identifier in catalog.list_tables(layout.namespace):
                catalog.drop_table(identifier)
            catalog.drop_namespace(layout.namespace)
        except NoSuchNamespaceError:
            pass  # the run stopped before its first table
    # The door as the layout's catalog configures it: the run's own sides may have set it for
    # another catalog since (a local side's bookkeeper), and then the root's endpoint is unknown.
    before = storage_settings()
    configure_storage(layout.catalog_properties)
    try:
        delete_folder(layout.root)
    finally:
        configure_storage(before)

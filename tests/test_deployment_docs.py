"""docs/deployment.md's configurations as written (issue 28, item 7): each block, pointed at a
stack as a user points it at their own services (tests/support/deployment_docs.py says what
changes), passes every check `icekeeper config check` runs and keeps every file the roles share
on its store, with its layout's transport; a block with a misspelt key or the wrong transport
fails them. The same blocks run end to end in the layouts' own tests:
tests/test_rest_layout.py (`s3-rest`), tests/test_azure_layout.py (`azure`) and
tests/icekeeper/test_shared_catalog_pipeline.py (`onprem-hive`, `onprem-postgresql`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from icekeeper.common.config import load_config
from icekeeper.common.config.model import AzureQueueTransport
from icekeeper.config_check import check_config
from tests.support.deployment_docs import (
    DEPLOYMENT_PAGE,
    LAYOUTS,
    StackEndpoints,
    layout_blocks,
    layout_document,
    placement,
    write_layout_config,
)

# Addresses nothing answers on: these checks open nothing (`config check` without --connect).
ENDPOINTS = StackEndpoints(
    kafka="127.0.0.1:1",
    registry="http://127.0.0.1:1/apis/ccompat/v7",
    s3={
        "s3.endpoint": "http://127.0.0.1:1",
        "s3.region": "us-east-1",
        "s3.access-key-id": "test-key",
        "s3.secret-access-key": "test-secret",
    },
    azure_connection_string=(
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
        "BlobEndpoint=http://127.0.0.1:1/devstoreaccount1;"
        "QueueEndpoint=http://127.0.0.1:1/devstoreaccount1;"
    ),
)
CATALOG_URIS = {
    "s3-rest": "http://127.0.0.1:1",
    "azure": "postgresql+psycopg://icekeeper:pw@127.0.0.1:1/catalog",
    "onprem-hive": "thrift://127.0.0.1:1",
    "onprem-postgresql": "postgresql+psycopg://icekeeper:pw@127.0.0.1:1/catalog",
}
TRANSPORTS = {
    "s3-rest": "txlog",
    "azure": "azure-queue",
    "onprem-hive": "txlog",
    "onprem-postgresql": "txlog",
}
"""The transport each layout carries its monikers on."""
STORE_ROOTS = {
    "s3-rest": "s3://icekeeper/t1/",
    "azure": "abfss://c1@devstoreaccount1.dfs.core.windows.net/",
    "onprem-hive": "s3://icekeeper/t1/",
    "onprem-postgresql": "s3://icekeeper/t1/",
}


def placed(
    name: str, folder: Path, monkeypatch: pytest.MonkeyPatch, page: str | None = None
) -> Path:
    """Block `name` (of `page`, else the page) as a test places it, written to a file."""
    document = layout_document(name, page)
    place = placement(
        document, folder, "test.topic", ENDPOINTS, CATALOG_URIS[name], STORE_ROOTS[name]
    )
    return write_layout_config(document, place, folder / f"{name}.yaml", monkeypatch)


def checked(
    name: str, folder: Path, monkeypatch: pytest.MonkeyPatch, page: str | None = None
) -> list[str]:
    """The errors `config check` finds in block `name` as a test places it."""
    path = placed(name, folder, monkeypatch, page)
    return [str(error) for error, _ in check_config(str(path)).errors]


def test_the_page_has_one_block_per_layout() -> None:
    assert sorted(layout_blocks()) == sorted(LAYOUTS)


@pytest.mark.parametrize("name", LAYOUTS)
def test_each_block_passes_the_checks_of_config_check(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert checked(name, tmp_path, monkeypatch) == []


@pytest.mark.parametrize("name", LAYOUTS)
def test_each_block_keeps_what_the_roles_share_on_its_store(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nodes that share no folder can run every role: the monikers, leases, checkpoints,
    reports and dead letters are on the block's store, and the transport is the layout's."""
    config = load_config(placed(name, tmp_path, monkeypatch))
    assert config.transport.kind == TRANSPORTS[name]
    shared = {
        "group.lease_uri": config.group.lease_uri,
        "transport.dead_letter_uri": config.transport.dead_letter_uri,
        "writer.checkpoint_uri": config.writer.checkpoint_uri,
        "bookkeeper.commit_report_path": config.bookkeeper.commit_report_path,
        "reaper.report_path": config.reaper.report_path,
        "catalog.properties.warehouse": config.catalog.properties["warehouse"],
    }
    if isinstance(config.transport, AzureQueueTransport):
        shared["transport.journal_uri"] = config.transport.journal_uri
    else:
        shared["transport.uri"] = config.transport.uri
    local = {key: uri for key, uri in shared.items() if not uri.startswith(STORE_ROOTS[name])}
    assert local == {}


@pytest.mark.parametrize(
    ("name", "written", "broken", "named"),
    [
        ("s3-rest", "  lease_uri:", "  lease_url:", "lease_url"),
        ("azure", "kind: azure-queue", "kind: txlog", "transport"),
        ("onprem-hive", "  checkpoint_uri:", "  checkpoint_url:", "checkpoint_url"),
        ("onprem-postgresql", "  name: pg_lake", "  nmae: pg_lake", "nmae"),
    ],
)
def test_a_broken_block_fails_them(
    name: str,
    written: str,
    broken: str,
    named: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    page = DEPLOYMENT_PAGE.read_text(encoding="utf-8")
    block = layout_blocks(page)[name]
    assert written in block
    page = page.replace(block, block.replace(written, broken, 1))
    errors = checked(name, tmp_path, monkeypatch, page)
    assert errors and any(named in error for error in errors), errors

"""docs/deployment.md's configurations as written (issue 28, item 7): each block, pointed at a
stack as a user points it at their own services (tests/support/deployment_docs.py says what
changes), passes every check `icekeeper config check` runs; a block with a misspelt key or the
wrong transport fails them. The same blocks run end to end in the layouts' own tests:
tests/test_rest_layout.py (`s3-rest`), tests/test_azure_layout.py (`azure`) and
tests/icekeeper/test_shared_catalog_pipeline.py (`onprem-hive`, `onprem-postgresql`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

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
STORE_ROOTS = {
    "s3-rest": "s3://icekeeper/t1/",
    "azure": "abfss://c1@devstoreaccount1.dfs.core.windows.net/",
    "onprem-hive": "s3://icekeeper/t1/",
    "onprem-postgresql": "s3://icekeeper/t1/",
}


def checked(
    name: str, folder: Path, monkeypatch: pytest.MonkeyPatch, page: str | None = None
) -> list[str]:
    """The errors `config check` finds in block `name` (of `page`, else the page) as a test
    places it."""
    document = layout_document(name, page)
    place = placement(
        document, folder, "test.topic", ENDPOINTS, CATALOG_URIS[name], STORE_ROOTS[name]
    )
    path = write_layout_config(document, place, folder / f"{name}.yaml", monkeypatch)
    return [str(error) for error, _ in check_config(str(path)).errors]


def test_the_page_has_one_block_per_layout() -> None:
    assert sorted(layout_blocks()) == sorted(LAYOUTS)


@pytest.mark.parametrize("name", LAYOUTS)
def test_each_block_passes_the_checks_of_config_check(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert checked(name, tmp_path, monkeypatch) == []


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

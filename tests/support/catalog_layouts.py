"""Icekeeper's roles on a shared catalog of the stack (an Iceberg REST server, Nessie) with the
warehouse on its S3 server, as a production layout has them: configs, monikers whose files a
writer would have written to S3, and the request line of a table's commit, where a relay in front of
the catalog (`tests/support/relay.py`) faults it.

The catalog servers are shared by the whole test session, so each test's table has a namespace of
its own (`ns_<hex>.items`), at a location of its own under the catalog's warehouse.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.moniker import FileEntry, Moniker, OffsetRange, moniker_id
from icekeeper.localstack.catalog_service import CatalogService
from tests.support.shop_items import SCHEMA, bookkeeper_config, reaper_config, write_file_at


def layout_config(
    tmp_path: Path, service: CatalogService, mode: str = "changelog", **overrides: str
) -> IcekeeperConfig:
    """`shop_items.bookkeeper_config` (or `reaper_config` with `reaper=True` in overrides) on
    `service`'s catalog: table `ns_<hex>.items` at a location of its own on the S3 server; the
    transport, leases and reports stay in `tmp_path` (item 2 covers them on S3)."""
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    properties = dict(service.pyiceberg_properties())
    if "uri" in overrides:
        properties["uri"] = overrides.pop("uri")
    settings = {
        "catalog__properties": json.dumps(properties),
        "tables": f"[{{identifier: {namespace}.items, topics: [items], primary_key: [id], "
        f"mode: {mode}, location: '{service.warehouse()}/{namespace}/items'}}]",
        **overrides,
    }
    make = reaper_config if settings.pop("reaper", None) else bookkeeper_config
    return make(tmp_path, mode, **settings)


def table_of(config: IcekeeperConfig) -> str:
    return config.tables[0].identifier


def commit_request_line(service: CatalogService, identifier: str) -> bytes:
    """The start of the request line of a commit to table `identifier` of `service` (pyiceberg:
    `POST <base>/v1/[<prefix>/]namespaces/<ns>/tables/<name>`): Nessie names its branch as the
    prefix."""
    namespace, name = identifier.split(".")
    uri = service.pyiceberg_properties()["uri"].rstrip("/")
    with urllib.request.urlopen(f"{uri}/v1/config", timeout=10) as answer:
        config = json.load(answer)
    prefix = {**config.get("defaults", {}), **config.get("overrides", {})}.get("prefix")
    path = urllib.parse.urlparse(uri).path + "/v1/" + (f"{prefix}/" if prefix else "")
    return f"POST {path}namespaces/{namespace}/tables/{name} ".encode()


class S3Writer:
    """Monikers of the layout's table as a writer makes them, their files on the S3 server: for a
    changelog table every change a row; for an upsert table the last change per key of a batch,
    deleted keys in a deleted-keys file."""

    def __init__(self, config: IcekeeperConfig, writer_id: str = "w1") -> None:
        self.config, self.writer_id = config, writer_id
        self.table = table_of(config)
        self.location = config.tables[0].location or ""
        self.seq, self.offset = 0, 0

    def batch(self, changes: list[tuple[int, int | None]]) -> Moniker:
        """`changes`: (id, amount) upserts and (id, None) deletes, in offset order (a changelog
        table keeps every one of them; deletes are not written there)."""
        self.seq += 1
        folder = f"{self.location}/data/{self.writer_id}/{self.seq:012d}"
        upsert = self.config.tables[0].upsert
        first = self.offset
        rows, gone = [], []
        last: dict[int, tuple[int | None, int]] = {}
        for key, amount in changes:
            row = {"id": key, "amount": amount, "_kfk_partition": 0, "_kfk_offset": self.offset}
            if upsert:
                last[key] = (amount, self.offset)
            elif amount is not None:
                rows.append(row)
            self.offset += 1
        if upsert:
            for key, (amount, offset) in last.items():
                row = {"id": key, "amount": amount, "_kfk_partition": 0, "_kfk_offset": offset}
                (rows if amount is not None else gone).append(row)
        files = (
            [write_file_at(f"{folder}/{uuid.uuid4().hex}.parquet", SCHEMA, rows)] if rows else []
        )
        deleted: list[FileEntry] = []
        if gone:
            entry = write_file_at(
                f"{folder}/ik_deleted=true/{uuid.uuid4().hex}.parquet", SCHEMA, gone
            )
            deleted = [entry.model_copy(update={"content": "deleted-keys"})]
        ranges = [
            OffsetRange(topic="items", partition=0, from_offset=first, until_offset=self.offset)
        ]
        return Moniker(
            id=moniker_id(self.writer_id, self.table, ranges),
            rereads_refused=True,
            writer_id=self.writer_id,
            seq=self.seq,
            prev_seq=self.seq - 1 if self.seq > 1 else None,
            table=self.table,
            table_location=self.location,
            schema=json.loads(SCHEMA.model_dump_json()),
            files=files,
            delete_files=deleted,
            offsets=ranges,
            records=sum(f.record_count for f in files),
            min_event_time_ms=1_700_000_000_000 + first,
            max_event_time_ms=1_700_000_000_000 + self.offset,
        )

"""Icekeeper's roles on a shared catalog of the stack (an Iceberg REST server, Nessie) with the
warehouse on its S3 server, as a production layout has them: configs, monikers whose files a
writer would have written to S3, and a relay in front of the catalog that loses or replaces the
answer to a commit (a real socket between the bookkeeper and the real server).

The catalog servers are shared by the whole test session, so each test's table has a namespace of
its own (`ns_<hex>.items`), at a location of its own under the catalog's warehouse.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
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


class CommitRelay:
    """A TCP relay in front of a real HTTP server (the REST catalog) that, for the next request
    whose request line starts with `marker` (a table's commit: `POST <path of the table>`), does
    what `fault` says once the request went through (or did not):

    - `lose`: forwards it; the server applies it and answers; the client's connection is closed
      instead (a load balancer dropping the answer);
    - `503` / `504`: forwards it and replaces the server's answer with that status (a gateway
      that gave up after the server applied it);
    - `refuse-503`: does not forward it; answers 503 (the server never saw it);
    - `refuse-lose`: does not forward it; closes the client's connection;
    - `stall`: forwards it and holds the answer until the client gives up (its read timeout).

    `before_forward`, if set, runs before the faulted request is forwarded (another client's
    commit landing just before it: a lost compare-and-swap on the real server)."""

    def __init__(self, target: str) -> None:
        parsed = urllib.parse.urlparse(target)
        self.target = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.base_path = parsed.path
        self.marker = b""
        self.fault: str | None = None
        self.faulted = 0
        self.before_forward: Callable[[], None] | None = None
        self.requests: list[str] = []
        """The request line of every request relayed (or faulted), in order."""
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._stalled: list[socket.socket] = []
        self.address = f"http://127.0.0.1:{self._listener.getsockname()[1]}{self.base_path}"
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, marker: bytes, fault: str) -> None:
        """Fault the next request whose request line starts with `marker`."""
        with self._lock:
            self.marker, self.fault = marker, fault

    def close(self) -> None:
        self._listener.close()
        for sock in self._stalled:
            _close(sock)

    def _take(self, data: bytes) -> str | None:
        request_line = data.split(b"\r\n", 1)[0]
        with self._lock:
            self.requests.append(request_line.decode())
            if self.fault and self.marker and request_line.startswith(self.marker):
                fault, self.fault = self.fault, None
                self.faulted += 1
                return fault
        return None

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        """One client connection, request by request (HTTP/1.1 keep-alive: requests' session
        reuses it), each relayed on a connection of its own to the server."""
        buffer = b""
        try:
            while True:
                request, buffer = _read_message(client, buffer)
                if request is None:
                    return
                fault = self._take(request)
                if fault == "refuse-503":
                    client.sendall(_status(503))
                    continue
                if fault == "refuse-lose":
                    return
                if fault and self.before_forward is not None:
                    self.before_forward()
                answer = _exchange(self.target, request)
                if fault == "lose":
                    return
                if fault in ("503", "504"):
                    client.sendall(_status(int(fault)))
                    continue
                if fault == "stall":
                    self._stalled.append(client)
                    return
                client.sendall(answer)
        except OSError:
            pass
        finally:
            if client not in self._stalled:
                _close(client)


def _status(code: int) -> bytes:
    reason = {503: "Service Unavailable", 504: "Gateway Timeout"}[code]
    return (
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n"
    ).encode()


def _read_message(sock: socket.socket, buffer: bytes) -> tuple[bytes | None, bytes]:
    """One HTTP/1.1 message (headers and a Content-Length or chunked body) from `sock`, and what
    was read beyond it; None at the end of the connection."""
    while b"\r\n\r\n" not in buffer:
        data = sock.recv(65536)
        if not data:
            return None, b""
        buffer += data
    head, _, rest = buffer.partition(b"\r\n\r\n")
    headers = {
        line.split(b":", 1)[0].strip().lower(): line.split(b":", 1)[1].strip()
        for line in head.split(b"\r\n")[1:]
        if b":" in line
    }
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        while not (rest.endswith(b"0\r\n\r\n")):
            data = sock.recv(65536)
            if not data:
                return None, b""
            rest += data
        return head + b"\r\n\r\n" + rest, b""
    length = int(headers.get(b"content-length", b"0"))
    while len(rest) < length:
        data = sock.recv(65536)
        if not data:
            return None, b""
        rest += data
    return head + b"\r\n\r\n" + rest[:length], rest[length:]


def _exchange(target: tuple[str, int], request: bytes) -> bytes:
    """Send `request` to the server on a connection of its own; its whole answer."""
    with socket.create_connection(target) as server:
        server.sendall(request)
        answer, _ = _read_message(server, b"")
    if answer is None:
        raise OSError("the server closed the connection without an answer")
    return answer


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()

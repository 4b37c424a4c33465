"""A small file goes to S3 in one PUT, not a multipart upload of three requests (issue 28's REST
commit writes a manifest and a manifest list each time): through the storage door, and through
pyiceberg's own FileIO that a REST catalog's tables keep (`SinglePutFileIO`)."""

from __future__ import annotations

import http.server
import json
import os
import threading
import uuid
from pathlib import Path

import pytest

from icekeeper.common.door_fileio import SinglePutFileIO
from icekeeper.common.storage import read_file, write_file
from tests.support.object_stores import storage_door
from tests.support.relay import Relay, refuse


def _methods(relay: Relay, since: int) -> list[str]:
    return [line.split(" ", 1)[0] for line in relay.requests[since:]]


@pytest.fixture
def relay(s3_storage):
    relay = Relay(s3_storage.pyiceberg_properties()["s3.endpoint"])
    yield relay
    relay.close()


def test_the_door_writes_a_small_file_to_s3_in_one_put(s3_storage, relay: Relay) -> None:
    properties = {**s3_storage.pyiceberg_properties(), "s3.endpoint": relay.address}
    uri = s3_storage.uri(f"single-put-{uuid.uuid4().hex[:8]}/moniker.json")
    body = os.urandom(6_000)
    with storage_door(properties):
        before = len(relay.requests)
        write_file(uri, body)
        assert _methods(relay, before) == ["PUT"]
        assert read_file(uri) == body


@pytest.mark.parametrize("retry_strategy", [None, "pyarrow.fs.AwsDefaultS3RetryStrategy"])
def test_pyiceberg_s_own_io_writes_a_manifest_in_one_put_with_its_own_settings(
    s3_storage, relay: Relay, retry_strategy: str | None
) -> None:
    """pyiceberg's S3 settings reach the rebuilt filesystem (the write is signed with them and
    lands); with a retry strategy configured, which that rebuild would drop, pyiceberg's own
    filesystem is kept (multipart: POST, PUT, POST)."""
    properties = {**s3_storage.pyiceberg_properties(), "s3.endpoint": relay.address}
    if retry_strategy:
        properties["s3.retry-strategy-impl"] = retry_strategy
    io = SinglePutFileIO(properties)
    location = s3_storage.uri(f"single-put-{uuid.uuid4().hex[:8]}/metadata/m0.avro")
    body = os.urandom(6_000)
    before = len(relay.requests)
    with io.new_output(location).create(overwrite=False) as out:
        out.write(body)
    # Leaving out create's check that no file is there (HEAD, then a listing: a GET).
    written = [m for m in _methods(relay, before) if m not in ("HEAD", "GET")]
    assert written == (["POST", "PUT", "POST"] if retry_strategy else ["PUT"])
    with io.new_input(location).open() as stream:
        assert stream.read() == body


def test_a_large_whole_write_is_one_put_and_a_refused_one_leaves_the_file_as_it_was(
    s3_storage, relay: Relay
) -> None:
    """From 5 MiB on, a whole write goes through botocore's single PUT: pyarrow's delayed-open
    stream would start a multipart upload inside its write and, that failing, publish an empty
    file over the old one as it closed. Refused, the write raises an OSError (an outage, as the
    callers take storage errors) and the file keeps its old bytes."""
    from icekeeper.common.stores.s3 import ONE_PUT_BYTES

    properties = {**s3_storage.pyiceberg_properties(), "s3.endpoint": relay.address}
    uri = s3_storage.uri(f"single-put-{uuid.uuid4().hex[:8]}/key-index.parquet")
    old, new = os.urandom(1_000), os.urandom(ONE_PUT_BYTES + 1)
    with storage_door(properties):
        write_file(uri, old)
        before = len(relay.requests)
        write_file(uri, new)
        assert _methods(relay, before) == ["PUT"]
        assert read_file(uri) == new
        write_file(uri, old)
        relay.arm(lambda sent: sent.startswith(b"PUT "), refuse(503), times=10**6)
        with pytest.raises(OSError, match="PUT"):
            write_file(uri, new)
        relay.arm(lambda sent: False, refuse(503))
        assert read_file(uri) == old


class _ConfigServer(http.server.BaseHTTPRequestHandler):
    """A REST catalog's `GET /v1/config` and nothing else."""

    defaults: dict[str, str] = {}

    def do_GET(self) -> None:
        body = json.dumps({"defaults": self.defaults, "overrides": {}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.mark.parametrize(
    ("server_names", "expected"),
    [(None, "icekeeper.common.door_fileio.SinglePutFileIO"), ("x.TheirFileIO", "x.TheirFileIO")],
)
def test_a_rest_catalog_s_tables_write_in_one_put_unless_the_server_names_a_file_io(
    tmp_path: Path, server_names: str | None, expected: str
) -> None:
    """The bookkeeper's default FileIO for a REST catalog is set after the server's configuration
    is merged: a FileIO the server names in its defaults stays its choice."""
    from icekeeper.common.catalog import open_catalog
    from tests.support.shop_items import bookkeeper_config

    handler = type("Handler", (_ConfigServer,), {"defaults": {}})
    if server_names:
        handler.defaults = {"py-io-impl": server_names}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        properties = {"type": "rest", "uri": f"http://127.0.0.1:{server.server_port}"}
        config = bookkeeper_config(tmp_path, catalog__properties=json.dumps(properties))
        assert open_catalog(config).properties["py-io-impl"] == expected
    finally:
        server.shutdown()

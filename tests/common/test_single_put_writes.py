"""A small file goes to S3 in one PUT, not a multipart upload of three requests (issue 28's REST
commit writes a manifest and a manifest list each time): through the storage door, and through
pyiceberg's own FileIO that a REST catalog's tables keep (`SinglePutFileIO`)."""

from __future__ import annotations

import os
import uuid

import pytest

from icekeeper.common.door_fileio import SinglePutFileIO
from icekeeper.common.storage import read_file, write_file
from tests.support.object_stores import storage_door
from tests.support.relay import Relay


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

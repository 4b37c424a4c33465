"""S3 deletes a transaction log's acknowledged monikers a thousand a request (`S3Store.
delete_files`, DeleteObjects). S3 answers such a request 200 even when it refused some keys,
naming them in the answer: those, and only those, must come back as not deleted. The answers here
are botocore's stubbed ones (an S3 server that refuses one key of a batch cannot be made on
demand); the requests themselves run against the stack's S3 server in
tests/bookkeeper/test_txlog_on_object_stores.py."""

from __future__ import annotations

import base64
import hashlib

import pytest
from botocore.stub import Stubber

from icekeeper.common.stores.s3 import DELETE_BATCH, S3Store

PROPERTIES = {
    "s3.endpoint": "http://127.0.0.1:9",
    "s3.access-key-id": "key",
    "s3.secret-access-key": "secret",
    "s3.region": "us-east-1",
}


def _request(bucket: str, keys: list[str]) -> dict:
    return {"Bucket": bucket, "Delete": {"Objects": [{"Key": key} for key in keys], "Quiet": True}}


def test_keys_s3_refused_in_a_batch_are_named_and_only_they() -> None:
    store = S3Store(PROPERTIES)
    with Stubber(store.client) as stub:
        stub.add_response(
            "delete_objects",
            {"Errors": [{"Key": "log/b.json", "Code": "AccessDenied", "Message": "Access Denied"}]},
            _request("lake", ["log/a.json", "log/b.json", "log/c.json"]),
        )
        failures = store.delete_files(["lake/log/a.json", "lake/log/b.json", "lake/log/c.json"])
        stub.assert_no_pending_responses()
    assert list(failures) == ["lake/log/b.json"]
    assert isinstance(failures["lake/log/b.json"], OSError)
    assert "AccessDenied" in str(failures["lake/log/b.json"])


def test_more_keys_than_a_request_takes_go_in_several_and_a_failed_request_fails_its_keys() -> None:
    store = S3Store(PROPERTIES)
    keys = [f"log/{index:05d}.json" for index in range(DELETE_BATCH + 1)]
    with Stubber(store.client) as stub:
        stub.add_response("delete_objects", {}, _request("lake", keys[:DELETE_BATCH]))
        stub.add_client_error(
            "delete_objects",
            service_error_code="SlowDown",
            http_status_code=503,
            expected_params=_request("lake", keys[DELETE_BATCH:]),
        )
        failures = store.delete_files([f"lake/{key}" for key in keys])
        stub.assert_no_pending_responses()
    assert list(failures) == [f"lake/{keys[-1]}"]
    assert "SlowDown" in str(failures[f"lake/{keys[-1]}"])


def test_a_key_s3_could_not_delete_now_is_asked_for_again() -> None:
    """`SlowDown` for one key in a 200 answer: botocore does not retry a 200; the store does."""
    store = S3Store(PROPERTIES)
    with Stubber(store.client) as stub:
        stub.add_response(
            "delete_objects",
            {
                "Errors": [
                    {"Key": "log/b.json", "Code": "SlowDown", "Message": "Reduce your rate"},
                    {"Key": "log/c.json", "Code": "AccessDenied", "Message": "Access Denied"},
                ]
            },
            _request("lake", ["log/a.json", "log/b.json", "log/c.json"]),
        )
        stub.add_response("delete_objects", {}, _request("lake", ["log/b.json"]))
        failures = store.delete_files(["lake/log/a.json", "lake/log/b.json", "lake/log/c.json"])
        stub.assert_no_pending_responses()
    # b went the second time; c's refusal is not one to ask again, and is kept.
    assert list(failures) == ["lake/log/c.json"]


def test_a_batch_delete_carries_a_content_md5_in_its_signature() -> None:
    """Older MinIO and Ceph refuse a DeleteObjects without a Content-MD5, which botocore no
    longer sends on its own: the request as it would go out (caught before it is sent)."""

    class Sent(Exception):
        pass

    seen: dict = {}

    def capture(request, **_) -> None:
        headers = {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        seen.update(headers=headers, body=request.body)
        raise Sent

    store = S3Store(PROPERTIES)
    store.client.meta.events.register("before-send.s3.DeleteObjects", capture)
    with pytest.raises(Sent):
        store.delete_files(["lake/log/a.json", "lake/log/b.json"])
    md5 = base64.b64encode(hashlib.md5(seen["body"], usedforsecurity=False).digest()).decode()
    assert seen["headers"]["Content-MD5"] == md5
    assert "content-md5" in seen["headers"]["Authorization"]  # among the signed headers

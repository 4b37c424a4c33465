"""S3 and S3-compatible stores (MinIO, Ceph, s3proxy): one URI form, `s3://<bucket>/<key>`.

Configured with the properties pyiceberg and Iceberg's S3FileIO already take (`s3.endpoint`,
`s3.access-key-id`, `s3.secret-access-key`, `s3.session-token`, `s3.region` or `client.region`,
`s3.path-style-access`, ...), this module maps them for each client: pyarrow's S3FileSystem
(every read and whole write), botocore (the conditional writes pyarrow cannot make), Iceberg's
S3FileIO and Hadoop's s3a in Spark, and DuckDB's S3 secret. `s3a://` and `s3n://` name the same
objects as `s3://` (Hadoop's spellings) and are opened alike.

Guarantees used: a PUT is visible whole or not at all; `If-None-Match: *` makes it a
create-if-absent (AWS S3 since August 2024, MinIO, s3proxy 2.x+): exactly one of two creators
wins, the other gets 412. `If-Match: <etag>` makes it a replace-if-unchanged on AWS S3 (since
November 2024); s3proxy 4.1 checks it but not atomically (two concurrent replaces of one ETag
both succeeded in 1 to 6 of 16 tries each), which is why the lease relies on create-if-absent
only. Listing and reading after a write are strongly consistent on AWS S3 (since December 2020).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from pyarrow import fs as pafs

from icekeeper.common.stores.base import Store, Versioned

log = logging.getLogger(__name__)

SCHEMES = ("s3", "s3a", "s3n")
DELETE_BATCH = 1000
"""Keys one DeleteObjects request may name (S3's limit)."""
BATCH_KEY_RETRIES = 2
"""Times a key a DeleteObjects answer lists as not deleted now is asked for again."""
RETRIED_KEY_ERRORS = frozenset(
    {"InternalError", "SlowDown", "ServiceUnavailable", "RequestTimeout"}
)
BATCH_DELETE_NOT_TAKEN = frozenset(
    {
        "NotImplemented",
        "MethodNotAllowed",
        "MissingContentMD5",
        "MissingContentLength",
        "501",
        "405",
    }
)
"""Error codes (or, without one, HTTP statuses) of a store that does not take a multi-object
delete at all. Not every 400: S3 answers one to a request cut short or a token expired, and a
store sent one key at a time for good after such a moment would make three requests a key."""
S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
HADOOP_AWS_VERSION = "3.4.2"
"""hadoop-aws of the Hadoop that PySpark 4.1.1 ships (hadoop-client-api 3.4.2)."""
AWS_SDK_TRANSFER_MANAGER_VERSION = "2.44.4"
"""The one AWS SDK module s3a needs beyond iceberg-aws-bundle's S3 client (the SDK's own
`bundle` would add ~600 MB for the same classes)."""


def _first(properties: Mapping[str, str], *keys: str) -> str | None:
    for key in keys:
        if properties.get(key):
            return properties[key]
    return None


def _true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("true", "1", "yes")


def region(properties: Mapping[str, str]) -> str | None:
    return _first(properties, "s3.region", "client.region")


def path_style(properties: Mapping[str, str]) -> bool:
    """Path-style addressing (`http://host/bucket/key`): asked for with `s3.path-style-access`
    (Iceberg's Java name), or implied by an endpoint without `s3.force-virtual-addressing`
    (pyiceberg's), which is what S3-compatible servers on a plain host need."""
    if _true(properties.get("s3.force-virtual-addressing")):
        return False
    return _true(properties.get("s3.path-style-access")) or bool(properties.get("s3.endpoint"))


def pyarrow_filesystem(properties: Mapping[str, str]) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem, with the arguments pyiceberg gives it for the same properties."""
    arguments: dict[str, Any] = {
        "access_key": _first(properties, "s3.access-key-id", "client.access-key-id"),
        "secret_key": _first(properties, "s3.secret-access-key", "client.secret-access-key"),
        "session_token": _first(properties, "s3.session-token", "client.session-token"),
        "region": region(properties),
        "role_arn": _first(properties, "s3.role-arn", "client.role-arn"),
        "session_name": _first(properties, "s3.role-session-name", "client.role-session-name"),
    }
    endpoint = properties.get("s3.endpoint")
    if endpoint:
        parsed = urllib.parse.urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        arguments["endpoint_override"] = parsed.netloc + parsed.path.rstrip("/")
        arguments["scheme"] = parsed.scheme
    arguments["force_virtual_addressing"] = not path_style(properties)
    if properties.get("s3.proxy-uri"):
        arguments["proxy_options"] = properties["s3.proxy-uri"]
    for key, argument in (
        ("s3.connect-timeout", "connect_timeout"),
        ("s3.request-timeout", "request_timeout"),
    ):
        if properties.get(key):
            arguments[argument] = float(properties[key])
    if properties.get("s3.anonymous"):
        arguments["anonymous"] = _true(properties["s3.anonymous"])
    # A file under pyarrow's part size (10 MiB) in one PUT at its close, not a multipart upload
    # started at its open (three requests): every moniker, claim, manifest and small data file.
    # A stream that passes the part size starts its upload in a `write`; if that fails, closing
    # the stream (pyarrow always closes, even on an error) publishes what it held: only new
    # names are streamed (data files, manifests: never referenced after a failed write, orphans
    # for the reaper), and whole writes of a fixed name over the limit take botocore's single
    # PUT instead (`S3Store.write_whole`).
    arguments["allow_delayed_open"] = True
    return pafs.S3FileSystem(**{k: v for k, v in arguments.items() if v is not None})


def botocore_client(properties: Mapping[str, str]) -> Any:
    """A botocore S3 client on the same endpoint and credentials (None values: botocore's own
    credential chain, as pyarrow's)."""
    import botocore.config
    import botocore.session

    session = botocore.session.get_session()
    client = session.create_client(
        "s3",
        endpoint_url=properties.get("s3.endpoint") or None,
        aws_access_key_id=_first(properties, "s3.access-key-id", "client.access-key-id"),
        aws_secret_access_key=_first(
            properties, "s3.secret-access-key", "client.secret-access-key"
        ),
        aws_session_token=_first(properties, "s3.session-token", "client.session-token"),
        region_name=region(properties) or "us-east-1",
        config=botocore.config.Config(
            s3={"addressing_style": "path" if path_style(properties) else "auto"},
            connect_timeout=float(properties.get("s3.connect-timeout") or 10),
            read_timeout=float(properties.get("s3.request-timeout") or 30),
            retries={"mode": "standard", "max_attempts": 3},
            max_pool_connections=32,
        ),
    )
    client.meta.events.register("before-sign.s3.DeleteObjects", _content_md5)
    return client


def _content_md5(request: Any, **_: Any) -> None:
    """A DeleteObjects request's Content-MD5: S3 takes the CRC32 botocore sends since 1.36, but
    older MinIO and Ceph releases refuse the request without an MD5."""
    body = request.body.encode() if isinstance(request.body, str) else request.body
    if isinstance(body, bytes) and "Content-MD5" not in request.headers:
        digest = hashlib.md5(body, usedforsecurity=False).digest()
        request.headers["Content-MD5"] = base64.b64encode(digest).decode()


ONE_PUT_BYTES = 5 * 1024 * 1024
"""Whole writes from this size on go through botocore (`S3Store.write_whole`), well under
pyarrow's 10 MiB part size."""


class S3Store(Store):
    """An S3 endpoint (every bucket on it): reads and whole writes through pyarrow, conditional
    writes through botocore."""

    kind = "s3"

    def __init__(self, properties: Mapping[str, str]) -> None:
        self.properties = dict(properties)
        self.filesystem = pyarrow_filesystem(self.properties)
        self._client: Any = None
        self._lock = threading.Lock()
        self._batch_deletes_refused = False
        """Set once the store refused a DeleteObjects as a request it does not take."""

    @property
    def client(self) -> Any:
        """The botocore client, made on first use: a process that only reads and writes data
        files never needs it. Making it takes up to a second on a busy node, which is why the
        lease makes it before it takes the time its lease starts at (`warm_up`)."""
        with self._lock:
            if self._client is None:
                self._client = botocore_client(self.properties)
            return self._client

    def warm_up(self) -> None:
        _ = self.client

    def write_whole(self, path: str, body: bytes, durable: bool = True) -> None:
        """One PUT of the whole body: pyarrow's for a small one; botocore's from `ONE_PUT_BYTES`
        on, where pyarrow's delayed-open stream would start a multipart upload inside its write,
        and, that failing, publish an empty file over `path` as it closes."""
        if len(body) < ONE_PUT_BYTES:
            super().write_whole(path, body, durable)
            return
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, key = _split(path)
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=body)
        except (BotoCoreError, ClientError) as error:
            # An OSError, as pyarrow's: callers take a storage error for an outage.
            raise OSError(f"S3 PUT of s3://{path} ({len(body):,} B) failed: {error}") from error

    def create_if_absent(self, path: str, body: bytes) -> bool:
        return self._put(path, body, IfNoneMatch="*")

    def replace_if_unchanged(self, path: str, body: bytes, version: str) -> bool:
        return self._put(path, body, IfMatch=version)

    def read_versioned(self, path: str) -> Versioned | None:
        bucket, key = _split(path)
        try:
            answer = self.client.get_object(Bucket=bucket, Key=key)
        except self.client.exceptions.NoSuchKey:
            return None
        return Versioned(answer["Body"].read(), answer["ETag"])

    def delete_files(self, paths: Sequence[str]) -> dict[str, OSError]:
        """S3's DeleteObjects, up to `DELETE_BATCH` keys a request: pyarrow's `delete_file` makes
        three requests a file (a HEAD, the DELETE, and a PUT of an empty "folder" marker that
        keeps the parent listed), a transaction log's 1,000 acknowledgements 3,000 of them. A key
        that is not there is deleted as far as S3 says (no error).

        A key S3 could not delete now (`InternalError`, `SlowDown` in the answer's list: the
        answer itself is a 200, which botocore does not retry) is tried again, twice; a request
        that fails fails each of its keys (an outage: the caller tries them again later). A store
        that does not take the request at all (older MinIO and Ceph refuse it without a
        Content-MD5, which is added; GCS's S3 interface has no multi-object delete) is asked one
        key at a time from then on, as pyarrow does."""
        by_bucket: dict[str, list[str]] = {}
        for path in paths:
            bucket, key = _split(path)
            by_bucket.setdefault(bucket, []).append(key)
        failures: dict[str, OSError] = {}
        for bucket, keys in by_bucket.items():
            for start in range(0, len(keys), DELETE_BATCH):
                batch = keys[start : start + DELETE_BATCH]
                if self._batch_deletes_refused:
                    failures.update(super().delete_files([f"{bucket}/{key}" for key in batch]))
                else:
                    failures.update(self._delete_batch(bucket, batch))
        return failures

    def _delete_batch(self, bucket: str, keys: list[str]) -> dict[str, OSError]:
        from botocore.exceptions import BotoCoreError, ClientError

        failures: dict[str, OSError] = {}
        for attempt in range(1 + BATCH_KEY_RETRIES):
            try:
                answer = self.client.delete_objects(
                    Bucket=bucket,
                    Delete={"Objects": [{"Key": key} for key in keys], "Quiet": True},
                )
            except ClientError as error:
                code = str(error.response.get("Error", {}).get("Code", ""))
                status = str(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode"))
                if code in BATCH_DELETE_NOT_TAKEN or (
                    code in ("", status) and status in BATCH_DELETE_NOT_TAKEN
                ):
                    log.warning(
                        "the S3 store refused a multi-object delete; deleting one key at a time",
                        extra={"bucket": bucket, "error": str(error)},
                    )
                    self._batch_deletes_refused = True
                    failures.update(super().delete_files([f"{bucket}/{key}" for key in keys]))
                    return failures
                failures.update(_each_failed(bucket, keys, error))
                return failures
            except BotoCoreError as error:
                failures.update(_each_failed(bucket, keys, error))
                return failures
            again = []
            for refused in answer.get("Errors", []):
                key = refused.get("Key") or ""
                retried = refused.get("Code") in RETRIED_KEY_ERRORS
                if key and retried and attempt < BATCH_KEY_RETRIES:
                    again.append(key)
                    continue
                failures[f"{bucket}/{key}"] = OSError(
                    f"{bucket}/{key}: not deleted ({refused.get('Code')}: {refused.get('Message')})"
                )
            if not again:
                break
            time.sleep(0.2 * 2**attempt)
            keys = again
        return failures

    def _put(self, path: str, body: bytes, **condition: str) -> bool:
        from botocore.exceptions import ClientError

        bucket, key = _split(path)
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=body, **condition)
        except ClientError as error:
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = error.response.get("Error", {}).get("Code")
            # 412: the condition failed. 409 ConditionalRequestConflict: a concurrent
            # conditional write to the key is in flight (AWS); it will win or lose, not us.
            if status in (412, 409) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            if status == 404 and "IfMatch" in condition:
                return False  # replace of a file that is gone
            raise
        return True


def _each_failed(bucket: str, keys: list[str], error: Exception) -> dict[str, OSError]:
    return {f"{bucket}/{key}": OSError(f"DeleteObjects: {error}") for key in keys}


def _split(path: str) -> tuple[str, str]:
    bucket, _, key = path.partition("/")
    return bucket, key


def iceberg_java_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """Iceberg's S3FileIO properties (a Spark catalog's) for the same store."""
    mapped = {"io-impl": S3_FILE_IO}
    for key in (
        "s3.endpoint",
        "s3.access-key-id",
        "s3.secret-access-key",
        "s3.session-token",
        "s3.path-style-access",
    ):
        if properties.get(key):
            mapped[key] = properties[key]
    if properties.get("s3.endpoint") and path_style(properties):
        mapped["s3.path-style-access"] = "true"
    if region(properties):
        mapped["client.region"] = region(properties)  # type: ignore[assignment]
    return mapped


def hadoop_conf(properties: Mapping[str, str]) -> dict[str, str]:
    """Spark settings (`spark.hadoop.*`) for Hadoop's s3a under the same `s3://` URIs: the files
    Spark itself writes and lists (the `spark-sql` engine's Parquet, orphan listing)."""
    prefix = "spark.hadoop.fs.s3a"
    conf = {
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3n.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
    }
    endpoint = properties.get("s3.endpoint")
    if endpoint:
        conf[f"{prefix}.endpoint"] = endpoint
        conf[f"{prefix}.connection.ssl.enabled"] = str(endpoint.startswith("https")).lower()
    if path_style(properties):
        conf[f"{prefix}.path.style.access"] = "true"
    if region(properties):
        conf[f"{prefix}.endpoint.region"] = region(properties)  # type: ignore[assignment]
    access = _first(properties, "s3.access-key-id", "client.access-key-id")
    secret = _first(properties, "s3.secret-access-key", "client.secret-access-key")
    token = _first(properties, "s3.session-token", "client.session-token")
    if access and secret:
        conf[f"{prefix}.access.key"] = access
        conf[f"{prefix}.secret.key"] = secret
    if token:
        conf[f"{prefix}.session.token"] = token
        conf[f"{prefix}.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        )
    return conf


def spark_packages(iceberg_version: str) -> tuple[str, ...]:
    """Maven coordinates Spark needs for S3: Iceberg's S3FileIO with its AWS SDK, Hadoop's s3a."""
    return (
        f"org.apache.iceberg:iceberg-aws-bundle:{iceberg_version}",
        f"org.apache.hadoop:hadoop-aws:{HADOOP_AWS_VERSION}",
        f"software.amazon.awssdk:s3-transfer-manager:{AWS_SDK_TRANSFER_MANAGER_VERSION}",
    )


def duckdb_statements(properties: Mapping[str, str]) -> list[str]:
    """A DuckDB secret (httpfs loaded) that reads `s3://` URIs of the same store."""
    fields = ["TYPE S3"]

    def quoted(value: str) -> str:
        return "'" + value.replace("'", "''") + "'"

    access = _first(properties, "s3.access-key-id", "client.access-key-id")
    secret = _first(properties, "s3.secret-access-key", "client.secret-access-key")
    token = _first(properties, "s3.session-token", "client.session-token")
    if access and secret:
        fields += [f"KEY_ID {quoted(access)}", f"SECRET {quoted(secret)}"]
    if token:
        fields.append(f"SESSION_TOKEN {quoted(token)}")
    if region(properties):
        fields.append(f"REGION {quoted(region(properties) or '')}")
    endpoint = properties.get("s3.endpoint")
    if endpoint:
        parsed = urllib.parse.urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        fields.append(f"ENDPOINT {quoted(parsed.netloc)}")
        fields.append(f"USE_SSL {'true' if parsed.scheme == 'https' else 'false'}")
    if path_style(properties):
        fields.append("URL_STYLE 'path'")
    return [f"CREATE OR REPLACE SECRET icekeeper_s3 ({', '.join(fields)})"]

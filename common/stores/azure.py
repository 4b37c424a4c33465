"""Azure Blob Storage and ADLS Gen2: one URI form, `abfss://<container>@<account>.dfs.core.windows.net/<path>`.

That is the form Spark (Hadoop's abfs, Iceberg's ADLSFileIO) reads and adlfs writes; pyarrow's
`abfs://<container>/<path>` short form and Hadoop's `wasb[s]://<container>@<account>.blob...`
name the same blobs and are opened alike. Configured with pyiceberg's properties
(`adls.account-name`, `adls.account-key`, `adls.sas-token`, `adls.connection-string`,
`adls.blob-storage-authority` / `-scheme` for an emulator), mapped here for pyarrow's
AzureFileSystem, azure-storage-blob (conditional writes) and Iceberg's ADLSFileIO in Spark.

Guarantees used: a blob upload is visible whole or not at all; `If-None-Match: *` (an upload
with `overwrite=False`) creates only if absent, and `If-Match: <etag>` replaces only if
unchanged, both atomic in the service (and in Azurite). Without a hierarchical namespace there is
no rename (pyarrow refuses `move`: apache/arrow#40405), so nothing here renames.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

from pyarrow import fs as pafs

from icekeeper.common.stores.base import Store, Versioned

SCHEMES = ("abfs", "abfss", "wasb", "wasbs")
ADLS_FILE_IO = "org.apache.iceberg.azure.adlsv2.ADLSFileIO"
HADOOP_AZURE = "org.apache.hadoop:hadoop-azure:3.4.2"
"""Hadoop's abfs driver, of the Hadoop PySpark 4.1.1 ships: what Spark's own Parquet writes to
`abfss://` need (the `spark-sql` engine, upsert compaction); PySpark has none."""
ICEBERG_AZURE_BUNDLE = "org.apache.iceberg:iceberg-azure-bundle:1.10.0"
"""No 1.11.0 azure bundle is on Maven Central; 1.10.0's ADLSFileIO works with the 1.11 runtime."""


def connection_string_parts(properties: Mapping[str, str]) -> dict[str, str]:
    """`adls.connection-string` as a mapping (`AccountName`, `AccountKey`, `BlobEndpoint`, ...)."""
    text = properties.get("adls.connection-string") or ""
    parts = {}
    for item in text.split(";"):
        key, separator, value = item.partition("=")
        if separator:
            parts[key.strip()] = value.strip()
    return parts


def account_name(properties: Mapping[str, str]) -> str | None:
    return properties.get("adls.account-name") or connection_string_parts(properties).get(
        "AccountName"
    )


def _blob_endpoint(properties: Mapping[str, str]) -> tuple[str, str] | None:
    """(scheme, authority) of an explicit blob endpoint (an emulator), if one is configured."""
    if properties.get("adls.blob-storage-authority"):
        return (
            properties.get("adls.blob-storage-scheme", "https"),
            properties["adls.blob-storage-authority"],
        )
    endpoint = connection_string_parts(properties).get("BlobEndpoint")
    if endpoint:
        parsed = urllib.parse.urlparse(endpoint)
        return parsed.scheme, parsed.netloc
    return None


def sas_token(properties: Mapping[str, str]) -> str | None:
    """The SAS token without its leading `?` (the portal shows one, the SDKs take none)."""
    token = properties.get("adls.sas-token") or connection_string_parts(properties).get(
        "SharedAccessSignature"
    )
    return token.lstrip("?") if token else None


def pyarrow_filesystem(properties: Mapping[str, str], account: str) -> pafs.AzureFileSystem:
    parts = connection_string_parts(properties)
    token = sas_token(properties)
    arguments: dict[str, Any] = {
        "account_name": account,
        "account_key": properties.get("adls.account-key") or parts.get("AccountKey"),
        # pyarrow appends the token to each URL as it is: without its `?` Azure answers 400.
        "sas_token": f"?{token}" if token else None,
        "client_id": properties.get("adls.client-id"),
        "client_secret": properties.get("adls.client-secret"),
        "tenant_id": properties.get("adls.tenant-id"),
    }
    endpoint = _blob_endpoint(properties)
    if endpoint is not None:
        scheme, authority = endpoint
        arguments.update(
            blob_storage_scheme=scheme,
            blob_storage_authority=authority,
            dfs_storage_scheme=properties.get("adls.dfs-storage-scheme", scheme),
            dfs_storage_authority=properties.get("adls.dfs-storage-authority", authority),
        )
    return pafs.AzureFileSystem(**{k: v for k, v in arguments.items() if v is not None})


def blob_service_client(properties: Mapping[str, str], account: str) -> Any:
    from azure.storage.blob import BlobServiceClient

    if properties.get("adls.connection-string"):
        return BlobServiceClient.from_connection_string(properties["adls.connection-string"])
    endpoint = _blob_endpoint(properties)
    if endpoint is not None:
        url = f"{endpoint[0]}://{endpoint[1]}/{account}"
    else:
        url = f"https://{account}.blob.core.windows.net"
    credential: Any = None
    if properties.get("adls.account-key"):
        credential = {"account_name": account, "account_key": properties["adls.account-key"]}
    elif sas_token(properties):
        credential = sas_token(properties)
    return BlobServiceClient(url, credential=credential)


class AzureStore(Store):
    """One storage account: reads through pyarrow, whole and conditional writes through
    azure-storage-blob. Paths are `<container>/<blob name>`."""

    kind = "azure"

    def __init__(self, properties: Mapping[str, str], account: str) -> None:
        self.properties = dict(properties)
        self.account = account
        self.filesystem = pyarrow_filesystem(self.properties, account)
        self._client: Any = None
        self._lock = threading.Lock()

    def _service(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = blob_service_client(self.properties, self.account)
            return self._client

    def warm_up(self) -> None:
        self._service()

    def _blob(self, path: str) -> Any:
        container, _, name = path.partition("/")
        return self._service().get_blob_client(container, name)

    def write_whole(self, path: str, body: bytes, durable: bool = True) -> None:
        """One Put Blob (or staged blocks committed at once, over 64 MiB): pyarrow's output stream
        first replaces the blob with an empty one and commits the bytes only at its close, so
        every reader in between saw the file empty (a checkpoint as none, a rewrite request as
        unreadable), and a write cut or killed there left it empty for good. Durable once
        answered, so `durable` changes nothing here (it matters on local folders)."""
        self._blob(path).upload_blob(bytes(body), overwrite=True)

    def create_if_absent(self, path: str, body: bytes) -> bool:
        from azure.core.exceptions import ResourceExistsError

        try:
            self._blob(path).upload_blob(body, overwrite=False)
        except ResourceExistsError:
            return False
        return True

    def replace_if_unchanged(self, path: str, body: bytes, version: str) -> bool:
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

        try:
            self._blob(path).upload_blob(
                body, overwrite=True, etag=version, match_condition=MatchConditions.IfNotModified
            )
        except (ResourceModifiedError, ResourceNotFoundError):
            return False
        return True

    def read_versioned(self, path: str) -> Versioned | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            download = self._blob(path).download_blob()
        except ResourceNotFoundError:
            return None
        return Versioned(download.readall(), download.properties.etag)


def iceberg_java_properties(properties: Mapping[str, str], account: str | None) -> dict[str, str]:
    """Iceberg's ADLSFileIO properties (a Spark catalog's) for the same account. Iceberg keys an
    endpoint by the account's full DFS host: keyed by the account alone, the client went to the
    real Azure host and hung (notes of issue 28)."""
    mapped = {"io-impl": ADLS_FILE_IO}
    if account is None:
        return mapped
    host = f"{account}.dfs.core.windows.net"
    key = properties.get("adls.account-key") or connection_string_parts(properties).get(
        "AccountKey"
    )
    if key:
        mapped["adls.auth.shared-key.account.name"] = account
        mapped["adls.auth.shared-key.account.key"] = key
    token = sas_token(properties)
    if token:
        mapped[f"adls.sas-token.{host}"] = token
    endpoint = _blob_endpoint(properties)
    if endpoint is not None:
        mapped[f"adls.connection-string.{host}"] = f"{endpoint[0]}://{endpoint[1]}/{account}"
    return mapped


def hadoop_conf(properties: Mapping[str, str], account: str | None) -> dict[str, str]:
    """Spark settings for Hadoop's abfs driver (plain files Spark writes and lists)."""
    if account is None:
        return {}
    key = properties.get("adls.account-key") or connection_string_parts(properties).get(
        "AccountKey"
    )
    conf = {}
    if key:
        conf[f"spark.hadoop.fs.azure.account.key.{account}.dfs.core.windows.net"] = key
        conf[f"spark.hadoop.fs.azure.account.key.{account}.blob.core.windows.net"] = key
    token = sas_token(properties)
    if token:
        host = f"{account}.dfs.core.windows.net"
        conf[f"spark.hadoop.fs.azure.account.auth.type.{host}"] = "SAS"
        conf[f"spark.hadoop.fs.azure.sas.fixed.token.{host}"] = token
    return conf


def duckdb_statements(properties: Mapping[str, str]) -> list[str]:
    """A DuckDB secret (its azure extension loaded) that reads `az://<container>/<path>` of the
    configured account through the Blob endpoint: the connection string as configured (an
    emulator's `BlobEndpoint` with it), or one made from the account and its key or SAS token."""
    connection = properties.get("adls.connection-string")
    account = account_name(properties)
    if not connection and account:
        parts = [f"AccountName={account}", "DefaultEndpointsProtocol=https"]
        key = properties.get("adls.account-key")
        token = sas_token(properties)
        if key:
            parts.append(f"AccountKey={key}")
        elif token:
            parts.append(f"SharedAccessSignature={token}")
        endpoint = _blob_endpoint(properties)
        if endpoint is not None:
            parts.append(f"BlobEndpoint={endpoint[0]}://{endpoint[1]}/{account}")
        else:
            parts.append("EndpointSuffix=core.windows.net")
        connection = ";".join(parts)
    if not connection:
        return []
    quoted = "'" + connection.replace("'", "''") + "'"
    return [f"CREATE OR REPLACE SECRET icekeeper_azure (TYPE AZURE, CONNECTION_STRING {quoted})"]


def blob_url(uri: str) -> str:
    """DuckDB's `az://<container>/<path>` (read through the Blob endpoint) for a URI of the one
    form `abfss://<container>@<account>.dfs.core.windows.net/<path>` (or `wasbs://`)."""
    scheme, _, rest = uri.partition("://")
    if scheme.lower() not in SCHEMES:
        return uri
    authority, _, path = rest.partition("/")
    container = authority.partition("@")[0]
    return f"az://{container}/{path}"

"""The storage door pointed at the stack's object stores (s3proxy, Azurite blob), as a user's
`catalog.properties` would point it: the properties, a fresh folder per test, and the door
configured for the test's duration."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping

from icekeeper.common.storage import configure_storage, storage_settings
from icekeeper.localstack.services import AZURITE_ACCOUNT, AZURITE_KEY


@contextlib.contextmanager
def storage_door(properties: Mapping[str, str]) -> Iterator[None]:
    """This process's storage door configured with `properties`, as before afterwards."""
    previous = storage_settings()
    configure_storage(properties)
    try:
        yield
    finally:
        configure_storage(previous)


def azurite_blob_properties(blob_service) -> dict[str, str]:
    """pyiceberg's `adls.*` properties for the stack's Azurite blob service."""
    return {
        "adls.account-name": AZURITE_ACCOUNT,
        "adls.connection-string": (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={blob_service.address()};"
        ),
    }


def new_container(properties: Mapping[str, str]) -> str:
    """A container of the test's own on Azurite (a bucket is made once, by the S3 server)."""
    from azure.storage.blob import BlobServiceClient

    name = f"c{uuid.uuid4().hex[:12]}"
    client = BlobServiceClient.from_connection_string(properties["adls.connection-string"])
    client.create_container(name)
    return name


def azure_uri(container: str, path: str = "") -> str:
    """The one Azure URI form: `abfss://<container>@<account>.dfs.core.windows.net/<path>`."""
    return f"abfss://{container}@{AZURITE_ACCOUNT}.dfs.core.windows.net/{path.lstrip('/')}"

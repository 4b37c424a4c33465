"""A pyiceberg REST catalog as Spark opens it: Iceberg's RESTCatalog, with the same credentials.

The writer's and the reaper's Spark open the catalog the bookkeeper opens with pyiceberg, from the
same `catalog.properties`: against a secured server (Polaris, Unity, Gravitino with OAuth2, Glue's
SigV4 endpoint) Spark must authenticate as pyiceberg does. Both clients name most REST properties
alike (pyiceberg's `catalog/rest`, Iceberg's `OAuth2Properties`, `AuthProperties`, `RESTUtil`):
`credential`, `token`, `scope`, `oauth2-server-uri`, `audience`, `resource`, the `token-*`
refresh settings, `header.<name>` (a header sent with every request), `prefix`, `warehouse`, and
the `rest.*` ones (`rest.signing-region`, `rest.signing-name`, `rest.auth.*`). Translated:

- `rest.sigv4-enabled: true` is `rest.auth.type: sigv4` in Iceberg's Java client (the old name
  still works there, with a deprecation warning), whose signer needs the AWS SDK on Spark's
  classpath (`rest_catalog_packages`);
- SigV4's AWS credentials and region: pyiceberg reads `client.access-key-id`,
  `client.secret-access-key`, `client.session-token` and `client.region`; Java reads
  `rest.access-key-id`, `rest.secret-access-key`, `rest.session-token` and `rest.signing-region`.

The values are the config's, `${env:}` / `${file:}` references already resolved and remembered
as secrets by the config loader (common/config/secrets.py), so whatever icekeeper prints masks
them; nothing here logs. Properties only pyiceberg reads (`py-*`, `ssl.*`: the JVM's trust store
serves Java) are not passed, nor the storage ones, which `common/storage.py` maps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

SHARED_PROPERTIES = (
    "credential",
    "token",
    "scope",
    "oauth2-server-uri",
    "audience",
    "resource",
    "token-refresh-enabled",
    "token-exchange-enabled",
    "token-expires-in-ms",
    "prefix",
    "warehouse",
    "rest-page-size",
    "snapshot-loading-mode",
)
"""REST client properties pyiceberg and Iceberg's Java client name and read alike."""

SHARED_PREFIXES = ("header.", "rest.")
"""Families of them: a request header each, and the `rest.*` settings (auth, signing, client)."""

SIGV4_ENABLED = "rest.sigv4-enabled"
AUTH_TYPE = "rest.auth.type"
SIGV4_CREDENTIALS = {
    "client.access-key-id": "rest.access-key-id",
    "client.secret-access-key": "rest.secret-access-key",
    "client.session-token": "rest.session-token",
    "client.region": "rest.signing-region",
}
"""pyiceberg's SigV4 settings -> Iceberg Java's (RESTSigV4AuthSession, AwsProperties)."""

CONNECTION_TIMEOUT = "rest.client.connection-timeout-ms"
SOCKET_TIMEOUT = "rest.client.socket-timeout-ms"


def sigv4_enabled(properties: Mapping[str, str]) -> bool:
    """True when the catalog's requests are signed with AWS SigV4 (either client's way)."""
    return (
        str(properties.get(SIGV4_ENABLED, "")).strip().lower() == "true"
        or str(properties.get(AUTH_TYPE, "")).strip().lower() == "sigv4"
    )


def rest_catalog_properties(
    properties: Mapping[str, str], timeout_s: float | None = None
) -> dict[str, str]:
    """Iceberg RESTCatalog properties (without `type` and the FileIO's) for pyiceberg's
    RestCatalog `properties`.

    Args:
        timeout_s: `catalog.request_timeout`, as pyiceberg's side takes it (to connect, and for
            each read of the answer): `rest.client.connection-timeout-ms` and
            `rest.client.socket-timeout-ms`, unless the properties set them.
    """
    mapped = {"uri": properties["uri"]}
    for key, value in properties.items():
        if key in SHARED_PROPERTIES or key.startswith(SHARED_PREFIXES):
            mapped[key] = str(value)
    if sigv4_enabled(properties):
        mapped.pop(SIGV4_ENABLED, None)
        mapped.setdefault(AUTH_TYPE, "sigv4")
        for pyiceberg_key, java_key in SIGV4_CREDENTIALS.items():
            if pyiceberg_key in properties and java_key not in properties:
                mapped[java_key] = str(properties[pyiceberg_key])
    if timeout_s is not None:
        milliseconds = str(max(1, math.ceil(timeout_s * 1000)))
        mapped.setdefault(CONNECTION_TIMEOUT, milliseconds)
        mapped.setdefault(SOCKET_TIMEOUT, milliseconds)
    return mapped


def rest_catalog_packages(properties: Mapping[str, str], iceberg_version: str) -> tuple[str, ...]:
    """Maven coordinates Spark's REST catalog needs beyond iceberg-spark-runtime: the AWS SDK
    (in iceberg-aws-bundle) for SigV4 signing."""
    if sigv4_enabled(properties):
        return (f"org.apache.iceberg:iceberg-aws-bundle:{iceberg_version}",)
    return ()

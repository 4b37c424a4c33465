"""The configurations of docs/deployment.md, as the layouts' end-to-end tests run them.

Each YAML block of the page starts with `# layout: <name>` (`onprem-postgresql` holds only a
`catalog` section, which replaces `onprem-hive`'s). A test takes a block as written and changes
only what a user changes to point it at their own services (the page's "How these
configurations are tested" lists the same), with `placement`:

- where: `state_dir`, `cache_dir`, `spark.master`, `sources[].bootstrap_servers` and
  `schema_registry_url`, the topic `cdc.shop.orders`, the catalog's `uri` (of a PostgreSQL URL:
  its user, host, port, database and options, the password staying the block's reference), the
  block's bucket or container (the root of its `warehouse`, in every value), `adls.account-name`,
  `s3.endpoint` and `s3.region`, the storage queues' names;
- secrets: the environment variables the block's credentials reference, set to the stack's;
- `timings`, which a test passes so that one reaper pass has something to do (the orphan grace,
  the snapshot expiry).

Every key changed must be in the block, except those a `Placement` names as added (a block for
AWS has no `s3.endpoint`; the timings are defaults the blocks leave alone); every text renamed
must occur in it. So a block whose key is misspelt, or that names another transport, reaches the
checks and the flow as the page has it.
"""

from __future__ import annotations

import re
import urllib.parse
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from icekeeper.common.config import IcekeeperConfig, load_config
from tests.support.stack import REPO_ROOT, TEST_STACK_PORTS

DEPLOYMENT_PAGE = REPO_ROOT / "docs" / "deployment.md"
LAYOUTS = ("s3-rest", "azure", "onprem-hive", "onprem-postgresql")
"""The page's blocks, by the name on their `# layout:` line."""
PAGE_TOPIC = "cdc.shop.orders"
"""The topic every block reads: a test reads one of its own."""

_BLOCK = re.compile(r"```yaml\n# layout: ([\w-]+)[^\n]*\n(.*?)```", re.DOTALL)
_REFERENCE = re.compile(r"\$\{env:(\w+)\}")

Key = tuple[str | int, ...]


def layout_blocks(page: str | None = None) -> dict[str, str]:
    """Each `# layout:` block of the page (or of `page`, its text), by name."""
    text = DEPLOYMENT_PAGE.read_text(encoding="utf-8") if page is None else page
    blocks: dict[str, str] = {}
    for name, body in _BLOCK.findall(text):
        assert name not in blocks, f"two blocks named {name} in docs/deployment.md"
        blocks[name] = body
    return blocks


def layout_document(name: str, page: str | None = None) -> dict[str, Any]:
    """Block `name` of the page, parsed as the loader reads a file."""
    blocks = layout_blocks(page)
    if name == "onprem-postgresql":
        document = yaml.safe_load(blocks["onprem-hive"])
        document.update(yaml.safe_load(blocks[name]))  # its catalog instead of the metastore
        return document
    return yaml.safe_load(blocks[name])


@dataclass(frozen=True)
class StackEndpoints:
    """The test stack's addresses and credentials, standing for a user's own services."""

    kafka: str
    registry: str
    s3: Mapping[str, str] = field(default_factory=dict)
    """pyiceberg's `s3.*` properties of the stack's S3 server."""
    azure_connection_string: str = ""
    """Azurite's account: its key, blob and queue endpoints."""


def session_endpoints(
    s3: Mapping[str, str] | None = None, local_stack: Any = None
) -> StackEndpoints:
    """The session stack's: Kafka and the registry, the S3 server's properties if given, and
    Azurite's account if `local_stack` is."""
    connection = ""
    if local_stack is not None:
        from icekeeper.localstack.services import AZURITE_ACCOUNT, AZURITE_KEY

        connection = (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={local_stack.service('azurite-blob').address()};"
            f"QueueEndpoint={local_stack.service('azurite-queue').address()};"
        )
    return StackEndpoints(
        kafka=f"127.0.0.1:{TEST_STACK_PORTS['kafka_port']}",
        registry=f"http://127.0.0.1:{TEST_STACK_PORTS['registry_port']}/apis/ccompat/v7",
        s3=dict(s3 or {}),
        azure_connection_string=connection,
    )


@dataclass
class Placement:
    """What a test changes in a block (see the module's docstring)."""

    renamed: dict[str, str] = field(default_factory=dict)
    """Text replaced in every string value: the bucket or container root, the topic."""
    values: dict[Key, Any] = field(default_factory=dict)
    """Key path -> the value the test gives it."""
    added: set[Key] = field(default_factory=set)
    """Keys of `values` the block leaves to their defaults."""
    secrets: dict[str, str] = field(default_factory=dict)
    """Environment variable the block references -> the stack's credential."""


def placement(
    document: Mapping[str, Any],
    folder: Path,
    topic: str,
    stack: StackEndpoints,
    catalog_uri: str,
    store_root: str,
    timings: Mapping[Key, Any] = (),
) -> Placement:
    """How block `document` is pointed at the test stack: its catalog at `catalog_uri` (the
    stack's PostgreSQL URL, for a PostgreSQL block), its bucket or container root replaced by
    `store_root` (a folder of the test's own on the stack's store, ending in `/`)."""
    properties = document["catalog"]["properties"]
    place = Placement()
    root = re.match(r"^[a-z0-9]+://[^/]+/", properties["warehouse"])
    assert root, f"the block's warehouse {properties['warehouse']!r} has no bucket"
    place.renamed = {root.group(0): store_root, PAGE_TOPIC: topic}
    place.values = {
        ("state_dir",): str(folder / "state"),
        ("cache_dir",): str(REPO_ROOT / ".cache"),  # the checkout's jars, not fetched again
        ("spark", "master"): "local[2]",
        ("sources", 0, "bootstrap_servers"): stack.kafka,
        ("sources", 0, "schema_registry_url"): stack.registry,
    }
    place.added = {("cache_dir",)}
    catalog = ("catalog", "properties")
    if properties["uri"].startswith("postgresql"):
        uri, variable, password = _postgres_uri(properties["uri"], catalog_uri)
        place.values[(*catalog, "uri")] = uri
        place.secrets[variable] = password
    else:
        place.values[(*catalog, "uri")] = catalog_uri
    if any(key.startswith("s3.") for key in properties):
        place.values[(*catalog, "s3.endpoint")] = stack.s3["s3.endpoint"]
        place.values[(*catalog, "s3.region")] = stack.s3["s3.region"]
        if "s3.endpoint" not in properties:  # a block for AWS: its endpoint is the default
            place.added.add((*catalog, "s3.endpoint"))
        for key in ("s3.access-key-id", "s3.secret-access-key"):
            place.secrets[_variable(properties[key])] = stack.s3[key]
    if any(key.startswith("adls.") for key in properties):
        account = _connection_part(stack.azure_connection_string, "AccountName")
        place.values[(*catalog, "adls.account-name")] = account
        place.secrets[_variable(properties["adls.connection-string"])] = (
            stack.azure_connection_string
        )
    transport = document.get("transport", {})
    if transport.get("kind") == "azure-queue":
        queue = f"m-{uuid.uuid4().hex[:10]}"
        place.values[("transport", "queue_name")] = queue
        place.values[("transport", "dead_letter_queue_name")] = queue + "-dlq"
        place.secrets[_variable(transport["connection_string"])] = stack.azure_connection_string
    for key, value in dict(timings).items():
        place.values[key] = value
        place.added.add(key)
    return place


def write_layout_config(
    document: Mapping[str, Any], place: Placement, path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """`document` with `place`'s changes, written to `path`; its secrets set in the environment
    (as a user's deployment sets them) for the test's duration."""
    changed = _renamed(document, place.renamed)
    for key, value in place.values.items():
        _set(changed, key, value, may_add=key in place.added)
    for variable, value in place.secrets.items():
        monkeypatch.setenv(variable, value)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(changed, sort_keys=False), encoding="utf-8")
    return path


def deployment_config(
    name: str,
    folder: Path,
    topic: str,
    monkeypatch: pytest.MonkeyPatch,
    stack: StackEndpoints,
    catalog_uri: str,
    store_root: str,
    timings: Mapping[Key, Any] = (),
) -> IcekeeperConfig:
    """Layout `name` of docs/deployment.md on the test stack, loaded as every role loads it,
    with its tables dropped from the (shared) catalog if an earlier run left them there; it has
    passed `icekeeper config check --connect` (every role's start checks, and what it names
    answered)."""
    from icekeeper.common.catalog import open_catalog
    from icekeeper.config_check import check_config
    from tests.support.hms_pg_layouts import forget_table

    document = layout_document(name)
    place = placement(document, folder, topic, stack, catalog_uri, store_root, timings)
    path = write_layout_config(document, place, folder / f"{name}.yaml", monkeypatch)
    config = load_config(path)
    catalog = open_catalog(config)
    for table in config.tables:
        forget_table(catalog, table.identifier)
    check = check_config(str(path), connect=True)
    assert not (check.errors or check.unreachable or check.failed), "\n".join(check.lines())
    return config


def _renamed(node: Any, renamed: Mapping[str, str]) -> Any:
    found = {old: 0 for old in renamed}

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, str):
            for old, new in renamed.items():
                found[old] += value.count(old)
                value = value.replace(old, new)
        return value

    result = walk(node)
    missing = [old for old, count in found.items() if not count]
    assert not missing, f"the block names none of {missing}"
    return result


def _set(document: Any, key: Key, value: Any, may_add: bool) -> None:
    node = document
    for part in key[:-1]:
        node = node.setdefault(part, {}) if may_add and isinstance(node, dict) else node[part]
    if not may_add:
        assert key[-1] in node, f"the block has no {'.'.join(map(str, key))} to change"
    node[key[-1]] = value


def _variable(value: str) -> str:
    """The environment variable a block's credential references (`${env:NAME}`)."""
    match = _REFERENCE.fullmatch(value)
    assert match, f"the block writes a credential ({value[:12]}...) instead of a reference"
    return match.group(1)


def _postgres_uri(block_uri: str, stack_uri: str) -> tuple[str, str, str]:
    """The block's PostgreSQL URL at the stack's server: its user, host, port and database
    (without the block's options), the password still the block's reference; that reference's
    variable and the stack's password."""
    scheme, rest = block_uri.split("://", 1)
    user_info = rest.rpartition("@")[0]
    reference = user_info.partition(":")[2]
    stack = urllib.parse.urlsplit(stack_uri)
    uri = f"{scheme}://{stack.username}:{reference}@{stack.hostname}:{stack.port}{stack.path}"
    return uri, _variable(reference), urllib.parse.unquote(stack.password or "")


def _connection_part(connection_string: str, name: str) -> str:
    for item in connection_string.split(";"):
        key, _, value = item.partition("=")
        if key.strip() == name:
            return value.strip()
    raise AssertionError(f"no {name} in the stack's connection string")

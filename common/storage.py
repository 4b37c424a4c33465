"""The storage door: every byte icekeeper reads or writes outside the catalog goes through here.

Data files, monikers, claims, leases, key indexes, rewrite requests, checkpoints, dead letters and
commit reports are all opened by URI through this module, configured once per process
(`configure_storage`, done when the catalog is opened) with the FileIO properties users already
write in `catalog.properties` for pyiceberg: `s3.*` (and `client.*`) for S3, `adls.*` for Azure,
secrets as `${env:...}` / `${file:...}`. The same properties are mapped here for every other
engine that reads the tables: Spark (Iceberg's S3FileIO / ADLSFileIO and Hadoop's s3a / abfs, with
the jars they need) and DuckDB.

One URI form per store: a local path (or `file://`), `s3://<bucket>/<key>` (`s3a://` and `s3n://`
name the same objects), `abfss://<container>@<account>.dfs.core.windows.net/<path>` (`abfs://`,
and Hadoop's `wasb[s]://<container>@<account>.blob.core.windows.net/...` name the same blobs; the
short `abfs://<container>/<path>` of pyarrow is opened with the configured account, but only the
`@host` form is readable by Spark and pyiceberg's adlfs, so configs use it).

Each kind of store is one module of `common/stores/` with its own guarantees; the door offers
what every icekeeper file needs: `write_file` (whole or not at all), `create_if_absent` (atomic:
of two creators exactly one wins; the lease's only need), `read_versioned` and
`replace_if_unchanged` (a compare-and-swap on the version read), `append_lines` (the commit
report), listing and deleting. docs/operations.md ("Storage: what each file relies on") says which
file relies on which.
"""

from __future__ import annotations

import json
import os
import posixpath
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyarrow import fs as pafs

from icekeeper.common.locations import normalize_location
from icekeeper.common.stores import azure, s3
from icekeeper.common.stores.base import (
    ConditionalWritesUnsupported,
    PlainStore,
    Store,
    Versioned,
)
from icekeeper.common.stores.local import LocalStore, sync_file, sync_folder

__all__ = [
    "ConditionalWritesUnsupported",
    "StorageSettings",
    "Versioned",
    "append_lines",
    "configure_storage",
    "create_if_absent",
    "delete_file",
    "delete_folder",
    "duckdb_storage_statements",
    "file_exists",
    "list_files",
    "make_folder",
    "open_filesystem",
    "path_segment",
    "prepare_conditional_writes",
    "read_file",
    "read_lines",
    "read_versioned",
    "replace_if_unchanged",
    "spark_storage_conf",
    "spark_storage_packages",
    "split_uri",
    "storage_settings",
    "sync_written",
    "write_file",
    "write_whole",
    "write_whole_with",
]

STORAGE_PROPERTY_PREFIXES = ("s3.", "client.", "adls.", "gcs.", "hdfs.")
"""Catalog properties that configure storage (pyiceberg's FileIO properties)."""


@dataclass(frozen=True)
class StorageSettings:
    """The storage properties of one config, picklable (Spark tasks configure their own door
    with them)."""

    properties: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> StorageSettings:
        return cls(
            tuple(
                sorted(
                    (key, str(value))
                    for key, value in properties.items()
                    if key.startswith(STORAGE_PROPERTY_PREFIXES)
                )
            )
        )

    @property
    def mapping(self) -> dict[str, str]:
        return dict(self.properties)


_settings = StorageSettings()
_stores: dict[tuple[str, ...], Store] = {}
_lock = threading.Lock()


def configure_storage(settings: StorageSettings | Mapping[str, str]) -> None:
    """Configure this process's door (again: a new configuration replaces the old one)."""
    global _settings
    if not isinstance(settings, StorageSettings):
        settings = StorageSettings.from_properties(settings)
    with _lock:
        if settings != _settings:
            _settings = settings
            _stores.clear()


def storage_settings() -> StorageSettings:
    """The settings this process's door was configured with."""
    return _settings


def _store(key: tuple[str, ...]) -> Store:
    with _lock:
        store = _stores.get(key)
        if store is None:
            properties = _settings.mapping
            if key[0] == "local":
                store = LocalStore()
            elif key[0] == "s3":
                store = s3.S3Store(properties)
            elif key[0] == "azure":
                store = azure.AzureStore(properties, key[1])
            else:
                store = PlainStore(pafs.FileSystem.from_uri(key[1])[0])
            _stores[key] = store
        return store


def is_local(uri_or_path: str) -> bool:
    """Whether `uri_or_path` is on this machine's file system (a bare path or `file:`), where a
    read costs no round trip."""
    return uri_or_path.startswith("file:") or "://" not in uri_or_path


def _locate(uri_or_path: str) -> tuple[Store, str]:
    """The store holding `uri_or_path` and the path within its pyarrow filesystem."""
    if is_local(uri_or_path):
        return _store(("local",)), normalize_location(uri_or_path)
    scheme, netloc, key = split_uri(uri_or_path)
    if scheme in s3.SCHEMES:
        return _store(("s3",)), f"{netloc}{key}".rstrip("/")
    if scheme in azure.SCHEMES or scheme == "az":
        container, at, host = netloc.partition("@")
        account = host.split(".", 1)[0] if at else azure.account_name(_settings.mapping)
        if not account:
            raise ValueError(
                f"{uri_or_path}: no storage account: write "
                "abfss://<container>@<account>.dfs.core.windows.net/<path>"
            )
        return _store(("azure", account)), f"{container}{key}".rstrip("/")
    store = _store(("plain", f"{scheme}://{netloc}"))
    return store, pafs.FileSystem.from_uri(uri_or_path)[1]


def is_s3(uri_or_path: str) -> bool:
    """Whether `uri_or_path` is on S3 (or an S3-compatible server): `s3://`, `s3a://`, `s3n://`."""
    return not is_local(uri_or_path) and split_uri(uri_or_path)[0] in s3.SCHEMES


def split_uri(uri: str) -> tuple[str, str, str]:
    """(scheme, authority, path) of `uri`, the path as written: no `%XX` is decoded and `?` or
    `#` are part of it, as pyiceberg and Iceberg take a data file's path (Hive-style partition
    folders hold `%XX` escapes in their names)."""
    scheme, _, rest = uri.partition("://")
    netloc, slash, path = rest.partition("/")
    return scheme.lower(), netloc, slash + path


def open_filesystem(uri_or_path: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem holding `uri_or_path` and the path within it. A bare path is
    local, and so is Java's `file:/x` (Iceberg's Spark actions write data file paths that way)."""
    store, path = _locate(uri_or_path)
    return store.filesystem, path


def write_whole(filesystem: pafs.FileSystem, path: str, body: bytes) -> None:
    """Replace the file at `path` of `filesystem` whole, so no reader ever sees it half written:
    one PUT on object stores (S3, GCS, Azure Blob, which has no rename without a hierarchical
    namespace), a hidden temporary file renamed over it on local and mounted folders."""
    write_whole_with(filesystem, path, lambda out: out.write(body))


def write_whole_with(
    filesystem: pafs.FileSystem, path: str, write: Callable[[pa.NativeFile], object]
) -> None:
    """`write_whole` of what `write` writes into the stream it is given (a Parquet writer, say).

    On a local folder it streams into a hidden temporary file that is synced and renamed over
    `path` once `write` returned (the folder synced too: durable before visible). An object
    store's output stream cannot be abandoned (pyarrow has no abort: closing it publishes what
    was written), so there the bytes are collected in memory first and written in one PUT only
    once `write` succeeded.
    """
    if isinstance(filesystem, pafs.LocalFileSystem):
        temporary = posixpath.join(
            posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}.tmp"
        )
        try:
            with filesystem.open_output_stream(temporary) as out:
                write(out)
            sync_file(temporary)  # durable before visible: see `sync_file`
            filesystem.move(temporary, path)
            sync_folder(posixpath.dirname(path))
        except BaseException:
            try:
                filesystem.delete_file(temporary)
            except OSError:
                pass
            raise
        return
    buffer = pa.BufferOutputStream()
    write(buffer)
    body = buffer.getvalue()
    store = _store_of(filesystem)
    if store is not None:
        store.write_whole(path, body)  # its own whole write (Azure: not pyarrow's stream)
        return
    with filesystem.open_output_stream(path) as out:
        out.write(body)


def _store_of(filesystem: pafs.FileSystem) -> Store | None:
    """The configured store whose filesystem `filesystem` is (`open_filesystem` handed it out)."""
    with _lock:
        return next((store for store in _stores.values() if store.filesystem is filesystem), None)


def read_whole(filesystem: pafs.FileSystem, path: str) -> bytes:
    """The whole file at `path` of `filesystem`; FileNotFoundError when it is not there, also when
    it was deleted while being read. An object store then fails the read, not the open (a HEAD
    found the key, the GET does not), with an OSError a caller would take for an outage; its
    code is no guide (S3 says NO_SUCH_KEY, or INTERNAL_FAILURE when the error body does not fit
    the read's buffer), so a failed read asks the store whether the file is still there."""
    try:
        with filesystem.open_input_stream(path) as stream:
            return stream.read()
    except FileNotFoundError:
        raise
    except OSError as error:
        try:
            gone = filesystem.get_file_info(path).type == pafs.FileType.NotFound
        except OSError:
            gone = False  # the store does not answer: an outage after all
        if gone:
            raise FileNotFoundError(f"{path}: deleted while being read ({error})") from error
        raise


def sync_written(uris: Iterable[str]) -> None:
    """Make files on a local or mounted folder durable, with the folder entries that name them,
    before anything naming them is published (a moniker names its data files). A file written
    and closed without a sync can come back empty after a power cut while the moniker, synced by
    `write_whole`, survives: it is then quarantined as invalid, and its writer has moved past
    its records. Every folder up to the root is synced too: a batch's folders are new. Object
    stores need nothing (a PUT is durable once answered)."""
    folders: set[str] = set()
    for uri in uris:
        if not is_local(uri):
            continue  # not even located: opening hdfs://, say, would connect
        _, path = _locate(uri)
        sync_file(path)
        folder = posixpath.dirname(path)
        while folder not in folders:
            folders.add(folder)
            folder = posixpath.dirname(folder)
    for folder in sorted(folders, key=len, reverse=True):
        sync_folder(folder)


def make_folder(filesystem: pafs.FileSystem, path: str) -> None:
    """Make folder `path` where folders exist (local, mounted); object stores have none (a
    "folder" is a key prefix: making one would only add a marker object per write)."""
    if isinstance(filesystem, pafs.LocalFileSystem):
        filesystem.create_dir(path, recursive=True)


def write_file(uri: str, body: bytes, durable: bool = True) -> None:
    """`write_whole` by URI, its folder made first where folders exist.

    `durable=False` skips the syncs on a local or mounted folder (the file is still renamed into
    place whole), for a file that only matters while the process writing it lives, as a writer's
    claim on its batch folder: a power cut that loses it also ends the batch it protects. A sync
    is a journal commit, which waits for every other process's pending writes on a busy disk."""
    store, path = _locate(uri)
    if store.kind == "local":
        os.makedirs(posixpath.dirname(path), exist_ok=True)
    store.write_whole(path, body, durable=durable)


def read_file(uri: str) -> bytes:
    """The whole file; FileNotFoundError when there is none."""
    filesystem, path = open_filesystem(uri)
    return read_whole(filesystem, path)


def create_if_absent(uri: str, body: bytes) -> bool:
    """Write `body` at `uri` unless a file is there: True if this call created it. Atomic on
    every store that has it (local, S3, Azure): of two concurrent creators exactly one wins."""
    store, path = _locate(uri)
    if store.kind == "local":
        os.makedirs(posixpath.dirname(path), exist_ok=True)
    return store.create_if_absent(path, body)


def prepare_conditional_writes(uri: str) -> None:
    """Make the clients `create_if_absent` and `replace_if_unchanged` need for `uri`'s store now
    (botocore's takes up to a second to make), before a caller starts timing them."""
    store, _ = _locate(uri)
    store.warm_up()


def read_versioned(uri: str) -> Versioned | None:
    """The file's bytes and version (for `replace_if_unchanged`), None when there is none."""
    store, path = _locate(uri)
    return store.read_versioned(path)


def replace_if_unchanged(uri: str, body: bytes, version: str) -> bool:
    """Replace the file at `uri` only while it is at `version` (`read_versioned`): False when
    someone changed or deleted it since."""
    store, path = _locate(uri)
    return store.replace_if_unchanged(path, body, version)


def file_exists(uri: str) -> bool:
    store, path = _locate(uri)
    return store.exists(path)


def delete_file(uri: str) -> None:
    """Delete a file if it is there."""
    filesystem, path = open_filesystem(uri)
    try:
        filesystem.delete_file(path)
    except FileNotFoundError:
        pass


def delete_files(filesystem: pafs.FileSystem, paths: Sequence[str]) -> dict[str, OSError]:
    """Delete the files at `paths` of `filesystem` as its store does best (S3: a thousand a
    request); returns why each path that could not be deleted was not (every path is tried)."""
    store = _store_of(filesystem) or PlainStore(filesystem)
    return store.delete_files(paths)


def delete_folder(uri_or_path: str) -> None:
    """Delete a folder and everything in it, if it is there."""
    filesystem, path = open_filesystem(uri_or_path)
    try:
        filesystem.delete_dir(path)
    except FileNotFoundError:
        pass


def list_files(folder_uri: str, recursive: bool = False) -> list[pafs.FileInfo]:
    """The files (not folders) under `folder_uri`, none when it is not there. Paths are the
    filesystem's (`open_filesystem`)."""
    filesystem, folder = open_filesystem(folder_uri)
    selector = pafs.FileSelector(folder, recursive=recursive, allow_not_found=True)
    try:
        found = filesystem.get_file_info(selector)
    except FileNotFoundError:
        # Arrow's local listing fails on a missing folder, then asks whether it exists to honour
        # `allow_not_found`: a folder another thread created in between (racing standbys' first
        # lease) raises instead. Listed again, it is there (or gone: then nothing is in it).
        try:
            found = filesystem.get_file_info(selector)
        except FileNotFoundError:
            return []
    return [info for info in found if info.type == pafs.FileType.File]


def append_lines(uri: str, lines: Iterable[dict]) -> str:
    """Append JSON lines to the report at `uri`, all or none; returns the file written.

    A local file is appended to (a write cut short, say by a full disk, is truncated away, so
    the file never holds half a line). Object stores cannot append: there `uri` names a folder
    and each call adds one object to it, `<ms>-<random>.jsonl`, so listing it in name order reads
    the lines in the order they were written.
    """
    payload = "".join(json.dumps(line) + "\n" for line in lines).encode("utf-8")
    store, path = _locate(uri)
    if store.kind != "local":
        part = f"{uri.rstrip('/')}/{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:8]}.jsonl"
        write_file(part, payload)
        return part
    os.makedirs(posixpath.dirname(path), exist_ok=True)
    remaining = memoryview(payload)
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(descriptor).st_size
        try:
            while remaining:
                remaining = remaining[os.write(descriptor, remaining) :]
        except OSError:
            try:
                os.ftruncate(descriptor, size)
            except OSError:
                pass  # not a regular file (a device, a pipe): nothing to take back
            raise
    finally:
        os.close(descriptor)
    return path


def read_lines(uri: str) -> list[str]:
    """The lines `append_lines` wrote at `uri`, in the order written: the local file's, or
    each part's of the folder on an object store; none when nothing was written yet."""
    store, path = _locate(uri)
    if store.kind == "local":
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read().splitlines()
        except FileNotFoundError:
            return []
    lines: list[str] = []
    for info in sorted(list_files(uri), key=lambda info: info.base_name):
        if info.base_name.endswith(".jsonl"):
            lines += read_whole(store.filesystem, info.path).decode("utf-8").splitlines()
    return lines


def path_segment(name: str) -> str:
    """A folder or file name made from a table, writer
    or group name: no separators, no leading dot."""
    cleaned = "".join(char if char.isalnum() or char in "._-" else "_" for char in name)
    return cleaned.lstrip(".") or "_"


def _azure_accounts(locations: Iterable[str], properties: Mapping[str, str]) -> list[str]:
    accounts = {azure.account_name(properties)} - {None}
    for location in locations:
        parsed = urllib.parse.urlparse(location)
        if parsed.scheme.lower() in azure.SCHEMES and "@" in parsed.netloc:
            accounts.add(parsed.netloc.split("@", 1)[1].split(".", 1)[0])
    return sorted(a for a in accounts if a)


def _schemes(locations: Iterable[str]) -> set[str]:
    return {urllib.parse.urlparse(location).scheme.lower() for location in locations}


def spark_storage_conf(
    settings: StorageSettings, locations: Iterable[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """(catalog properties, Spark settings) for the stores `locations` are on: the FileIO of an
    Iceberg catalog in Spark (`io-impl` S3FileIO or ADLSFileIO and its properties, to be given
    under `spark.sql.catalog.<name>.`), and `spark.hadoop.*` settings for the files Spark writes
    and lists itself. Nothing for local folders."""
    properties = settings.mapping
    locations = list(locations)
    schemes = _schemes(locations)
    catalog: dict[str, str] = {}
    hadoop: dict[str, str] = {}
    if schemes & set(s3.SCHEMES) or any(key.startswith("s3.") for key in properties):
        catalog.update(s3.iceberg_java_properties(properties))
        hadoop.update(s3.hadoop_conf(properties))
    if schemes & set(azure.SCHEMES) or any(key.startswith("adls.") for key in properties):
        accounts = _azure_accounts(locations, properties)
        if not catalog:
            catalog.update(azure.iceberg_java_properties(properties, None))
        for account in accounts:
            mapped = azure.iceberg_java_properties(properties, account)
            if catalog.get("io-impl") != azure.ADLS_FILE_IO:
                mapped.pop("io-impl")  # S3 and Azure at once: S3FileIO stays the catalog's
            catalog.update(mapped)
            hadoop.update(azure.hadoop_conf(properties, account))
    return catalog, hadoop


def spark_storage_packages(
    settings: StorageSettings, locations: Iterable[str], iceberg_version: str
) -> tuple[str, ...]:
    """Maven coordinates Spark needs for the stores `locations` are on (and those the
    properties configure)."""
    properties = settings.mapping
    schemes = _schemes(locations)
    packages: tuple[str, ...] = ()
    if schemes & set(s3.SCHEMES) or any(key.startswith("s3.") for key in properties):
        packages += s3.spark_packages(iceberg_version)
    if schemes & set(azure.SCHEMES) or any(key.startswith("adls.") for key in properties):
        packages += (azure.ICEBERG_AZURE_BUNDLE,)
    return packages


def duckdb_storage_statements(settings: StorageSettings | None = None) -> list[str]:
    """Statements that let a DuckDB connection (httpfs and azure loaded) read the configured
    object stores: a secret for S3 when `s3.*` properties are set, one for Azure Blob when
    `adls.*` are."""
    properties = (settings or _settings).mapping
    statements = []
    if any(key.startswith("s3.") for key in properties):
        statements += s3.duckdb_statements(properties)
    if any(key.startswith("adls.") for key in properties):
        statements += azure.duckdb_statements(properties)
    return statements

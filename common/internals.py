"""Every private API of pyiceberg, pyarrow and pyspark that icekeeper uses, behind named functions.

Each shortcut here saves time the module using it measured (the reasons are in
`bookkeeper/table_metadata.py`, `bookkeeper/manifests.py`, `bookkeeper/commit_path.py`,
`bookkeeper/datafiles.py`), or reaches a Java API that has no Python binding (`reaper/`,
`common/spark.py`). No other module names a private attribute of these libraries; each function
here is checked against the public behaviour it shortcuts in tests/common/test_internals.py.

A library upgrade breaks here, naming this module: the versions below are the ones the shortcuts
were verified with. pyiceberg's shortcuts have no public fallback, so another pyiceberg is an
`ImportError` at import (every role uses them); pyarrow's footer parser has one
(`pq.read_metadata`, about twice as slow), so another pyarrow only warns and switches the parser
off. pyspark is checked where its shortcuts are used, at their first call, not at import: the
bookkeeper's install has no pyspark at all (`pip install icekeeper` without the `spark` extra) and
uses none of them.

Subclasses of pyiceberg's classes (`UncopiedTransaction` here; the snapshot producer and manifest
writers of `bookkeeper/manifests.py`, whose bytes tests/bookkeeper/test_manifests.py compares with
pyiceberg's) override protected hooks of these very versions: they take their base classes from
here, so the same check covers them.
"""

from __future__ import annotations

import functools
import types
import warnings
from collections.abc import Callable, Iterator, MutableMapping
from importlib import metadata as package_metadata
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pyiceberg
from pyarrow import _parquet as pyarrow_parquet_internal
from pydantic import BaseModel
from pyiceberg.avro.file import AvroFile
from pyiceberg.catalog import Catalog, MetastoreCatalog
from pyiceberg.catalog.rest import _RETRY_ARGS as REST_RETRY_ARGS
from pyiceberg.catalog.rest import RestCatalog, TableResponse
from pyiceberg.io import FileIO, InputFile
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_ENTRY_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    _inherit_from_manifest,
)
from pyiceberg.table import CommitTableResponse, Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    TableRequirement,
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.table.update.snapshot import _MergeAppendFiles, _SnapshotProducer
from pyiceberg.typedef import Record
from tenacity import retry

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

VERIFIED_PYICEBERG = "0.12."
VERIFIED_PYSPARK = "4.1."
VERIFIED_PYARROW_MAJORS = (26,)
"""Library versions whose private APIs the functions below were checked against (prefixes for
pyiceberg and pyspark, major versions for pyarrow)."""

_UPDATE_HINT = "update common/internals.py (run tests/common/test_internals.py) before upgrading it"

if not pyiceberg.__version__.startswith(VERIFIED_PYICEBERG):
    raise ImportError(
        f"icekeeper relies on private APIs of pyiceberg {VERIFIED_PYICEBERG}x, found "
        f"{pyiceberg.__version__}: {_UPDATE_HINT}"
    )


@functools.cache
def require_verified_pyspark() -> None:
    """Stop unless the installed pyspark is the one the shortcuts below were verified with; called
    by each of them (once a process), so that modules importing this one load without pyspark.

    Raises:
        ImportError: another pyspark, naming this module (`ModuleNotFoundError` for none, naming
            the extra to install).
    """
    try:
        found = package_metadata.version("pyspark")  # without importing pyspark (~1 s)
    except package_metadata.PackageNotFoundError:
        raise ModuleNotFoundError(
            "pyspark is not installed: the writer and the reaper need the spark extra "
            "(pip install 'icekeeper[spark]')",
            name="pyspark",
        ) from None
    if not found.startswith(VERIFIED_PYSPARK):
        raise ImportError(
            f"icekeeper relies on private APIs of pyspark {VERIFIED_PYSPARK}x, found "
            f"{found}: {_UPDATE_HINT}"
        )


# -- pyiceberg: table metadata ---------------------------------------------------------------------


def apply_table_updates(
    base: TableMetadata, updates: tuple[TableUpdate, ...]
) -> tuple[TableMetadata, bool]:
    """`updates` applied to `base`, and whether they changed anything: the loop of pyiceberg's
    `update_table_metadata`, without its final deep copy, metadata log entry, last-updated time
    and compatibility checks (the caller adds what it needs). Safe without the copy because
    metadata models are frozen and pyiceberg's update functions build new lists and dicts
    instead of changing the base's: the result may share untouched parts with `base`."""
    context = _TableMetadataUpdateContext()
    metadata = base
    for update in updates:
        metadata = _apply_table_update(update, metadata, context)
    return metadata, context.has_changes()


def append_metadata_log(
    metadata: TableMetadata, previous_location: str, previous_last_updated_ms: int
) -> TableMetadata:
    """`metadata` with the previous metadata file in its metadata log (trimmed to the table's
    `write.metadata.previous-versions-max`), as `update_table_metadata` adds it."""
    return _update_table_metadata_log(metadata, previous_location, previous_last_updated_ms)


class UncopiedTransaction(Transaction):
    """pyiceberg's `Transaction`, with `table_metadata` built once per staged state and not copied.

    pyiceberg 0.12 rebuilds the metadata and deep-copies all of it on every read of
    `Transaction.table_metadata`, and one commit reads it some 17 times (snapshot producer,
    expiry, manifest writers): 1-3 ms each with 20 snapshots kept, about half of a
    single-moniker commit (measured). Here updates are applied once per staged state, without
    the deep copy (see `apply_table_updates`), and this metadata is only read: the catalog
    applies the updates again, with its own copy and checks, when the transaction commits.
    The last-updated time is the base's (the catalog sets it when it commits).
    """

    _metadata_cache: tuple[TableMetadata, tuple[TableUpdate, ...], TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        cached = self._metadata_cache
        if cached is None or cached[0] is not base or cached[1] is not updates:
            metadata, _ = apply_table_updates(base, updates)
            metadata.spec().check_compatible(metadata.schema())
            metadata.sort_order().check_compatible(metadata.schema())
            cached = self._metadata_cache = (base, updates, metadata)
        return cached[2]


# -- pyiceberg: the Hive catalog's metastore client ------------------------------------------------


def wrap_hive_clients(catalog: Catalog, wrap: Callable[[Any], Any]) -> bool:
    """Make this Hive catalog object pass each metastore client it opens (a Thrift
    `ThriftHiveMetastore.Client`, one per `with catalog._client`) through `wrap`; False, and
    nothing changed, for other kinds of catalog. pyiceberg 0.12 opens a client per call and has
    no hook for it."""
    from pyiceberg.catalog.hive import HiveCatalog  # Thrift: only where a Hive catalog is used

    if not isinstance(catalog, HiveCatalog):
        return False
    connection = catalog._client  # noqa: SLF001 - the catalog's one `_HiveClient`
    build = connection._client  # noqa: SLF001 - builds the Thrift client on its transport
    # This catalog object only: other catalogs keep pyiceberg's.
    connection._client = lambda: wrap(build())  # noqa: SLF001
    return True


def set_hive_socket_timeout(catalog: Catalog, timeout_s: float) -> bool:
    """Give every metastore connection of this Hive catalog object a timeout of `timeout_s` (to
    connect, and for each read and write), and close the connection at its first error; False,
    and nothing changed, for other kinds of catalog.

    pyiceberg 0.12 opens its Thrift sockets with no timeout (`_HiveClient._init_thrift_transport`)
    and has no property for one: a metastore, or a proxy in front of it, that took a call and
    never answers holds the caller forever (a bookkeeper's cycle, while its lease lapses). With
    one, the call fails with a `TTransportException` (`TIMED_OUT`), a commit's of unknown outcome
    that the commit path settles by reading the table back. The connection is closed then and
    never used again: Thrift's Python client does not check that an answer is the one to its call
    (the generated `recv_*` ignore the method name and sequence id), so the late answer of the
    timed-out call would be read as the next call's (an `alter_table`'s empty result as an
    `unlock` that succeeded), every later answer one call behind. In pyiceberg's commit that next
    call is the `unlock` of its `finally`, which on a metastore that stopped would wait a whole
    timeout again. Closed, the `unlock` fails at once and the lock is left to
    `bookkeeper/hive_locks.py`, as after a cut connection."""
    from pyiceberg.catalog.hive import HiveCatalog, _HiveClient  # Thrift: only for Hive catalogs
    from thrift.transport import TSocket
    from thrift.transport.TTransport import TTransportException

    if not isinstance(catalog, HiveCatalog):
        return False

    class ClosingSocket(TSocket.TSocket):
        """pyiceberg's socket, with a timeout, closed at its first failed read or write."""

        def __init__(self, host: str, port: int) -> None:
            super().__init__(host, port)
            self.setTimeout(timeout_s * 1000)

        def read(self, sz: int) -> bytes:
            try:
                return super().read(sz)
            except TTransportException:
                self.close()
                raise

        def write(self, buff: bytes) -> None:
            try:
                super().write(buff)
            except TTransportException:
                self.close()
                raise

    build = _with_globals(
        _HiveClient._init_thrift_transport,  # noqa: SLF001 - no property for a socket timeout
        TSocket=types.SimpleNamespace(TSocket=ClosingSocket),
    )
    connection = catalog._client  # noqa: SLF001 - the catalog's one `_HiveClient`
    # This catalog object only: other catalogs keep pyiceberg's. The transport built by its
    # constructor is not open yet (each `with` opens one): replaced by one with the timeout.
    connection._init_thrift_transport = types.MethodType(build, connection)  # noqa: SLF001
    connection._transport = connection._init_thrift_transport()  # noqa: SLF001
    return True


def hive_metastore_client(catalog: Catalog) -> Any:
    """A context manager that opens a new connection of this Hive catalog to its metastore and
    yields its Thrift client (what pyiceberg's own calls use)."""
    return catalog._client  # noqa: SLF001 - pyiceberg 0.12 keeps its connection private


# -- pyiceberg: transactions -----------------------------------------------------------------------


def transaction_table(transaction: Transaction) -> Table:
    """The table a transaction was opened on (pyiceberg keeps it private)."""
    return transaction._table  # noqa: SLF001 - no public accessor in pyiceberg 0.12


def stage_updates(
    transaction: Transaction,
    updates: tuple[TableUpdate, ...],
    requirements: tuple[TableRequirement, ...] = (),
) -> None:
    """Add updates and requirements to a transaction, as its public builders do when they commit:
    the bookkeeper adds a schema with field ids of its own choosing (see `bookkeeper/evolution.py`),
    which `update_schema()` would renumber."""
    transaction._apply(updates, requirements)  # noqa: SLF001 - explicit field ids: no public API


def commit_once(
    transaction: Transaction, extra_requirements: tuple[TableRequirement, ...] = ()
) -> Table:
    """Commit a transaction's updates in a single compare-and-swap (its requirements, plus
    `extra_requirements`); a conflict raises `CommitFailedException`. Returns the table, refreshed.

    `Transaction.commit_transaction` retries a conflict itself (`commit.retry.num-retries`) by
    rebuilding the snapshot on the refreshed table, without giving the caller a chance to
    re-check what it commits: the bookkeeper must re-check (exactly once), so it commits once
    and decides itself.

    The transaction is done with either way: its snapshot producers are let go
    (`release_snapshot_producers`)."""
    table = transaction_table(transaction)
    try:
        table._do_commit(  # noqa: SLF001 - a commit without pyiceberg's retries has no public API
            updates=transaction._updates,  # noqa: SLF001 - read by the public commit too
            requirements=transaction._requirements + extra_requirements,  # noqa: SLF001 - as above
        )
    finally:
        release_snapshot_producers(transaction)
    return table


def release_snapshot_producers(transaction: Transaction) -> None:
    """Let go of the snapshot producers a transaction lists, as pyiceberg's own commit does once
    it is through. Each producer refers back to its transaction (pyiceberg registers it as it
    is made), and that reference cycle kept the table and both its metadata versions alive
    until Python's cyclic collector made a full pass, which comes ever more rarely as the heap
    grows: at an hour of history, many metadata versions' snapshot lists and every snapshot
    expired since were held at once (issue 26's soak). For a transaction that is done: committed,
    failed, or never to be sent."""
    transaction._snapshot_producers = []  # noqa: SLF001 - as `commit_transaction` clears it


# -- pyiceberg: records, snapshot producers --------------------------------------------------------


def record_fields(record: Record) -> list[Any]:
    """A pyiceberg record's field values, in schema order: the list the record holds, not a copy
    (`[record[i] for i in range(len(record))]` costs a call per field, on every manifest entry)."""
    return record._data  # noqa: SLF001 - positional, as pyiceberg's own Avro writer reads them


MergeAppendFiles = _MergeAppendFiles
"""pyiceberg's merge-append snapshot producer, the base of `bookkeeper.manifests`' producers."""
SnapshotProducer = _SnapshotProducer
"""pyiceberg's snapshot producer base class (what `Transaction.update_snapshot()` builds)."""


def manifest_entries(
    manifest: ManifestFile,
    io: FileIO,
    discard_deleted: bool = True,
    input_file: InputFile | None = None,
) -> Iterator[ManifestEntry]:
    """`ManifestFile.fetch_manifest_entry`, one entry at a time: pyiceberg 0.12 builds the list of
    every entry of the manifest first, so merging a manifest of N data files held all N entries
    (with their column statistics) in memory at once. Read as a stream, a merge holds one Avro
    block's worth (issue 26: the merge's peak grew with the live data files, and each peak left
    the small-object allocator with arenas it never gave back). `input_file`: the manifest's
    bytes fetched already (`bookkeeper.manifest_reads`), else it is opened through `io`."""
    if input_file is None:
        input_file = io.new_input(manifest.manifest_path)
    with AvroFile[ManifestEntry](
        input_file,
        MANIFEST_ENTRY_SCHEMAS[DEFAULT_READ_VERSION],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    ) as reader:
        for entry in reader:
            if not discard_deleted or entry.status != ManifestEntryStatus.DELETED:
                yield _inherit_from_manifest(entry, manifest)


def snapshot_commit_writing_lists_with(
    write_manifest_list: Callable[..., Any],
) -> Callable[..., Any]:
    """pyiceberg's own `_SnapshotProducer._commit` (the snapshot, its summary and its updates),
    running `write_manifest_list` where it calls `pyiceberg.manifest.write_manifest_list`: to be
    set as `_commit` of a producer subclass, so the snapshot stays pyiceberg's."""
    return _with_globals(
        _SnapshotProducer._commit,  # noqa: SLF001 - the snapshot commit has no public hook
        write_manifest_list=write_manifest_list,
    )


# -- pyiceberg: catalogs ---------------------------------------------------------------------------


def replace_metadata_update(
    catalog: MetastoreCatalog, update_table_metadata: Callable[..., TableMetadata]
) -> None:
    """Make this catalog object stage commits with `update_table_metadata` (same signature as
    `pyiceberg.table.update.update_table_metadata`) in place of pyiceberg's; other catalog
    objects are not changed."""
    stage = _with_globals(
        MetastoreCatalog._update_and_stage_table,  # noqa: SLF001 - no public hook for the update
        update_table_metadata=update_table_metadata,
    )
    # This catalog object only: the class and other catalogs keep pyiceberg's.
    staging = types.MethodType(stage, catalog)
    catalog._update_and_stage_table = staging  # type: ignore[method-assign]  # noqa: SLF001


def replace_metadata_writer(
    catalog: MetastoreCatalog, write: Callable[[TableMetadata, FileIO, str], None]
) -> None:
    """Make this catalog object write new metadata files with `write(metadata, io, metadata_path)`
    (called with these keywords; pyiceberg: `ToOutputFile.table_metadata`); other catalog
    objects are not changed."""
    # This catalog object only: the class and other catalogs keep pyiceberg's.
    catalog._write_metadata = write  # type: ignore[method-assign]  # noqa: SLF001


def replace_sql_metadata_reader(
    catalog: Catalog, read: Callable[[InputFile], TableMetadata]
) -> bool:
    """Make this SQL catalog object read tables' metadata files with `read(input_file)` (pyiceberg:
    `FromInputFile.table_metadata`); False, and nothing changed, for other kinds of catalog."""
    from pyiceberg.catalog.sql import SqlCatalog  # SQLAlchemy: only where a SQL catalog is used

    if not isinstance(catalog, SqlCatalog):
        return False
    reader = type("ReplacedFromInputFile", (), {"table_metadata": staticmethod(read)})
    convert = _with_globals(
        SqlCatalog._convert_orm_to_iceberg,  # noqa: SLF001 - no public hook for the read
        FromInputFile=reader,
    )
    # This catalog object only: the class and other catalogs keep pyiceberg's.
    reading = types.MethodType(convert, catalog)
    catalog._convert_orm_to_iceberg = reading  # type: ignore[method-assign]  # noqa: SLF001
    return True


def set_rest_request_timeout(catalog: Catalog, timeout_s: float) -> bool:
    """Give every HTTP request of this REST catalog object a timeout of `timeout_s` (to connect,
    and between bytes of the answer); False, and nothing changed, for other kinds of catalog.

    pyiceberg 0.12's REST client sends its requests with no timeout at all: a server, or a proxy
    in front of it, that takes a commit and never answers holds the caller forever. With one, the
    request fails with a `requests` timeout (an `OSError`), which a caller can settle."""
    if not isinstance(catalog, RestCatalog):
        return False
    session = catalog._session  # noqa: SLF001 - the requests session has no public accessor
    send = session.request

    def request_with_timeout(method: str, url: str, **kwargs: Any) -> Any:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = timeout_s
        return send(method, url, **kwargs)

    session.request = request_with_timeout  # type: ignore[method-assign]
    return True


def add_rest_response_hook(catalog: Catalog, hook: Callable[[Any], None]) -> bool:
    """Call `hook(response)` with every HTTP answer this REST catalog object receives (a
    `requests.Response`: method, URL, `elapsed` from sending to the answer's headers); False, and
    nothing changed, for other kinds of catalog. Benchmarks use it to tell the server's time from
    the client's (`bench commit-history`)."""
    if not isinstance(catalog, RestCatalog):
        return False
    session = catalog._session  # noqa: SLF001 - the requests session has no public accessor

    def observe(response: Any, *args: Any, **kwargs: Any) -> Any:
        hook(response)
        return response

    session.hooks["response"].append(observe)
    return True


def rest_session_headers(catalog: Catalog) -> MutableMapping[str, str] | None:
    """The headers every request of this REST catalog object sends (its `requests` session's),
    to change between requests; None for other kinds of catalog."""
    if not isinstance(catalog, RestCatalog):
        return None
    return catalog._session.headers  # noqa: SLF001 - the requests session has no public accessor


def _rest_call_parsing(name: str, model: type[BaseModel]) -> Callable[..., Any]:
    """pyiceberg's own `RestCatalog.<name>` without its retry decorator, checked to parse its
    answer with `<model>.model_validate_json` and nothing else (what `replace_rest_answer_parser`
    replaces)."""
    function = getattr(getattr(RestCatalog, name), "__wrapped__", None)
    names = getattr(getattr(function, "__code__", None), "co_names", ())
    if function is None or model.__name__ not in names or "model_validate_json" not in names:
        raise ImportError(
            f"pyiceberg's RestCatalog.{name} no longer parses its answer with "
            f"{model.__name__}.model_validate_json under one retry decorator: {_UPDATE_HINT}"
        )
    return function


_REST_CALLS_PARSING = {
    "commit_table": (_rest_call_parsing("commit_table", CommitTableResponse), CommitTableResponse),
    "load_table": (_rest_call_parsing("load_table", TableResponse), TableResponse),
}
"""The REST catalog calls whose answers hold a table's metadata, with the model each parses."""


def replace_rest_answer_parser(
    catalog: Catalog, parse: Callable[[type[BaseModel], str], BaseModel]
) -> bool:
    """Make this REST catalog object parse the answers of its `commit_table` and `load_table`
    with `parse(model, text)` (pyiceberg: `model.model_validate_json(text)`, the model being
    `CommitTableResponse` or `TableResponse`); False, and nothing changed, for other kinds of
    catalog. Everything else in these calls is pyiceberg's own code (endpoint check, URL, token
    header, error mapping), under pyiceberg's own retry decorator (a token refresh, once)."""
    if not isinstance(catalog, RestCatalog):
        return False
    for name, (function, model) in _REST_CALLS_PARSING.items():
        parser = type(
            f"Parsing{model.__name__}",
            (),
            {"model_validate_json": staticmethod(functools.partial(parse, model))},
        )
        call = retry(**REST_RETRY_ARGS)(_with_globals(function, **{model.__name__: parser}))
        # This catalog object only: the class and other catalogs keep pyiceberg's.
        setattr(catalog, name, types.MethodType(call, catalog))
    return True


def s3_filesystem_with_delayed_open(
    filesystem: pafs.S3FileSystem, delayed: bool = True
) -> pafs.S3FileSystem:
    """The same S3 filesystem with `allow_delayed_open` set to `delayed` (on: small files in one
    PUT, not a multipart upload of three requests; pyarrow 21+). Its options are read as
    pyarrow's pickling reads them (`__reduce__`: every option but a retry strategy, which it
    does not keep)."""
    rebuild, (options,) = filesystem.__reduce__()
    return rebuild({**options, "allow_delayed_open": delayed})


def leave_metadata_cleanup_to_server(catalog: Catalog) -> bool:
    """Make this REST catalog object leave the removal of old metadata files to the server; False,
    and nothing changed, for other kinds of catalog.

    After every commit pyiceberg 0.12 deletes, from the client, the metadata files that fell out
    of the table's metadata log (`write.metadata.delete-after-commit.enabled`). Behind a REST
    catalog the server wrote those files and already removed them as it committed (Iceberg's
    table operations do): the client's deletes are requests for files that are gone, each
    logged as a failure, on every commit."""
    if not isinstance(catalog, RestCatalog):
        return False

    def keep(io: FileIO, base: TableMetadata, metadata: TableMetadata) -> None:
        return None

    # This catalog object only (`Table._do_commit` calls it through the table's catalog).
    catalog._delete_old_metadata = keep  # type: ignore[method-assign]  # noqa: SLF001
    return True


def replace_hive_metadata_reader(
    catalog: Catalog, read: Callable[[InputFile], TableMetadata]
) -> bool:
    """Make this Hive catalog object read tables' metadata files with `read(input_file)`
    (pyiceberg: `FromInputFile.table_metadata`), in `load_table` and in its commit's read of the
    current table alike; False, and nothing changed, for other kinds of catalog."""
    from pyiceberg.catalog.hive import HiveCatalog  # Thrift: only where a Hive catalog is used

    if not isinstance(catalog, HiveCatalog):
        return False
    reader = type("ReplacedFromInputFile", (), {"table_metadata": staticmethod(read)})
    convert = _with_globals(
        HiveCatalog._convert_hive_into_iceberg,  # noqa: SLF001 - no public hook for the read
        FromInputFile=reader,
    )
    # This catalog object only: the class and other catalogs keep pyiceberg's.
    reading = types.MethodType(convert, catalog)
    catalog._convert_hive_into_iceberg = reading  # type: ignore[method-assign]  # noqa: SLF001
    return True


def _with_globals(function: Callable[..., Any], **replacements: Any) -> Callable[..., Any]:
    """A copy of `function` (same code) that sees `replacements` in place of its module's globals:
    pyiceberg's code, run with one of the functions it calls replaced, for one caller only."""
    return types.FunctionType(
        function.__code__,
        {**function.__globals__, **replacements},
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )


# -- pyarrow: Parquet footers ----------------------------------------------------------------------


def _verified_footer_parser() -> Callable[[pa.Buffer], pq.FileMetaData] | None:
    parser = getattr(pyarrow_parquet_internal, "_reconstruct_filemetadata", None)
    major = int(pa.__version__.split(".", 1)[0])
    if parser is not None and major in VERIFIED_PYARROW_MAJORS:
        return parser
    warnings.warn(
        f"pyarrow {pa.__version__} is not one common/internals.py verified its footer parser with "
        f"(majors {VERIFIED_PYARROW_MAJORS}): footers are parsed by pq.read_metadata, about twice "
        f"as slow; {_UPDATE_HINT}",
        stacklevel=2,
    )
    return None


_FOOTER_PARSER = _verified_footer_parser()
FOOTER_PARSER_ENABLED = _FOOTER_PARSER is not None
"""Whether `parse_footer_bytes` may be called (else footers go through `pq.read_metadata`)."""


def parse_footer_bytes(footer: pa.Buffer) -> pq.FileMetaData:
    """A Parquet footer's metadata from its bytes (the thrift between the data and the length),
    nothing else built: pyarrow's unpickling function for `FileMetaData`, about half the time of
    `pq.read_metadata`. Its C++ lets a thrift error escape as `std::terminate`, so a damaged footer
    aborts the process: only processes that may die (footer workers) call it."""
    if _FOOTER_PARSER is None:
        raise RuntimeError(
            f"pyarrow's footer parser is off (FOOTER_PARSER_ENABLED): {_UPDATE_HINT}"
        )
    return _FOOTER_PARSER(footer)


# -- pyspark: the JVM behind a session -------------------------------------------------------------


def spark_jvm(session: SparkSession) -> Any:
    """The py4j view of the driver JVM's classes (Iceberg's Java actions, log4j levels)."""
    require_verified_pyspark()
    return session.sparkContext._jvm  # noqa: SLF001 - Java APIs without a Python binding


def java_spark_session(session: SparkSession) -> Any:
    """The Java `SparkSession` behind a Python one, for Java APIs that take it."""
    require_verified_pyspark()
    return session._jsparkSession  # noqa: SLF001 - Java APIs without a Python binding


def hadoop_configuration(session: SparkSession) -> Any:
    """The session's Hadoop `Configuration`, as Spark's own file writes resolve filesystems."""
    require_verified_pyspark()
    return session.sparkContext._jsc.hadoopConfiguration()  # noqa: SLF001 - no Python binding


def java_dataset(frame: DataFrame) -> Any:
    """The Java `Dataset<Row>` behind a Python DataFrame, for Java APIs that take one."""
    require_verified_pyspark()
    return frame._jdf  # noqa: SLF001 - Java APIs without a Python binding


def py4j_gateway(session: SparkSession) -> Any:
    """The session's py4j gateway, for Java calling back into Python (a `Consumer` of files)."""
    require_verified_pyspark()
    return session.sparkContext._gateway  # noqa: SLF001 - callbacks need the gateway


def java_exception_of(error: BaseException) -> Any | None:
    """The Java exception behind a Python error from Spark, or None: py4j's `Py4JJavaError` holds
    it as `java_exception`; the errors PySpark converts (`AnalysisException`...) keep it private."""
    require_verified_pyspark()
    return getattr(error, "java_exception", None) or getattr(error, "_origin", None)

"""Each shortcut of common/internals.py (private pyiceberg, pyarrow and pyspark API) against the
public behaviour it stands for, and the version check that makes an upgrade fail there, loudly."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import write_manifest_list
from pyiceberg.schema import Schema
from pyiceberg.serializers import FromInputFile, ToOutputFile
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AssertCurrentSchemaId,
    SetCurrentSchemaUpdate,
    update_table_metadata,
)
from pyiceberg.types import LongType, NestedField, StringType
from thrift.transport.TTransport import TTransportException

from icekeeper.common.internals import (
    MergeAppendFiles,
    UncopiedTransaction,
    add_rest_response_hook,
    append_metadata_log,
    apply_table_updates,
    commit_once,
    hadoop_configuration,
    hive_metastore_client,
    java_dataset,
    java_exception_of,
    java_spark_session,
    manifest_entries,
    parse_footer_bytes,
    py4j_gateway,
    record_fields,
    replace_metadata_update,
    replace_metadata_writer,
    replace_rest_answer_parser,
    replace_sql_metadata_reader,
    set_hive_socket_timeout,
    snapshot_commit_writing_lists_with,
    spark_jvm,
    stage_updates,
    transaction_table,
)
from tests.support.waiting import returns_within

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "name", StringType(), required=False),
)
ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", "c"]})


def sql_catalog(tmp_path: Path) -> SqlCatalog:
    return SqlCatalog(
        "internals",
        uri=f"sqlite:///{tmp_path}/catalog.db",
        warehouse=f"file://{tmp_path}/warehouse",
    )


def table_with_rows(catalog: SqlCatalog, name: str = "t") -> Table:
    catalog.create_namespace_if_not_exists("ns")
    table = catalog.create_table(f"ns.{name}", schema=SCHEMA)
    table.append(ROWS)
    return table


def staged_changes(table: Table) -> tuple:
    """The updates of a transaction that sets a property, adds a column and appends rows."""
    transaction = table.transaction()
    transaction.set_properties(owner="tests")
    with transaction.update_schema() as update:
        update.add_column("extra", LongType())
    transaction.append(ROWS.append_column("extra", pa.array([None] * 3, pa.int64())))
    return transaction._updates


def comparable(metadata) -> dict:
    """Metadata as a dict, without the time of the update (set from the clock on each path)."""
    return metadata.model_dump(exclude={"last_updated_ms"})


# -- the version check -----------------------------------------------------------------------------


def import_internals_with(assignment: str, then: str = "") -> subprocess.CompletedProcess:
    code = (
        f"{assignment}\nimport icekeeper.common.internals as i\n"
        f"print('parser', i.FOOTER_PARSER_ENABLED)\n{then}"
    )
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", code],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )


def test_another_pyiceberg_fails_at_import_naming_the_module() -> None:
    found = import_internals_with("import pyiceberg; pyiceberg.__version__ = '0.13.0'")
    assert found.returncode != 0
    assert "ImportError" in found.stderr and "common/internals.py" in found.stderr
    assert "0.13.0" in found.stderr


# pyspark's version, as `importlib.metadata` reports it to the check (pyspark itself not imported).
_PYSPARK_VERSION_IS = """
import importlib.metadata as m
real = m.version
def version(name):
    if name != "pyspark":
        return real(name)
    if {found!r} is None:
        raise m.PackageNotFoundError(name)
    return {found!r}
m.version = version
"""


def test_another_pyspark_fails_at_the_first_spark_shortcut_not_at_import() -> None:
    """The bookkeeper imports this module and uses no pyspark shortcut: its install, without
    pyspark, loads it; a writer on another pyspark stops at its first shortcut, naming this
    module. Fails without the check's move: the import itself raised."""
    found = import_internals_with(
        _PYSPARK_VERSION_IS.format(found="4.2.0"),
        then="print('loaded')\ni.spark_jvm(None)",
    )
    assert "loaded" in found.stdout, found.stderr
    assert found.returncode != 0
    assert "ImportError" in found.stderr and "common/internals.py" in found.stderr
    assert "pyspark 4.1.x, found 4.2.0" in found.stderr


def test_no_pyspark_loads_and_names_the_extra_at_the_first_spark_shortcut() -> None:
    found = import_internals_with(
        _PYSPARK_VERSION_IS.format(found=None),
        then="print('loaded')\ni.java_spark_session(None)",
    )
    assert "loaded" in found.stdout, found.stderr
    assert "ModuleNotFoundError" in found.stderr
    assert "pip install 'icekeeper[spark]'" in found.stderr


def test_another_pyarrow_warns_and_switches_the_footer_parser_off() -> None:
    found = import_internals_with("import pyarrow; pyarrow.__version__ = '99.0.0'")
    assert found.returncode == 0, found.stderr
    assert "parser False" in found.stdout
    assert "pyarrow 99.0.0" in found.stderr and "common/internals.py" in found.stderr
    assert "parser True" in import_internals_with("").stdout


# -- pyiceberg: metadata ---------------------------------------------------------------------------


def test_applied_updates_are_pyiceberg_s_metadata_and_leave_the_base_alone(tmp_path: Path) -> None:
    table = table_with_rows(sql_catalog(tmp_path))
    base = table.metadata
    before = base.model_dump()
    updates = staged_changes(table)
    ours, changed = apply_table_updates(base, updates)
    theirs = update_table_metadata(base, updates)
    assert changed and comparable(ours) == comparable(theirs)
    assert base.model_dump() == before  # nothing of the base changed, although not copied
    assert apply_table_updates(base, ()) == (base, False)


def test_the_metadata_log_entry_is_pyiceberg_s(tmp_path: Path) -> None:
    table = table_with_rows(sql_catalog(tmp_path))
    base, location = table.metadata, table.metadata_location
    updates = staged_changes(table)
    applied, _ = apply_table_updates(base, updates)
    ours = append_metadata_log(applied, location, base.last_updated_ms)
    theirs = update_table_metadata(base, updates, metadata_location=location)
    assert ours.metadata_log == theirs.metadata_log
    assert ours.metadata_log[-1].metadata_file == location


def test_an_uncopied_transaction_reads_the_public_transaction_s_metadata(tmp_path: Path) -> None:
    table = table_with_rows(sql_catalog(tmp_path))
    public, ours = table.transaction(), UncopiedTransaction(table)
    for transaction in (public, ours):
        transaction.set_properties(owner="tests")
        transaction.update_schema().add_column("extra", LongType()).commit()
    assert comparable(ours.table_metadata) == comparable(public.table_metadata)
    assert ours.table_metadata is ours.table_metadata  # built once per staged state
    ours.set_properties(owner="someone else")
    assert ours.table_metadata.properties["owner"] == "someone else"


# -- pyiceberg: transactions -----------------------------------------------------------------------


def test_the_transaction_s_table_is_the_one_it_was_opened_on(tmp_path: Path) -> None:
    table = table_with_rows(sql_catalog(tmp_path))
    assert transaction_table(table.transaction()) is table
    assert transaction_table(UncopiedTransaction(table)) is table


def test_staged_updates_commit_with_the_schema_ids_given(tmp_path: Path) -> None:
    table = table_with_rows(sql_catalog(tmp_path))
    # Field id 7, not the next free id (3) that `update_schema()` would choose.
    wider = Schema(*SCHEMA.fields, NestedField(7, "extra", LongType(), required=False), schema_id=1)
    transaction = table.transaction()
    stage_updates(
        transaction,
        (AddSchemaUpdate(schema=wider), SetCurrentSchemaUpdate(schema_id=-1)),
        (AssertCurrentSchemaId(current_schema_id=table.schema().schema_id),),
    )
    transaction.commit_transaction()
    assert table.schema().find_field("extra").field_id == 7
    with pytest.raises(CommitFailedException):  # requirements are checked as the builders' are
        stage_updates(
            table.transaction(),
            (AddSchemaUpdate(schema=wider),),
            (AssertCurrentSchemaId(current_schema_id=table.schema().schema_id + 5),),
        )


def test_commit_once_commits_as_the_public_commit_and_never_retries(tmp_path: Path) -> None:
    catalog = sql_catalog(tmp_path)
    table = table_with_rows(catalog)
    twin = catalog.load_table("ns.t")
    transaction = table.transaction().set_properties(owner="tests")
    assert commit_once(transaction) is table
    assert catalog.load_table("ns.t").metadata == table.metadata
    assert table.properties["owner"] == "tests"
    # A transaction on the table as it was before an append: the public commit would rebuild
    # it on the new snapshot and retry; this one stops at the conflict.
    stale = twin.transaction()
    stale.append(ROWS)
    table.append(ROWS)
    with pytest.raises(CommitFailedException):
        commit_once(stale)
    assert len(catalog.load_table("ns.t").snapshots()) == 2


# -- pyiceberg: records, snapshot producers --------------------------------------------------------


def test_record_fields_are_the_record_s_values_in_order(tmp_path: Path) -> None:
    table = table_with_rows(sql_catalog(tmp_path))
    manifest = table.current_snapshot().manifests(table.io)[0]
    entry = manifest.fetch_manifest_entry(table.io)[0]
    for record in (manifest, entry, entry.data_file):
        assert record_fields(record) == [record[i] for i in range(len(record))]
    assert record_fields(entry.data_file)[1] == entry.data_file.file_path


def test_streamed_manifest_entries_are_pyiceberg_s_list(tmp_path: Path) -> None:
    table = table_with_rows(sql_catalog(tmp_path))
    table.delete("id = 1")  # a manifest with a deleted entry: filtered as pyiceberg filters it
    for manifest in table.current_snapshot().manifests(table.io):
        for discard_deleted in (True, False):
            streamed = manifest_entries(manifest, table.io, discard_deleted)
            assert not isinstance(streamed, list)
            assert list(streamed) == manifest.fetch_manifest_entry(table.io, discard_deleted)


def test_a_producer_with_its_own_list_writer_commits_pyiceberg_s_snapshot(tmp_path: Path) -> None:
    catalog = sql_catalog(tmp_path)
    source = table_with_rows(catalog, "source")
    data_file = next(iter(source.scan().plan_files())).file
    written = []

    def recording_write_manifest_list(**arguments: object) -> object:
        written.append(arguments)
        return write_manifest_list(**arguments)

    class Producer(MergeAppendFiles):
        _commit = snapshot_commit_writing_lists_with(recording_write_manifest_list)

    snapshots = []
    for name, ours in (("public", False), ("ours", True)):
        table = catalog.create_table(f"ns.{name}", schema=SCHEMA)
        transaction = table.transaction()
        if ours:
            producer = Producer(
                operation=Operation.APPEND,
                transaction=transaction,
                io=table.io,
                branch=MAIN_BRANCH,
                snapshot_properties={"by": "tests"},
            )
        else:
            producer = transaction.update_snapshot({"by": "tests"}).merge_append()
        with producer:
            producer.append_data_file(data_file)
        transaction.commit_transaction()
        snapshots.append(table.current_snapshot())
        assert table.scan().to_arrow().sort_by("id").equals(ROWS)
    assert len(written) == 1
    public, ours = snapshots
    assert ours.summary == public.summary
    assert [m.added_files_count for m in ours.manifests(source.io)] == [1]


# -- pyiceberg: catalogs ---------------------------------------------------------------------------


def test_a_catalog_object_uses_the_replacements_others_do_not(tmp_path: Path) -> None:
    catalog, other = sql_catalog(tmp_path), sql_catalog(tmp_path)
    table_with_rows(catalog)
    calls = {"update": 0, "write": 0, "read": 0}

    def update(*arguments: object, **keywords: object) -> object:
        calls["update"] += 1
        return update_table_metadata(*arguments, **keywords)

    def write(metadata: object, io: object, metadata_path: str) -> None:
        calls["write"] += 1
        ToOutputFile.table_metadata(metadata, io.new_output(metadata_path))

    def read(input_file: object) -> object:
        calls["read"] += 1
        return FromInputFile.table_metadata(input_file)

    replace_metadata_update(catalog, update)
    replace_metadata_writer(catalog, write)
    assert replace_sql_metadata_reader(catalog, read)
    table = catalog.load_table("ns.t")
    table.transaction().set_properties(owner="tests").commit_transaction()
    assert calls["update"] == calls["write"] == 1 and calls["read"] >= 1
    ours = dict(calls)
    seen_by_others = other.load_table("ns.t")
    seen_by_others.transaction().set_properties(owner="others").commit_transaction()
    assert calls == ours
    assert catalog.load_table("ns.t").metadata == other.load_table("ns.t").metadata
    assert catalog.load_table("ns.t").properties["owner"] == "others"


@pytest.mark.integration
def test_a_rest_catalog_object_parses_answers_with_the_replacement_and_keeps_pyiceberg_s_errors(
    tmp_path: Path, rest_catalog
) -> None:
    """Loads and commits of this catalog object go through `parse`, other objects' do not; a
    conflict is still pyiceberg's `CommitFailedException` (its error mapping, unchanged)."""
    properties = rest_catalog.pyiceberg_properties()
    catalog, other = load_catalog("ours", **properties), load_catalog("other", **properties)
    assert not replace_rest_answer_parser(sql_catalog(tmp_path), print)
    parsed = []

    def parse(model: type, text: str) -> object:
        parsed.append(model.__name__)
        return model.model_validate_json(text)

    assert replace_rest_answer_parser(catalog, parse)
    answers: list[tuple[str, int]] = []
    assert not add_rest_response_hook(sql_catalog(tmp_path), print)
    assert add_rest_response_hook(
        catalog, lambda answer: answers.append((answer.request.method, answer.status_code))
    )
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    other.create_namespace(namespace)
    identifier = f"{namespace}.t"
    other.create_table(
        identifier, schema=SCHEMA, location=f"{rest_catalog.warehouse()}/{namespace}/t"
    )
    table = catalog.load_table(identifier)
    stale = catalog.load_table(identifier)
    table.transaction().set_properties(owner="tests").commit_transaction()
    assert parsed == ["TableResponse", "TableResponse", "CommitTableResponse"]
    assert answers == [("GET", 200), ("GET", 200), ("POST", 200)]  # this object's only
    with other.load_table(identifier).update_schema() as update:
        update.add_column("other", LongType())
    transaction = stale.transaction()
    with transaction.update_schema() as update:
        update.add_column("ours", LongType())
    with pytest.raises(CommitFailedException):
        commit_once(transaction)
    assert parsed == ["TableResponse", "TableResponse", "CommitTableResponse"]
    assert catalog.load_table(identifier).metadata == other.load_table(identifier).metadata
    assert parsed[-1] == "TableResponse"


class SilentServer:
    """A TCP server that accepts connections, reads what comes, and never answers (a metastore,
    or a proxy in front of it, that stopped)."""

    def __init__(self) -> None:
        self.closed_by_client = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.uri = f"thrift://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection: socket.socket) -> None:
        with connection:
            while connection.recv(65536):
                pass
        self.closed_by_client.set()

    def close(self) -> None:
        self._listener.close()


def test_a_metastore_that_never_answers_times_out_and_its_connection_is_not_used_again() -> None:
    server = SilentServer()
    try:
        catalog = load_catalog("silent", type="hive", uri=server.uri)
        assert set_hive_socket_timeout(catalog, 0.5)

        def two_calls_on_one_connection() -> TTransportException:
            with hive_metastore_client(catalog) as client:
                started = time.monotonic()
                with pytest.raises(TTransportException) as timed_out:
                    client.get_all_databases()
                assert timed_out.value.type == TTransportException.TIMED_OUT
                assert time.monotonic() - started < 5
                # The late answer to the first call must never be read as the second's: the
                # connection is closed, and the second call fails at once.
                with pytest.raises(TTransportException) as closed:
                    client.get_all_databases()
                return closed.value

        assert (
            returns_within(two_calls_on_one_connection, 10, "two calls").type
            == TTransportException.NOT_OPEN
        )
        assert server.closed_by_client.wait(5)
        # The catalog's next call opens a connection of its own, with the same timeout.
        with pytest.raises(TTransportException):
            returns_within(lambda: catalog.load_table("shop.items"), 10, "load_table")
        # Another catalog object keeps pyiceberg's socket, without a timeout.
        other = load_catalog("other", type="hive", uri=server.uri)
        assert other._client._transport._TBufferedTransport__trans._timeout is None
    finally:
        server.close()


def test_other_catalogs_get_no_socket_timeout(tmp_path: Path) -> None:
    assert not set_hive_socket_timeout(sql_catalog(tmp_path), 1)


# -- pyarrow ---------------------------------------------------------------------------------------


def test_footer_bytes_parse_to_pyarrow_s_file_metadata(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    pq.write_table(ROWS, path, row_group_size=2)
    data = path.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    ours = parse_footer_bytes(pa.py_buffer(data[-8 - length : -8]))
    theirs = pq.read_metadata(path)
    assert ours.equals(theirs) and ours.to_dict() == theirs.to_dict()
    assert ours.num_rows == 3 and ours.num_row_groups == 2


# -- pyspark ---------------------------------------------------------------------------------------


@pytest.mark.spark
def test_the_jvm_behind_a_spark_session(spark) -> None:
    assert java_spark_session(spark).version() == spark.version
    assert spark_jvm(spark).java.lang.Integer.parseInt("42") == 42
    assert py4j_gateway(spark).jvm.java.lang.Integer.parseInt("7") == 7
    assert java_dataset(spark.range(3)).count() == 3
    assert hadoop_configuration(spark).get("fs.file.impl.disable.cache") is None


@pytest.mark.spark
def test_the_java_exception_behind_a_spark_error(spark) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors.exceptions.captured import CapturedException

    with pytest.raises(CapturedException) as converted:  # PySpark converts the errors it knows
        spark_jvm(spark).java.lang.Integer.parseInt("not a number")
    found = java_exception_of(converted.value)
    assert found.getClass().getName() == "java.lang.NumberFormatException"
    assert java_exception_of(Py4JJavaError("a call failed", found)) is found  # as py4j raises it
    assert java_exception_of(ValueError("not from Spark")) is None

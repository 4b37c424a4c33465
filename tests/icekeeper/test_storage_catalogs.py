"""The stack's S3 server and Iceberg catalogs (`stack up --with s3 rest nessie hms pg-catalog`).

Each catalog is used as its users would: pyiceberg creates a table through it and appends rows
that land on the S3 server, then reads them back; DuckDB reads the same table (attached as an
Iceberg REST catalog, or by its metadata file), and Spark reads it through the same catalog and
appends a row that pyiceberg then sees. Every client is configured only from what the service
says (`pyiceberg_properties`, `spark_catalog`, `duckdb_statements`).
"""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog, load_catalog

from icekeeper.common.config import IcekeeperConfig, load_config
from icekeeper.localstack.catalog_service import CatalogService
from icekeeper.localstack.object_store import S3Service
from icekeeper.localstack.rest_catalogs import NessieService, RestCatalogService
from icekeeper.localstack.stack import LocalStack
from icekeeper.readers import duckdb_connection
from tests.support.stack import second_stack_ports, stack_environ

pytestmark = pytest.mark.integration

ROWS = 1_000
CATALOG_FIXTURES = ("rest_catalog", "nessie_catalog", "hive_metastore", "pg_catalog")


@pytest.fixture(params=CATALOG_FIXTURES)
def catalog_service(request) -> CatalogService:
    return request.getfixturevalue(request.param)


def client_name(service: CatalogService) -> str:
    """The catalog's name in pyiceberg and Spark: a SQL catalog stores it with every table, so
    both must use the same."""
    return "stack_" + service.name.replace("-", "_")


def open_catalog(service: CatalogService) -> Catalog:
    return load_catalog(client_name(service), **service.pyiceberg_properties())


def new_table(catalog: Catalog) -> str:
    """A fresh namespace with a table of `ROWS` rows appended by pyiceberg; its identifier."""
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    table = catalog.create_table(
        f"{namespace}.events", pa.schema([("id", pa.int64()), ("name", pa.string())])
    )
    table.append(pa.table({"id": range(ROWS), "name": [f"n{i}" for i in range(ROWS)]}))
    return f"{namespace}.events"


def stored_objects(storage: S3Service, location: str) -> list[Path]:
    """Files the S3 server keeps under an `s3://` location (its filesystem backend)."""
    assert location.startswith(f"s3://{storage.stack.s3_bucket}/"), location
    folder = storage.data_dir / location.removeprefix("s3://")
    return sorted(path for path in folder.rglob("*") if path.is_file())


def test_the_s3_server_has_its_bucket_and_answers_only_signed_requests(
    s3_storage: S3Service,
) -> None:
    from pyarrow.fs import AwsStandardS3RetryStrategy, FileSelector, S3FileSystem

    filesystem = s3_storage.filesystem()
    buckets = {info.path for info in filesystem.get_file_info(FileSelector("", recursive=False))}
    assert s3_storage.stack.s3_bucket in buckets
    key = f"{s3_storage.stack.s3_bucket}/probe/{uuid.uuid4().hex}.txt"
    with filesystem.open_output_stream(key) as out:
        out.write(b"kept as a file")
    with filesystem.open_input_stream(key) as source:
        assert source.read() == b"kept as a file"
    assert (s3_storage.data_dir / key).read_bytes() == b"kept as a file"

    stranger = S3FileSystem(
        access_key=s3_storage.stack.s3_access_key_id,
        secret_key="not-the-secret",
        region=s3_storage.stack.s3_region,
        endpoint_override=s3_storage.address(),
        scheme="http",
        force_virtual_addressing=False,
        retry_strategy=AwsStandardS3RetryStrategy(max_attempts=1),
    )
    with pytest.raises(OSError, match="(?i)signature|denied|403"):
        stranger.get_file_info(key)


def test_duckdb_reads_parquet_on_the_s3_server(s3_storage: S3Service) -> None:
    uri = s3_storage.uri(f"plain/{uuid.uuid4().hex}.parquet")
    pq.write_table(
        pa.table({"id": range(ROWS)}), uri.removeprefix("s3://"), filesystem=s3_storage.filesystem()
    )
    connection = duckdb_connection()
    try:
        for statement in s3_storage.duckdb_statements():
            connection.execute(statement)
        assert connection.execute(f"SELECT count(*), sum(id) FROM '{uri}'").fetchone() == (
            ROWS,
            sum(range(ROWS)),
        )
    finally:
        connection.close()


def test_pyiceberg_and_duckdb_round_trip_through_each_catalog(
    catalog_service: CatalogService, s3_storage: S3Service
) -> None:
    catalog = open_catalog(catalog_service)
    identifier = new_table(catalog)

    table = open_catalog(catalog_service).load_table(identifier)
    assert table.scan().to_arrow().sort_by("id")["id"].to_pylist() == list(range(ROWS))
    assert table.location().startswith(catalog_service.warehouse() + "/")
    files = stored_objects(s3_storage, table.location())
    assert any(path.suffix == ".parquet" for path in files), files

    connection = duckdb_connection()
    try:
        for statement in catalog_service.duckdb_statements("stack"):
            connection.execute(statement)
        if isinstance(catalog_service, RestCatalogService | NessieService):
            query = f"SELECT count(*), max(name) FROM stack.{identifier}"
        else:
            query = f"SELECT count(*), max(name) FROM iceberg_scan('{table.metadata_location}')"
        assert connection.execute(query).fetchone() == (ROWS, "n999")
    finally:
        connection.close()


@pytest.mark.spark
def test_spark_reads_and_appends_through_each_catalog(
    catalog_service: CatalogService, spark
) -> None:
    catalog = open_catalog(catalog_service)
    identifier = new_table(catalog)
    name = client_name(catalog_service)
    settings = catalog_service.spark_catalog(name)
    # The session has the jars (tests/conftest.py); a catalog's settings count from its first use.
    for key, value in settings.conf.items():
        spark.conf.set(key, value)

    assert spark.sql(f"SELECT count(*) FROM {name}.{identifier}").collect()[0][0] == ROWS
    spark.sql(f"INSERT INTO {name}.{identifier} VALUES ({ROWS}, 'from spark')")

    appended = catalog.load_table(identifier).scan(row_filter=f"id = {ROWS}").to_arrow()
    assert appended["name"].to_pylist() == ["from spark"]


@pytest.mark.spark
def test_spark_writes_plain_parquet_to_the_s3_server_through_s3a(
    s3_storage: S3Service, spark
) -> None:
    # The session runs already: Hadoop settings go in without their `spark.hadoop.` prefix.
    for key, value in s3_storage.spark_hadoop_conf().items():
        spark.conf.set(key.removeprefix("spark.hadoop."), value)
    uri = s3_storage.uri(f"spark/{uuid.uuid4().hex}")
    spark.range(ROWS).write.parquet(uri)
    assert spark.read.parquet(uri).count() == ROWS
    written = stored_objects(s3_storage, uri)
    assert any(path.suffix == ".parquet" for path in written), written


def restart(config: IcekeeperConfig, name: str) -> None:
    stack = LocalStack(config, only=[name], with_services=[name])
    assert stack.down(progress=lambda message: None) == [name]
    assert stack.up(progress=lambda message: None).started == [name]


@pytest.mark.parametrize(
    "fixture",
    [
        "rest_catalog",
        "hive_metastore",
        "pg_catalog",
        pytest.param("nessie_catalog", marks=pytest.mark.heavy),  # its restart takes longest
    ],
)
def test_each_catalog_keeps_its_tables_across_a_restart(
    fixture: str, request, stack_config: IcekeeperConfig
) -> None:
    """`stack down` then `stack up` at once: the server stops cleanly and lets go of its port
    before `down` returns, and comes back with its tables (a SQLite file, Derby, PostgreSQL's
    data folder, RocksDB)."""
    service: CatalogService = request.getfixturevalue(fixture)
    identifier = new_table(open_catalog(service))
    restart(stack_config, service.name)
    assert open_catalog(service).load_table(identifier).scan().to_arrow().num_rows == ROWS


def test_a_catalog_brings_the_s3_server_and_down_stops_both(tmp_path: Path) -> None:
    ports = second_stack_ports(6_400)
    config = load_config(None, environ=stack_environ(tmp_path / "state", ports))
    # `--with rest` alone: the REST catalog is no use without the S3 server its tables live on.
    stack = LocalStack(config, only=["s3", "rest"], with_services=["rest"])
    started = time.monotonic()
    report = stack.up(progress=lambda message: None)
    print(f"s3 and rest up in {time.monotonic() - started:.1f}s")
    try:
        assert report.started == ["s3", "rest"]
        assert all(status.state == "running" for status in stack.status())
        identifier = new_table(open_catalog(stack.service("rest")))
    finally:
        stopped = stack.down(progress=lambda message: None)
    assert stopped == ["rest", "s3"]
    assert not any(
        socket.socket().connect_ex(("127.0.0.1", port)) == 0
        for port in (ports["s3_port"], ports["rest_catalog_port"])
    )
    # What they served stays in the state folder for the next `up`.
    state = tmp_path / "state" / "stack"
    assert (state / "rest" / "catalog.db").stat().st_size > 0
    namespace = identifier.split(".")[0]
    assert (state / "s3" / "data" / "icekeeper" / "warehouse" / "rest" / namespace).is_dir()

"""Read an icekeeper table with other engines (DuckDB,
Spark SQL), to show they see what we wrote."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyiceberg.manifest import DataFileContent
from pyiceberg.table import Table

from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.common.storage import duckdb_storage_statements, storage_settings
from icekeeper.common.stores.azure import SCHEMES as AZURE_SCHEMES
from icekeeper.common.stores.azure import blob_url as azure_blob_url

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _extension_file(package: str, name: str) -> str:
    """The extension shipped inside a `duckdb-extension-*` wheel (so nothing is downloaded)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{package} is not installed (pip install '.[test]')")
    found = sorted(
        Path(next(iter(spec.submodule_search_locations))).rglob(f"{name}.duckdb_extension")
    )
    if not found:
        raise RuntimeError(f"no {name}.duckdb_extension inside {package}")
    return str(found[-1])


def duckdb_connection():  # noqa: ANN201 - duckdb.DuckDBPyConnection
    """A DuckDB connection with the avro, iceberg and httpfs (S3, and Iceberg REST catalogs)
    extensions loaded from their wheels, azure too when the storage door has `adls.*`
    properties, and a secret for each object store the door is configured for, so
    `duckdb_source` reads tables on S3 and Azure Blob."""
    import duckdb

    connection = duckdb.connect(
        config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
    )
    # avro first: iceberg needs it and would otherwise try to download it.
    connection.execute(f"LOAD '{_extension_file('duckdb_extension_avro', 'avro')}'")
    connection.execute(f"LOAD '{_extension_file('duckdb_extension_iceberg', 'iceberg')}'")
    connection.execute(f"LOAD '{_extension_file('duckdb_extension_httpfs', 'httpfs')}'")
    if any(key.startswith("adls.") for key in storage_settings().mapping):
        connection.execute(f"LOAD '{_extension_file('duckdb_extension_azure', 'azure')}'")
    for statement in duckdb_storage_statements():
        connection.execute(statement)
    return connection


def duckdb_source(table: Table) -> str:
    """What a DuckDB query reads the table's current rows from: `iceberg_scan` of its metadata
    file; for a table on Azure Blob, its current Parquet files as pyiceberg plans them.

    DuckDB opens `abfss://<container>@<account>.dfs.core.windows.net/...`, the URI form the
    table's metadata and manifests name, through the account's DFS endpoint at
    `<account>.dfs.core.windows.net`, whatever endpoint its secret gives: Azurite has none, and
    a real account is reached only through it (DuckDB 1.5.5). Its `az://<container>/<path>` form
    goes through the Blob endpoint of the secret's connection string, which every account and
    Azurite serve; so the data files are read that way, each data file's position deletes
    (`file_path`, `pos`) left out. Columns are matched by name, not by field id (a column
    renamed since a file was written reads as null there)."""
    location = table.location()
    if not location.startswith(tuple(f"{scheme}://" for scheme in AZURE_SCHEMES)):
        return f"iceberg_scan('{table.metadata_location}')"
    data_files, delete_files = [], set()
    for task in table.scan().plan_files():
        data_files.append(task.file.file_path)
        for delete in task.delete_files:
            if delete.content != DataFileContent.POSITION_DELETES:
                raise ValueError(
                    f"{table.name()}: equality deletes on Azure are not read by DuckDB here"
                )
            delete_files.add(delete.file_path)

    def files(paths: Iterable[str]) -> str:
        return (
            "[" + ", ".join("'" + azure_blob_url(p).replace("'", "''") + "'" for p in paths) + "]"
        )

    if not data_files:
        names = ", ".join(
            f'CAST(NULL AS VARCHAR) AS "{field.name}"' for field in table.schema().fields
        )
        return f"(SELECT {names} LIMIT 0)"
    rows = f"read_parquet({files(data_files)}, filename=true, file_row_number=true)"
    if not delete_files:
        return f"(SELECT * EXCLUDE (filename, file_row_number) FROM {rows})"
    deletes = f"read_parquet({files(sorted(delete_files))})"
    return (
        f"(SELECT * EXCLUDE (filename, file_row_number) FROM {rows} AS live WHERE NOT EXISTS "
        f"(SELECT 1 FROM {deletes} AS gone WHERE gone.pos = live.file_row_number AND "
        f"regexp_replace(gone.file_path, '^[a-z]+://([^@/]+)@[^/]+/', 'az://\\1/') "
        "= live.filename))"
    )


def duckdb_rows(
    table: Table, columns: str = "*", order_by: str | None = None
) -> list[dict[str, Any]]:
    """The table's current rows as DuckDB reads them (via the current metadata file)."""
    connection = duckdb_connection()
    try:
        query = f"SELECT {columns} FROM {duckdb_source(table)}"
        if order_by:
            query += f" ORDER BY {order_by}"
        cursor = connection.execute(query)
        names = [description[0] for description in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]
    finally:
        connection.close()


def duckdb_tuples(
    table: Table, columns: list[str], batch_rows: int = 100_000
) -> Iterator[tuple[Any, ...]]:
    """The table's current rows as DuckDB reads them, as tuples of `columns`, fetched `batch_rows`
    at a time: a million-row table is checked without holding every row as a dict."""
    connection = duckdb_connection()
    try:
        names = ", ".join('"' + name.replace('"', '""') + '"' for name in columns)
        cursor = connection.execute(f"SELECT {names} FROM {duckdb_source(table)}")
        while batch := cursor.fetchmany(batch_rows):
            yield from batch
    finally:
        connection.close()


def spark_rows(
    spark: SparkSession,
    config: IcekeeperConfig,
    identifier: str,
    columns: str = "*",
    order_by: str | None = None,
) -> list[dict[str, Any]]:
    """The table's rows as Spark SQL reads them through
    iceberg-spark-runtime on the same catalog."""
    from icekeeper.common.spark import iceberg_catalog_conf

    for key, value in iceberg_catalog_conf(config).items():
        spark.conf.set(key, value)
    query = f"SELECT {columns} FROM {config.catalog.name}.{identifier}"
    if order_by:
        query += f" ORDER BY {order_by}"
    return [row.asDict() for row in spark.sql(query).collect()]


def render_grid(
    rows: list[dict[str, Any]], columns: list[str] | None = None, max_width: int = 40
) -> str:
    """Rows as the `+---+` grid Spark's `show()` prints (the seed article's result listing)."""
    if not rows:
        return "(no rows)"
    columns = columns or list(rows[0])

    def cell(value: Any) -> str:
        text = "null" if value is None else str(value)
        return text if len(text) <= max_width else text[: max_width - 3] + "..."

    widths = {c: max(len(c), *(len(cell(r.get(c))) for r in rows)) for c in columns}
    border = "+" + "+".join("-" * widths[c] for c in columns) + "+"
    header = "|" + "|".join(c.ljust(widths[c]) for c in columns) + "|"
    body = ["|" + "|".join(cell(r.get(c)).ljust(widths[c]) for c in columns) + "|" for r in rows]
    return "\n".join([border, header, border, *body, border])

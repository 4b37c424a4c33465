"""Validate a moniker's files and describe them as Iceberg data files, footers read in parallel.

pyiceberg's `add_files` is not used: it maps statistics by column *name* against the table's
current schema, rejects INT96, and rescans every manifest on each call. Here statistics are
mapped through the schema the file was written with (the moniker's, whose ids the Parquet
footer carries), partition values come from the writer, and no manifest is read.
"""

from __future__ import annotations

import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs
from pyiceberg.io.pyarrow import compute_statistics_plan, data_file_statistics_from_parquet_metadata, parquet_path_to_id_mapping
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record

from common.moniker import FileEntry


class InvalidFile(ValueError):
    """A file a moniker names that cannot be committed; the message says why."""


@dataclass(frozen=True)
class FooterFacts:
    """What a footer tells: row count, field ids present, and the raw metadata for statistics."""

    path: str
    size_bytes: int
    num_rows: int
    field_ids: frozenset[int]
    metadata: pq.FileMetaData


def normalize_location(path: str) -> str:
    """`file:/x`, `file:///x` and `/x` name the same local file (Java writes the first form)."""
    if path.startswith("file:"):
        path = "/" + path[len("file:"):].lstrip("/")
    return path.rstrip("/")


def read_footer(path: str) -> FooterFacts:
    """Open one file and read its footer (one ranged read on object stores)."""
    filesystem, local = pafs.FileSystem.from_uri(path if "://" in path else f"file://{path}")
    try:
        info = filesystem.get_file_info(local)
        if info.type != pafs.FileType.File:
            raise InvalidFile(f"{path}: does not exist")
        with filesystem.open_input_file(local) as handle:
            metadata = pq.ParquetFile(handle).metadata
    except (OSError, ValueError, pa.ArrowException) as error:  # ArrowInvalid: not Parquet (truncated, overwritten)
        raise InvalidFile(f"{path}: unreadable ({error})") from None
    ids = frozenset(_field_ids(metadata))
    return FooterFacts(path, info.size, metadata.num_rows, ids, metadata)


def _field_ids(metadata: pq.FileMetaData) -> list[int]:
    arrow_schema = metadata.schema.to_arrow_schema()
    ids = []
    for arrow_field in arrow_schema:
        raw = (arrow_field.metadata or {}).get(b"PARQUET:field_id")
        if raw is not None:
            ids.append(int(raw))
    return ids


def read_footers(paths: list[str], threads: int) -> dict[str, FooterFacts | InvalidFile]:
    """Footers of many files at once; each value is the facts or the reason it failed."""

    def one(path: str) -> FooterFacts | InvalidFile:
        try:
            return read_footer(path)
        except InvalidFile as error:
            return error

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        return dict(zip(paths, pool.map(one, paths)))


def validate(entry: FileEntry, facts: FooterFacts, table_location: str, file_schema: Schema) -> None:
    """Raise `InvalidFile` unless the file is where, how big and what the moniker says."""
    location = normalize_location(table_location) + "/"
    if not normalize_location(entry.path).startswith(location):
        raise InvalidFile(f"{entry.path}: not under the table location {table_location}")
    if facts.size_bytes != entry.size_bytes:
        raise InvalidFile(f"{entry.path}: size {facts.size_bytes} bytes, moniker says {entry.size_bytes}")
    if facts.num_rows != entry.record_count:
        raise InvalidFile(f"{entry.path}: {facts.num_rows} rows, moniker says {entry.record_count}")
    if not facts.field_ids:
        raise InvalidFile(f"{entry.path}: no Iceberg field ids in the Parquet schema")
    unknown = facts.field_ids - {f.field_id for f in file_schema.fields}
    if unknown:
        raise InvalidFile(f"{entry.path}: field ids {sorted(unknown)} are not in the moniker's schema")


def data_file(entry: FileEntry, facts: FooterFacts, file_schema: Schema, spec: PartitionSpec, table_properties: dict[str, str]) -> DataFile:
    """An Iceberg DataFile with full column metrics keyed by field id."""
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=facts.metadata,
        stats_columns=compute_statistics_plan(file_schema, table_properties),
        parquet_column_mapping=parquet_path_to_id_mapping(file_schema),
    )
    values = []
    for field in spec.fields:
        if field.name not in entry.partition:
            raise InvalidFile(f"{entry.path}: no value for partition field {field.name!r} (spec {spec.spec_id})")
        values.append(entry.partition[field.name])
    data = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=entry.path,
        file_format=FileFormat.PARQUET,
        partition=Record(*values),
        file_size_in_bytes=facts.size_bytes,
        sort_order_id=None,
        spec_id=spec.spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )
    # pyiceberg 0.12's from_args drops `spec_id` (reading it later raises AttributeError).
    data.spec_id = spec.spec_id
    return data


def relative_to(table_location: str, path: str) -> str:
    return posixpath.relpath(normalize_location(path), normalize_location(table_location))

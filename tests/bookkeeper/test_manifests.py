"""Manifests written by the bookkeeper's encoder: the bytes
pyiceberg would write, read back by other readers."""

from __future__ import annotations

import io
from pathlib import Path

import fastavro
import pytest
from pyiceberg.avro.encoder import BinaryEncoder
from pyiceberg.avro.resolver import construct_writer, resolve_writer
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
    read_manifest_list,
    write_manifest_list,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import DateType, LongType, NestedField, StringType, TimestamptzType

from icekeeper.bookkeeper.manifests import (
    _ManifestWriter,
    _partition_encoder,
    _write_manifest_list,
    encode_manifest_entry,
    encode_manifest_file,
    written_manifest_list,
)
from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.transports import open_transport
from icekeeper.readers import duckdb_rows
from tests.support.shop_items import bookkeeper_config, make_moniker

TABLE_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "day", DateType(), required=False),
    NestedField(4, "at", TimestamptzType(), required=False),
)
UNPARTITIONED = PartitionSpec(spec_id=0)
PARTITIONED = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region"),
    PartitionField(source_id=3, field_id=1001, transform=IdentityTransform(), name="day"),
    PartitionField(source_id=4, field_id=1002, transform=DayTransform(), name="at_day"),
    PartitionField(source_id=1, field_id=1003, transform=BucketTransform(16), name="id_bucket"),
    spec_id=1,
)


def data_files(spec: PartitionSpec) -> list[DataFile]:
    """Data files with every kind of value an entry holds: big and negative numbers, missing and
    empty maps, key metadata, equality ids, unicode paths, null partition values."""
    files = []
    for index in range(40):
        partition = (
            Record("eu-wést" if index % 3 else None, 19_000 + index, 19_500 - index, index % 16)
            if spec.fields
            else Record()
        )
        files.append(
            DataFile.from_args(
                content=DataFileContent.DATA if index % 5 else DataFileContent.EQUALITY_DELETES,
                file_path=f"file:///warehouse/tbl/data/ünïcode-{index:05d}.parquet",
                file_format=FileFormat.PARQUET,
                partition=partition,
                record_count=index * 1000 + 7,
                file_size_in_bytes=2**33 + index,
                column_sizes=None
                if index % 7 == 0
                else {field_id: 10**index % 99_991 for field_id in range(1, 30)},
                value_counts={} if index % 6 == 0 else {1: index, 2: 2**40, 3: 0},
                null_value_counts={1: 0, 2: index * 3},
                nan_value_counts={} if index % 2 else {9: 1},
                lower_bounds={
                    1: (index - 20).to_bytes(8, "little", signed=True),
                    2: b"ab" * index,
                },
                upper_bounds=None if index % 4 == 0 else {1: b"\xff" * 8, 2: b"zz" * (index + 200)},
                key_metadata=b"secret" if index % 9 == 0 else None,
                split_offsets=None if index % 8 == 0 else [4, 2**31 + index],
                equality_ids=[1, 2] if index % 5 == 0 else None,
                sort_order_id=None if index % 2 else 0,
            )
        )
        files[-1].spec_id = spec.spec_id
    return files


def entries(spec: PartitionSpec, snapshot_id: int | None = 42) -> list[ManifestEntry]:
    """Added entries of this snapshot (no sequence number
    yet), existing and deleted ones of older snapshots."""
    statuses = [
        ManifestEntryStatus.ADDED,
        ManifestEntryStatus.EXISTING,
        ManifestEntryStatus.DELETED,
    ]
    return [
        ManifestEntry.from_args(
            status=statuses[index % 3],
            snapshot_id=snapshot_id if index % 3 == 0 else 8_000_000_000_000 + index,
            sequence_number=None if index % 3 == 0 else index,
            file_sequence_number=None if index % 3 == 0 else index - 1,
            data_file=data,
        )
        for index, data in enumerate(data_files(spec))
    ]


@pytest.mark.parametrize("spec", [UNPARTITIONED, PARTITIONED], ids=["unpartitioned", "partitioned"])
def test_entries_encode_to_the_bytes_pyicebergs_writer_writes(spec: PartitionSpec) -> None:
    writer = ManifestWriterV2(spec, TABLE_SCHEMA, None, 1, "deflate")  # type: ignore[arg-type]
    pyiceberg_writer = resolve_writer(
        record_schema=writer._with_partition(DEFAULT_READ_VERSION),
        file_schema=writer._with_partition(2),
    )
    partition = _partition_encoder(spec.partition_type(TABLE_SCHEMA))
    for entry in entries(spec) + entries(spec, snapshot_id=None):  # type: ignore[arg-type]
        theirs = io.BytesIO()
        pyiceberg_writer.write(BinaryEncoder(theirs), entry)
        ours = bytearray()
        assert encode_manifest_entry(ours, entry, partition)
        assert bytes(ours) == theirs.getvalue()


def write_manifest(
    writer_class: type, path: Path, spec: PartitionSpec, entries_: list[ManifestEntry]
):
    io_ = PyArrowFileIO()
    with writer_class(spec, TABLE_SCHEMA, io_.new_output(str(path)), 42, "gzip") as writer:
        for entry in entries_:
            writer.add_entry(entry)
    return writer.to_manifest_file()


@pytest.mark.parametrize("spec", [UNPARTITIONED, PARTITIONED], ids=["unpartitioned", "partitioned"])
def test_a_manifest_reads_back_like_pyicebergs_own(tmp_path: Path, spec: PartitionSpec) -> None:
    many = [entry for _ in range(10) for entry in entries(spec)]  # several blocks of ~64 KB
    ours = write_manifest(_ManifestWriter, tmp_path / "ours.avro", spec, many)
    theirs = write_manifest(ManifestWriterV2, tmp_path / "theirs.avro", spec, many)
    for key in (
        "added_files_count",
        "existing_files_count",
        "deleted_files_count",
        "added_rows_count",
        "existing_rows_count",
        "deleted_rows_count",
        "partitions",
        "partition_spec_id",
        "content",
        "min_sequence_number",
    ):
        assert getattr(ours, key) == getattr(theirs, key), key
    io_ = PyArrowFileIO()
    read_ours, read_theirs = (
        m.fetch_manifest_entry(io_, discard_deleted=False) for m in (ours, theirs)
    )
    assert [(e._data[:4], e.data_file._data) for e in read_ours] == [
        (e._data[:4], e.data_file._data) for e in read_theirs
    ]
    # An independent Avro reader sees the same header and records, in fewer blocks.
    with (
        open(tmp_path / "ours.avro", "rb") as mine,
        open(tmp_path / "theirs.avro", "rb") as pyicebergs,
    ):
        reader_ours, reader_theirs = fastavro.reader(mine), fastavro.reader(pyicebergs)
        assert reader_ours.metadata["avro.schema"] == reader_theirs.metadata["avro.schema"]
        assert {k: v for k, v in reader_ours.metadata.items()} == {
            k: v for k, v in reader_theirs.metadata.items()
        }
        assert list(reader_ours) == list(reader_theirs)
    with open(tmp_path / "ours.avro", "rb") as mine:
        blocks = sum(1 for _ in fastavro.block_reader(mine))
    assert 1 < blocks < len(many) / 10


def test_merged_manifests_of_many_commits_read_back_in_pyiceberg_and_duckdb(tmp_path: Path) -> None:
    """Merging rewrites older manifests' entries as existing ones, through the same encoder."""
    config = bookkeeper_config(
        tmp_path,
        tables="[{identifier: shop.items, topics: [items], primary_key: [id], "
        "properties: {commit.manifest.min-count-to-merge: '3'}}]",
    )
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    for seq in range(1, 9):
        transport.publish(
            make_moniker(config, seq, seq - 1 if seq > 1 else None, ((seq - 1) * 10, seq * 10))
        )
        assert bookkeeper.run_cycle().committed_monikers == 1
    table = bookkeeper.catalog.load_table("shop.items")
    manifests = table.current_snapshot().manifests(table.io)
    assert len(manifests) < 3 and sum(m.existing_files_count for m in manifests) > 0  # merged
    scanned = table.scan().to_arrow()
    assert sorted(scanned.column("_kfk_offset").to_pylist()) == list(range(80))
    assert [row["rows"] for row in duckdb_rows(table, "count(*) AS rows")] == [80]


def manifest_files(tmp_path: Path) -> list[ManifestFile]:
    """Manifests of both specs (partition summaries with bounds and nulls), as a commit lists them:
    this commit's without sequence numbers yet, older ones with theirs."""
    files = []
    for index, spec in enumerate([UNPARTITIONED, PARTITIONED, PARTITIONED, UNPARTITIONED]):
        manifest = write_manifest(
            ManifestWriterV2, tmp_path / f"m{index}.avro", spec, entries(spec)
        )
        if index % 2:
            manifest.sequence_number, manifest.min_sequence_number = 3 + index, 1 + index
            manifest[6] = (
                7_000 + index
            )  # added_snapshot_id (no setter): an older snapshot's manifest
        files.append(manifest)
    return files


def test_manifest_list_entries_encode_to_the_bytes_pyicebergs_writer_writes(tmp_path: Path) -> None:
    pyiceberg_writer = construct_writer(MANIFEST_LIST_FILE_SCHEMAS[2])
    for manifest in manifest_files(tmp_path):
        theirs = io.BytesIO()
        pyiceberg_writer.write(BinaryEncoder(theirs), manifest)
        ours = bytearray()
        assert encode_manifest_file(ours, manifest)
        assert bytes(ours) == theirs.getvalue()


def test_a_manifest_list_reads_back_like_pyicebergs_own_and_as_remembered(tmp_path: Path) -> None:
    manifests = manifest_files(tmp_path)
    io_ = PyArrowFileIO()
    lists = {}
    for name, write in (("ours", _write_manifest_list), ("theirs", write_manifest_list)):
        location = str(tmp_path / f"{name}-list.avro")
        with write(2, io_.new_output(location), 42, 41, 9, "gzip") as writer:
            writer.add_manifests(manifests)
        lists[name] = location
    read_ours, read_theirs = (
        list(read_manifest_list(io_.new_input(lists[name]))) for name in ("ours", "theirs")
    )
    assert read_ours == read_theirs and {m.sequence_number for m in read_ours} == {9, 4, 6}
    assert (
        list(written_manifest_list(lists["ours"])) == read_ours
    )  # what the next commit uses instead of reading the file
    assert written_manifest_list(lists["theirs"]) is None
    with open(lists["ours"], "rb") as mine, open(lists["theirs"], "rb") as pyicebergs:
        reader_ours, reader_theirs = fastavro.reader(mine), fastavro.reader(pyicebergs)
        assert reader_ours.metadata == reader_theirs.metadata
        assert list(reader_ours) == list(reader_theirs)

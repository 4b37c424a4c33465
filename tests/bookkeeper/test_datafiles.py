"""Data files from footers: our fast statistics equal pyiceberg's, keyed by the file's field ids."""

from __future__ import annotations

import datetime
import decimal
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
)
from pyiceberg.utils.truncate import truncate_upper_bound_text_string

from icekeeper.bookkeeper.datafiles import (
    FOOTER_READ_BYTES,
    FileTail,
    FileUnavailable,
    FooterReader,
    InvalidFile,
    _utf8_lower,
    _utf8_upper,
    describe_file,
    describe_tail,
    fetch_tail,
    footer_statistics,
    validate,
)
from icekeeper.common.moniker import FileEntry
from icekeeper.common.storage import open_filesystem
from tests.support.object_stores import storage_door

SCHEMA = Schema(
    NestedField(3, "id", LongType(), required=True),
    NestedField(5, "name", StringType(), required=False),
    NestedField(7, "amount", IntegerType(), required=False),
    NestedField(8, "price", DecimalType(10, 2), required=False),
    NestedField(9, "ratio", DoubleType(), required=False),
    NestedField(11, "at", TimestamptzType(), required=False),
)


def write(path: Path, rows: int, row_group_size: int) -> Path:
    fields = [
        pa.field("id", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"3"}),
        pa.field("name", pa.string(), metadata={b"PARQUET:field_id": b"5"}),
        pa.field("amount", pa.int32(), metadata={b"PARQUET:field_id": b"7"}),
        pa.field("price", pa.decimal128(10, 2), metadata={b"PARQUET:field_id": b"8"}),
        pa.field("ratio", pa.float64(), metadata={b"PARQUET:field_id": b"9"}),
        pa.field("at", pa.timestamp("us", tz="UTC"), metadata={b"PARQUET:field_id": b"11"}),
    ]
    base = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    data = [
        {
            "id": i,
            "name": None if i % 7 == 0 else f"customer name that is longer than sixteen {i:05d}",
            "amount": i * 3 if i % 5 else None,
            "price": decimal.Decimal(i) / 4,
            "ratio": i / 3,
            "at": base + datetime.timedelta(seconds=i),
        }
        for i in range(rows)
    ]
    pq.write_table(
        pa.Table.from_pylist(data, schema=pa.schema(fields)),
        path,
        row_group_size=row_group_size,
        compression="zstd",
    )
    return path


@pytest.mark.parametrize("row_group_size", [10_000, 97])
def test_statistics_equal_pyicebergs(tmp_path: Path, row_group_size: int) -> None:
    path = write(tmp_path / "f.parquet", 1000, row_group_size)
    metadata = pq.read_metadata(path)
    ours = footer_statistics(metadata, SCHEMA, {})
    theirs = data_file_statistics_from_parquet_metadata(
        metadata, compute_statistics_plan(SCHEMA, {}), parquet_path_to_id_mapping(SCHEMA)
    ).to_serialized_dict()
    for key in (
        "record_count",
        "column_sizes",
        "value_counts",
        "null_value_counts",
        "lower_bounds",
        "upper_bounds",
        "split_offsets",
    ):
        assert ours[key] == theirs[key], key
    assert set(ours["lower_bounds"]) == {3, 5, 7, 8, 9, 11} and ours["null_value_counts"][5] == 143


WIDE_SCHEMA = Schema(
    NestedField(1, "flag", BooleanType(), required=False),
    NestedField(2, "small", IntegerType(), required=False),
    NestedField(3, "widened", LongType(), required=False),
    NestedField(4, "big", LongType(), required=False),
    NestedField(5, "single", FloatType(), required=False),
    NestedField(6, "widened_double", DoubleType(), required=False),
    NestedField(7, "day", DateType(), required=False),
    NestedField(8, "local_at", TimestampType(), required=False),
    NestedField(9, "clock", TimeType(), required=False),
    NestedField(10, "text", StringType(), required=False),
    NestedField(11, "blob", BinaryType(), required=False),
    NestedField(12, "short_text", StringType(), required=False),
    NestedField(13, "nothing", StringType(), required=False),
    NestedField(14, "counted", StringType(), required=False),
    NestedField(15, "unmeasured", LongType(), required=False),
    NestedField(16, "millis_at", TimestamptzType(), required=False),
    NestedField(17, "price", DecimalType(20, 3), required=False),
)
"""Every Iceberg type whose bounds are read from raw Parquet values, and some that are not."""


def write_wide(path: Path, rows: int, row_group_size: int) -> Path:
    arrow_types = [
        pa.bool_(),
        pa.int32(),
        pa.int32(),
        pa.int64(),
        pa.float32(),
        pa.float32(),
        pa.date32(),
        pa.timestamp("us"),
        pa.time64("us"),
        pa.string(),
        pa.binary(),
        pa.string(),
        pa.string(),
        pa.string(),
        pa.int64(),
        pa.timestamp("ms", tz="UTC"),
        pa.decimal128(20, 3),
    ]
    fields = [
        pa.field(f.name, arrow_type, metadata={b"PARQUET:field_id": str(f.field_id).encode()})
        for f, arrow_type in zip(WIDE_SCHEMA.fields, arrow_types)
    ]
    base = datetime.datetime(2024, 1, 1)
    data = [
        {
            "flag": i % 3 == 0,
            "small": -i,
            "widened": i * 7,
            "big": 2**40 - i,
            "single": i / 8 - 3,
            "widened_double": i * 0.5,
            "day": datetime.date(2024, 1, 1) + datetime.timedelta(days=i),
            "local_at": base + datetime.timedelta(microseconds=i * 1001),
            "clock": datetime.time(12, 0, i % 60, 17),
            "text": None if i % 4 == 0 else f"ünïcödé text past sixteen chars {i:04d} \U0001f600",
            "blob": bytes([255] * 20) + bytes([i % 256]),
            "short_text": f"k{i % 10}",
            "nothing": None,
            "counted": f"c{i}",
            "unmeasured": i,
            "millis_at": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
            + datetime.timedelta(milliseconds=i),
            "price": decimal.Decimal(i) / 8,
        }
        for i in range(rows)
    ]
    pq.write_table(
        pa.Table.from_pylist(data, schema=pa.schema(fields)),
        path,
        row_group_size=row_group_size,
        compression="zstd",
    )
    return path


@pytest.mark.parametrize("row_group_size", [10_000, 41])
@pytest.mark.parametrize(
    "properties",
    [
        {},
        {"write.metadata.metrics.default": "full"},
        {
            "write.metadata.metrics.default": "truncate(4)",
            "write.metadata.metrics.column.counted": "counts",
            "write.metadata.metrics.column.unmeasured": "none",
        },
    ],
)
def test_statistics_of_every_type_equal_pyicebergs(
    tmp_path: Path, row_group_size: int, properties: dict[str, str]
) -> None:
    path = write_wide(tmp_path / "wide.parquet", 300, row_group_size)
    metadata = pq.read_metadata(path)
    ours = footer_statistics(metadata, WIDE_SCHEMA, properties)
    plan = compute_statistics_plan(WIDE_SCHEMA, properties)
    theirs = data_file_statistics_from_parquet_metadata(
        metadata, plan, parquet_path_to_id_mapping(WIDE_SCHEMA)
    ).to_serialized_dict()
    for key in (
        "record_count",
        "column_sizes",
        "value_counts",
        "null_value_counts",
        "lower_bounds",
        "upper_bounds",
        "split_offsets",
    ):
        assert ours[key] == theirs[key], key
    assert 13 not in ours["lower_bounds"] and ours["null_value_counts"][13] == 300
    # The same footer read by our parser and by pq.ParquetFile, and through describe_file.
    assert describe_file(str(path), WIDE_SCHEMA, properties).statistics == ours


def test_footers_longer_than_one_read_and_non_parquet_files(tmp_path: Path) -> None:
    wide = [
        pa.field(f"c{i}", pa.string(), metadata={b"PARQUET:field_id": str(i + 1).encode()})
        for i in range(400)
    ]
    schema = Schema(
        *(NestedField(i + 1, f"c{i}", StringType(), required=False) for i in range(400))
    )
    path = tmp_path / "wide.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [{f"c{i}": f"value {i}" * 3 for i in range(400)}], schema=pa.schema(wide)
        ),
        path,
        row_group_size=1,
    )
    assert pq.read_metadata(path).serialized_size > FOOTER_READ_BYTES
    facts = describe_file(str(path), schema, {})
    assert facts.num_rows == 1 and len(facts.statistics["lower_bounds"]) == 400
    (tmp_path / "text.parquet").write_text(
        "not parquet at all, but long enough to have a tail PAR1"
    )
    (tmp_path / "empty.parquet").write_bytes(b"")
    for name in ("text.parquet", "empty.parquet"):
        with pytest.raises(InvalidFile, match="unreadable"):
            describe_file(str(tmp_path / name), schema, {})
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2] + path.read_bytes()[-8:])
    with pytest.raises(InvalidFile, match="unreadable"):
        describe_file(str(truncated), schema, {})


def test_validation_names_what_does_not_match(tmp_path: Path) -> None:
    (tmp_path / "table" / "data").mkdir(parents=True)
    path = write(tmp_path / "table" / "data" / "f.parquet", 10, 100)
    facts = describe_file(str(path), SCHEMA, {})
    entry = FileEntry(path=f"file://{path}", size_bytes=facts.size_bytes, record_count=10)
    validate(entry, facts, f"file://{tmp_path}/table", SCHEMA)
    with pytest.raises(InvalidFile, match="size"):
        validate(
            entry.model_copy(update={"size_bytes": 1}), facts, f"file://{tmp_path}/table", SCHEMA
        )
    with pytest.raises(InvalidFile, match="rows"):
        validate(
            entry.model_copy(update={"record_count": 11}), facts, f"file://{tmp_path}/table", SCHEMA
        )
    with pytest.raises(InvalidFile, match="not under the table location"):
        validate(entry, facts, f"file://{tmp_path}/elsewhere", SCHEMA)
    outside = f"file://{tmp_path}/table/data/../../table-other/data/f.parquet"
    with pytest.raises(InvalidFile, match="names a parent folder"):
        validate(
            entry.model_copy(update={"path": outside}), facts, f"file://{tmp_path}/table", SCHEMA
        )
    with pytest.raises(InvalidFile, match="not under the table location's data folder"):
        validate(entry, facts, f"file://{tmp_path}", SCHEMA)  # under it, not under its data/
    with pytest.raises(InvalidFile, match="not in the moniker's schema"):
        validate(entry, facts, f"file://{tmp_path}/table", Schema(*SCHEMA.fields[:3]))
    with pytest.raises(FileUnavailable, match="not found") as missing:
        describe_file(f"file://{tmp_path}/missing.parquet", SCHEMA, {})
    assert missing.value.missing


def test_worker_processes_describe_files_like_the_main_process(tmp_path: Path) -> None:
    paths = [
        str(write(tmp_path / f"f{i}.parquet", 50 + i, 1000))
        for i in range(FooterReader.PROCESS_THRESHOLD + 6)
    ]
    paths.append(str(tmp_path / "missing.parquet"))
    reader = FooterReader(workers=2)
    reader.CHUNK_FILES = (
        5  # many small tasks: the workers take some even while this process takes others back
    )
    try:
        reader.start(wait=True)
        described = reader.describe(
            [(path, SCHEMA, SCHEMA.model_dump_json()) for path in paths], {}
        )
    finally:
        reader.close()
    assert reader.described_by_workers > 0
    assert list(described) == paths
    assert (
        isinstance(described[paths[-1]], FileUnavailable) and described[paths[-1]].missing
    )  # pickled back from a worker
    for path in paths[:-1]:
        assert described[path] == describe_file(path, SCHEMA, {})


def test_worker_processes_read_footers_on_every_store(store_root: str, tmp_path: Path) -> None:
    """A batch big enough for the worker processes, on each store: the workers open the files
    with the door's settings (on S3 and Azure, the endpoint and key of `catalog.properties`),
    not an unconfigured door that finds no file anywhere (`bench bookkeeper --layout s3`)."""
    from icekeeper.common.storage import write_file

    body = write(tmp_path / "one.parquet", 10, 1000).read_bytes()
    paths = [f"{store_root}/f{i}.parquet" for i in range(FooterReader.PROCESS_THRESHOLD + 6)]
    for path in paths:
        write_file(path, body)
    reader = FooterReader(workers=2)
    reader.CHUNK_FILES = 5
    try:
        reader.start(wait=True)
        described = reader.describe(
            [(path, SCHEMA, SCHEMA.model_dump_json()) for path in paths], {}
        )
    finally:
        reader.close()
    assert reader.described_by_workers > 0
    failed = {path: facts for path, facts in described.items() if isinstance(facts, Exception)}
    assert failed == {}
    assert all(facts.num_rows == 10 for facts in described.values())  # type: ignore[union-attr]


def test_a_batch_on_every_store_is_fetched_at_once_and_described_in_order(
    store_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch in this process (no workers): on an object store the files' tails are fetched by
    several threads at once (each footer is round trips there: one at a time, 10,000 footers took
    12.8 s on the S3 server), yet each path keeps its own facts or its own reason."""
    from icekeeper.bookkeeper import datafiles
    from icekeeper.common.storage import write_file

    good = write(tmp_path / "one.parquet", 10, 1000).read_bytes()
    paths = [f"{store_root}/f{i}.parquet" for i in range(40)]
    for index, path in enumerate(paths):
        write_file(path, good if index % 10 else b"x" * len(good))  # every tenth is not Parquet
    paths.insert(7, f"{store_root}/missing.parquet")
    fetching_threads: set[str] = set()
    fetch_tail = datafiles.fetch_tail

    def watched_fetch(path: str, size: int | None = None):
        fetching_threads.add(threading.current_thread().name)
        time.sleep(0.01)  # a slow store: overlapping fetches show as several threads
        return fetch_tail(path, size)

    monkeypatch.setattr(datafiles, "fetch_tail", watched_fetch)
    reader = FooterReader(workers=1)
    described = reader.describe(
        [(path, SCHEMA, SCHEMA.model_dump_json()) for path in paths],
        {},
        {path: len(good) for path in paths},  # as monikers declare them (on S3: one request)
    )
    assert list(described) == paths
    missing = described[paths[7]]
    assert isinstance(missing, FileUnavailable) and missing.missing
    invalid = [path for path in paths if isinstance(described[path], InvalidFile)]
    assert invalid == [f"{store_root}/f{i}.parquet" for i in range(0, 40, 10)]
    assert all(
        described[path].num_rows == 10  # type: ignore[union-attr]
        for path in paths
        if path != paths[7] and path not in invalid
    )
    if store_root.startswith("/"):
        assert fetching_threads == {threading.current_thread().name}  # local disk: no threads
    else:
        assert len(fetching_threads) > 1


def test_a_dead_worker_costs_only_time(tmp_path: Path) -> None:
    """Files of a batch whose worker died are read
    in-process; the next big batch has new workers."""
    paths = [
        str(write(tmp_path / f"f{i}.parquet", 10, 1000))
        for i in range(FooterReader.PROCESS_THRESHOLD + 6)
    ]
    requests = [(path, SCHEMA, SCHEMA.model_dump_json()) for path in paths]
    reader = FooterReader(workers=2)
    reader.CHUNK_FILES = 5
    try:
        reader.start(wait=True)
        os.kill(next(iter(reader._pool._processes)), signal.SIGKILL)  # type: ignore[union-attr]
        described = reader.describe(requests, {})
        assert all(facts.num_rows == 10 for facts in described.values())  # type: ignore[union-attr]
        reader.start(wait=True)
        assert reader.describe(requests, {}) == described and reader.described_by_workers > 0
    finally:
        reader.close()


def test_a_cold_pool_does_not_delay_a_batch(tmp_path: Path) -> None:
    """A big batch starts the workers but does not wait for them: this process reads what it can."""
    paths = [
        str(write(tmp_path / f"f{i}.parquet", 10, 1000))
        for i in range(FooterReader.PROCESS_THRESHOLD)
    ]
    reader = FooterReader(workers=2)
    reader.START_THRESHOLD = len(paths)
    try:
        described = reader.describe(
            [(path, SCHEMA, SCHEMA.model_dump_json()) for path in paths], {}
        )
        assert reader._starter is not None  # started for the next batches
    finally:
        reader.close()
    assert all(
        not isinstance(facts, InvalidFile) and facts.num_rows == 10 for facts in described.values()
    )


@pytest.mark.parametrize(
    "text",
    [
        "short",
        "exactly sixteen!",
        "seventeen chars!!",
        "ünïcödé ünïcödé ünï",
        "abcdefghijklmno\U0010ffffxyz",
        "abcdefghijklmn\U0010ffff\U0010ffffxyz",
        "\U0010ffff" * 20,
        "€" * 17,
        "abcdefghijklmno\U0001f600z",
    ],
)
def test_string_upper_bounds_equal_pyicebergs(text: str) -> None:
    theirs = truncate_upper_bound_text_string(text, 16)
    assert _utf8_upper(16)(text.encode()) == (theirs.encode() if theirs is not None else None)
    assert _utf8_lower(16)(text.encode()) == text[:16].encode()


def test_storage_errors_are_unavailable_and_damaged_bytes_are_invalid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only what storage served decides that a file is
    broken; failing to serve it decides nothing."""
    good = write(tmp_path / "good.parquet", 10, 100).read_bytes()
    not_parquet = tmp_path / "not.parquet"
    not_parquet.write_bytes(b"x" * len(good))
    with pytest.raises(InvalidFile, match="unreadable"):
        describe_file(str(not_parquet), SCHEMA, {})
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(good[: len(good) // 2])
    with pytest.raises(InvalidFile, match="unreadable"):
        describe_file(str(truncated), SCHEMA, {})
    (tmp_path / "folder.parquet").mkdir()
    with pytest.raises(InvalidFile, match="not a file"):
        describe_file(str(tmp_path / "folder.parquet"), SCHEMA, {})
    # An object store that does not answer (nothing
    # listens on port 1): a network error, not a verdict.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(FileUnavailable, match="storage error") as unavailable:
        describe_file(
            "s3://bucket/table/data/f.parquet?endpoint_override=127.0.0.1:1&scheme=http&region=us-east-1",
            SCHEMA,
            {},
        )
    assert not unavailable.value.missing


def test_a_file_gone_between_its_fetch_and_its_parse_is_missing_not_invalid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tail that is not plain Parquet is handed to `ParquetFile`, which opens the file again:
    failing to open it is the storage's doing (here: deleted meanwhile), never a verdict that
    would dead-letter the moniker."""
    short = tmp_path / "short.parquet"
    short.write_bytes(b"PAR1")  # too short for a Parquet tail: parsed by ParquetFile
    tail = fetch_tail(str(short))
    assert not isinstance(tail, Exception) and tail.footer is None
    with pytest.raises(InvalidFile, match="unreadable"):
        describe_tail(tail, SCHEMA, {})
    short.unlink()
    with pytest.raises(FileUnavailable, match="not found") as missing:
        describe_tail(tail, SCHEMA, {})
    assert missing.value.missing
    # An object store that stopped answering (nothing listens on port 1) when it is opened again.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    unreachable = (
        "s3://bucket/t/data/f.parquet?endpoint_override=127.0.0.1:1&scheme=http&region=us-east-1"
    )
    with pytest.raises(FileUnavailable, match="storage error") as unavailable:
        describe_tail(FileTail(unreachable, 4, None), SCHEMA, {})
    assert not unavailable.value.missing


def test_a_batch_holds_only_its_footers_not_the_tails_read_for_them(tmp_path: Path) -> None:
    """A file's tail is read 64 KiB at a time; its footer is a few KB of that. A batch's files are
    fetched before they are parsed, so each footer must not keep its whole read alive (10,000
    files would hold 640 MB: a bookkeeper killed for memory picks the same batch again)."""
    import tracemalloc

    body = write(tmp_path / "big.parquet", 20_000, 20_000).read_bytes()
    assert len(body) > FOOTER_READ_BYTES
    paths = []
    for index in range(300):
        path = tmp_path / f"f{index}.parquet"
        path.write_bytes(body)
        paths.append(str(path))
    reader = FooterReader(workers=1)
    tracemalloc.start()
    try:
        described = reader.describe(
            [(path, SCHEMA, SCHEMA.model_dump_json()) for path in paths], {}
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(facts.num_rows == 20_000 for facts in described.values())  # type: ignore[union-attr]
    assert peak < 300 * FOOTER_READ_BYTES / 4, peak  # the whole reads: 19.7 MB


def test_a_bucket_named_as_a_file_is_invalid_at_once(s3_storage) -> None:
    """On S3 the object's size comes from opening it (no HEAD before): a bucket opens as a
    storage error, which is retried for ever and would hold the writer's later monikers."""
    with storage_door(s3_storage.pyiceberg_properties()):
        bucket = s3_storage.uri().rstrip("/")
        for path in (bucket, bucket + "/"):
            with pytest.raises(InvalidFile, match="not a file"):
                describe_file(path, SCHEMA, {})
        with pytest.raises(FileUnavailable, match="not found") as missing:
            describe_file(s3_storage.uri("no/such/file.parquet"), SCHEMA, {})
        assert missing.value.missing


def test_a_footer_on_s3_with_its_declared_size_is_one_request_and_a_wrong_size_changes_nothing(
    s3_storage, tmp_path: Path
) -> None:
    """With the size the moniker declares, a footer on S3 is read without the HEAD (one GET, the
    fragment path, `FileTail.metadata` set). Whatever the declared size says, the facts are the
    file's own: a size too small or too large, a damaged footer or a missing file go the usual
    way, so `validate` still refuses a moniker whose size is wrong and nothing waits for ever."""
    body = write(tmp_path / "f.parquet", 500, 97).read_bytes()
    damaged = bytearray(body)
    footer_start = len(damaged) - 8 - int.from_bytes(damaged[-8:-4], "little")
    damaged[footer_start + 5 : footer_start + 25] = b"\xff" * 20
    with storage_door(s3_storage.pyiceberg_properties()):
        run = uuid.uuid4().hex[:8]
        table = s3_storage.uri(f"sized/{run}")
        good, broken = f"{table}/data/f.parquet", f"{table}/data/d.parquet"
        for uri, data in ((good, body), (broken, bytes(damaged))):
            filesystem, key = open_filesystem(uri)
            with filesystem.open_output_stream(key) as out:
                out.write(data)
        usual = describe_file(good, SCHEMA, {})
        assert usual.size_bytes == len(body) and usual.num_rows == 500

        sized = fetch_tail(good, len(body))
        assert isinstance(sized, FileTail) and sized.metadata is not None  # one request
        assert describe_tail(sized, SCHEMA, {}) == usual
        entry = FileEntry(path=good, size_bytes=len(body), record_count=500)
        assert FooterReader(workers=1).describe(
            [(good, SCHEMA, SCHEMA.model_dump_json())], {}, {good: len(body)}
        ) == {good: usual}

        for wrong in (len(body) - 100, len(body) + 100, len(body) * 3, 12, 5, 0, 2**63, 2**70):
            tail = fetch_tail(good, wrong)
            assert isinstance(tail, FileTail) and tail.metadata is None, wrong  # the usual read
            facts = describe_tail(tail, SCHEMA, {})
            assert facts == usual, wrong
            with pytest.raises(InvalidFile, match="moniker says"):
                validate(
                    entry.model_copy(update={"size_bytes": wrong}),
                    facts,
                    table,
                    SCHEMA,
                )
        with pytest.raises(InvalidFile, match="unreadable"):
            describe_tail(fetch_tail(broken, len(damaged)), SCHEMA, {})  # type: ignore[arg-type]
        missing = fetch_tail(f"{table}/data/none.parquet", len(body))
        assert isinstance(missing, FileUnavailable) and missing.missing


def test_a_batch_on_an_object_store_keeps_few_footers_fetched_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fetching runs ahead of describing by at most `FETCH_AHEAD` files, whatever the batch's
    size: a fetched footer (parsed, when its size was declared: ~8x its bytes) stays in memory
    until it is described, and a whole window of 512 wide-table footers held 1.4 GB."""
    from icekeeper.bookkeeper import datafiles

    counts = {"fetched": 0, "described": 0, "most_ahead": 0}
    lock = threading.Lock()

    def fetch(path: str, size: int | None = None) -> InvalidFile:
        with lock:
            counts["fetched"] += 1
        return InvalidFile(path)

    def describe(tail, schema, properties):
        time.sleep(0.0005)  # describing is the slower half: fetches pile up if they may
        with lock:
            counts["most_ahead"] = max(
                counts["most_ahead"], counts["fetched"] - counts["described"]
            )
            counts["described"] += 1
        return tail

    monkeypatch.setattr(datafiles, "fetch_tail", fetch)
    monkeypatch.setattr(datafiles, "_describe_or_reason", describe)
    paths = [f"s3://bucket/t/data/f{index:04d}.parquet" for index in range(1500)]
    described = FooterReader(workers=1).describe(
        [(path, SCHEMA, SCHEMA.model_dump_json()) for path in paths], {}
    )
    assert [str(reason) for reason in described.values()] == paths  # in order, every one
    assert counts["fetched"] == counts["described"] == 1500
    assert counts["most_ahead"] <= 65, counts  # 64 fetched ahead and the one being described


@pytest.mark.integration
def test_the_bookkeeper_on_s3_reads_footers_at_their_declared_size_and_quarantines_wrong_ones(
    tmp_path: Path, s3_storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the bookkeeper's own cycle: every file of the monikers is read with the size its
    moniker declares (one request on S3), and a moniker whose declared size is wrong (too small,
    too large, larger than any C integer) is quarantined with the reason, as before the sizes
    reached the footer reader; the other writers' monikers commit."""
    from icekeeper.bookkeeper import datafiles
    from icekeeper.bookkeeper.service import Bookkeeper
    from icekeeper.common.catalog import open_catalog
    from icekeeper.common.transports import open_transport
    from tests.bookkeeper.test_fencing import s3_bookkeeper_config
    from tests.support.shop_items import make_moniker

    config = s3_bookkeeper_config(tmp_path, s3_storage)
    open_catalog(config)  # configures this process's storage door as the bookkeeper's is
    sized: list[tuple[str, int]] = []
    fetch_sized = datafiles._fetch_sized_footer

    def counting(path: str, local: str, filesystem, size: int):
        sized.append((path, size))
        return fetch_sized(path, local, filesystem, size)

    monkeypatch.setattr(datafiles, "_fetch_sized_footer", counting)
    transport = open_transport(config)
    good = [
        make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 10, seq * 10), files=2)
        for seq in (1, 2)
    ]
    wrong = {}
    for index, delta in enumerate((-50, 50, 2**63)):
        moniker = make_moniker(
            config, 1, None, (0, 10), writer_id=f"bad{index}", partition=index + 1
        )
        entry = moniker.files[0]
        declared = entry.size_bytes + delta if delta < 2**63 else delta
        files = [entry.model_copy(update={"size_bytes": declared})]
        wrong[f"bad{index}"] = moniker.model_copy(update={"files": files})
    for moniker in [*good, *wrong.values()]:
        transport.publish(moniker)
    bookkeeper = Bookkeeper(config)
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 2, report
    quarantined = {
        delivery.moniker.writer_id: reason for delivery, reason in report.tables[0].quarantined
    }
    # A moniker declaring more bytes than a commit takes waits for a cycle of its own.
    for _ in range(3):
        if transport.pending():
            later = bookkeeper.run_cycle().tables[0].quarantined
            quarantined.update((delivery.moniker.writer_id, reason) for delivery, reason in later)
    assert set(quarantined) == set(wrong)
    assert all("moniker says" in reason for reason in quarantined.values()), quarantined
    declared = {
        (entry.path, entry.size_bytes) for m in [*good, *wrong.values()] for entry in m.files
    }
    assert set(sized) == declared  # every file, at the size its moniker declares


_DESCRIBE_DAMAGED = """
import sys
import threading
import time
from pyiceberg.schema import Schema
from icekeeper.bookkeeper.datafiles import FooterReader, InvalidFile
SCHEMA = Schema.model_validate_json(sys.argv[1])
paths = sys.argv[2:]
reader = FooterReader(workers=2)
reader.CHUNK_FILES = 5
try:
    alone = reader.describe([(paths[0], SCHEMA, SCHEMA.model_dump_json())], {})  # in this process
    reader.start(wait=True)
    # workers too
    batch = reader.describe([(path, SCHEMA, SCHEMA.model_dump_json()) for path in paths], {})
finally:
    reader.close()
print(type(alone[paths[0]]).__name__,
      sum(isinstance(facts, InvalidFile) for facts in batch.values()),
      sum(getattr(facts, "num_rows", 0) == 10 for facts in batch.values()))
"""


def test_a_damaged_footer_is_an_invalid_file_not_a_crash(tmp_path: Path) -> None:
    """A file whose Parquet tail is intact but whose footer thrift is damaged: pyarrow's fast
    footer parser aborts the process on it (std::terminate), so the bookkeeper would crash-loop."""
    damaged = write(tmp_path / "damaged.parquet", 10, 1000)
    data = bytearray(damaged.read_bytes())
    footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    data[footer_start + 5 : footer_start + 25] = b"\xff" * 20
    damaged.write_bytes(bytes(data))
    paths = [str(damaged)] + [
        str(write(tmp_path / f"f{i}.parquet", 10, 1000))
        for i in range(FooterReader.PROCESS_THRESHOLD + 6)
    ]
    run = subprocess.run(
        [sys.executable, "-c", _DESCRIBE_DAMAGED, SCHEMA.model_dump_json(), *paths],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["InvalidFile", "1", str(len(paths) - 1)]

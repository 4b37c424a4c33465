"""`icekeeper bench bookkeeper`: commit speed, footer reading, and commit latency as history grows.

Files are seed-000-like (the flattened `tbl_test_1` schema with metadata columns, 100 rows each),
written with pyarrow and Iceberg field ids, as a writer would leave them. Measured on a local
SQLite catalog and warehouse (`--layout local`, the default), or with the tables on the stack's S3
server (`--layout s3`: the same SQLite catalog, every file over HTTP) or on S3 behind Iceberg's
REST catalog server (`--layout s3-rest`); see `layouts.py`:

- `commit_1000_monikers_s`: one bookkeeper cycle committing 1,000 monikers of one file each
  (footers read), median of three fresh tables;
- `baseline_add_files_1000_s`: the same 1,000 files through pyiceberg's `add_files`;
- `footers_10000_s`: 10,000 footers read and their statistics computed (a fresh footer reader,
  so starting its worker processes counts); `data_files_10000_s`: the same, plus turning them
  into Iceberg data files;
- `commit_ms_at_10` / `commit_ms_at_N`: median commit latency of the 100 commits from the 10th
  on and of the last 100 of N single-moniker commits (N = 10,000 by default), and their ratio;
  `commit_p90_ms_*` the 90th percentiles of the same windows; `cycle_cpu_ms_at_10` /
  `cycle_cpu_ms_at_N`: the same windows in CPU time of this process, less sensitive to other
  work on the machine than wall-clock latency.
- `commit_<N>_monikers_*` and `footers_<N>_*` (`server_cpu.py`): for the median 1,000-moniker
  run and for the footers, the wall seconds, the busy CPU seconds of the whole machine
  (`machine_busy_cpu_s`, of `cores` cores) and of each stack server the layout runs
  (`s3_server_cpu_s`: s3proxy answering the GETs on the same cores);
- on S3, `small_write_one_put_ms` / `small_write_multipart_ms`: a 6 KB file (a manifest, a
  moniker) written in one PUT, as the storage door and a REST catalog's FileIO write them, and as
  pyarrow writes it by default (a multipart upload of three requests), taking turns.

  Windows of 100, not a handful of commits: merge-append lets a table's manifest list grow to
  `commit.manifest.min-count-to-merge` (100) manifests and then merges them, so a commit's cost
  follows that 100-commit cycle. Ten commits around the 10th see only its shortest lists, while
  ten at the end land anywhere in the cycle; a whole cycle at each end compares like with like.

Each phase (the three 1,000-moniker runs, the `add_files` baseline, the footers, the latency
curve) has a table of its own; on an object store the files are written (untimed) by a pool of
threads, and what the run left there is removed at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema

from icekeeper.bench.layouts import (
    LAYOUT_SERVICES,
    BenchLayout,
    open_layout,
    remove_layout_files,
)
from icekeeper.bench.server_cpu import PhaseCpu, ServerCpu
from icekeeper.bench.work import fresh_work_folder
from icekeeper.bookkeeper.datafiles import FooterReader, data_file
from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.config import IcekeeperConfig, load_config
from icekeeper.common.moniker import FileEntry, Moniker, OffsetRange, moniker_id
from icekeeper.common.schema import assign_ids, metadata_columns, record_types, row_columns
from icekeeper.common.storage import configure_storage
from icekeeper.common.transports import open_transport
from icekeeper.samples import seed000

Progress = Callable[[str], None]
TABLE = "bench.tbl_test_1"
ROWS_PER_FILE = 100


def seed_schema(config: IcekeeperConfig) -> Schema:
    from icekeeper.common.schema import envelope_shape, resolve_named_types

    shape = envelope_shape(resolve_named_types(seed000.SCHEMA_VERSIONS[4].value_schema()))
    columns = metadata_columns(
        config.metadata_columns, True, record_types(shape.source), record_types(shape.transaction)
    ) + row_columns(shape, ["ID1", "ID2"])
    return assign_ids(columns, None, ["ID1", "ID2"])


_ARROW = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "timestamp": pa.timestamp("us"),
}


def _wall_clock_us(millis: int) -> int:
    """A DATETIME column as the writer stores it:
    Debezium's millis as an Iceberg timestamp (micros)."""
    return millis * 1000


def write_seed_file(path: Path | str, schema: Schema, first_offset: int) -> FileEntry:
    """A seed-like file of `ROWS_PER_FILE` rows at `path`: a local path, or a URI on an object
    store (written through the storage door, as a writer writes it)."""
    fields = [
        pa.field(
            f.name,
            _ARROW[str(f.field_type)],
            nullable=not f.required,
            metadata={b"PARQUET:field_id": str(f.field_id).encode()},
        )
        for f in schema.fields
    ]
    columns: dict[str, list] = {f.name: [] for f in schema.fields}
    for offset in range(first_offset, first_offset + ROWS_PER_FILE):
        row = {
            "_src_name": "test",
            "_src_db": "db_gb18030_test",
            "_src_table": "tbl_test_1",
            "_src_ts_ms": 1646297167000 + offset,
            "_src_server_id": 1,
            "_src_file": "mysql-bin.000021",
            "_src_pos": 46951 + offset,
            "_src_op": "u",
            "_src_ts_ms_r": 1646297167652 + offset,
            "_tsc_id": f"e45b718e-906f-11ec-89e3-0242c0a8640a:{offset}",
            "_tsc_total_order": 1,
            "_tsc_data_collection_order": 1,
            "_kfk_topic": "test.db_gb18030_test.tbl_test_1",
            "_kfk_partition": 0,
            "_kfk_offset": offset,
            "_kfk_timestamp": 1646297167000000 + offset,
            "ID1": 1000 + offset % 5000,
            "ID2": "A",
            "C1": f"V{offset % 97}-1",
            "C2": 5000 + offset % 1000,
            "C6": None,
            "C5": f"S4-{offset % 1000}",
            "C4": 4000 + offset % 13,
            "C3": None,
            "CREATE_TIME": _wall_clock_us(1646101923000),
            "UPDATE_TIME": _wall_clock_us(1646296793000 + offset),
        }
        for name in columns:
            columns[name].append(row.get(name))
    table = pa.Table.from_pydict(columns, schema=pa.schema(fields))
    if "://" in str(path) and not str(path).startswith("file://"):
        from icekeeper.common.storage import write_file

        buffer = pa.BufferOutputStream()
        pq.write_table(table, buffer, compression="zstd")
        body = buffer.getvalue().to_pybytes()
        write_file(str(path), body)
        return FileEntry(path=str(path), size_bytes=len(body), record_count=ROWS_PER_FILE)
    path = Path(str(path).removeprefix("file://"))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="zstd")
    return FileEntry(
        path="file://" + str(path), size_bytes=path.stat().st_size, record_count=ROWS_PER_FILE
    )


WRITE_THREADS = 16
"""Threads writing the bench's files (untimed): on an object store each file is a PUT."""


def write_seed_files(requests: Iterable[tuple[Path | str, int]], schema: Schema) -> list[FileEntry]:
    """`write_seed_file` for each (path, first offset), several at once, in the order given."""
    with ThreadPoolExecutor(WRITE_THREADS) as pool:
        return list(pool.map(lambda job: write_seed_file(job[0], schema, job[1]), requests))


def bench_config(
    state_dir: Path, layout: BenchLayout | None = None, table: str = TABLE
) -> IcekeeperConfig:
    """The bench's bookkeeper config: state under `state_dir`; the catalog (and warehouse) of
    `layout` and, on an object store, its transaction log there too; or by default a SQLite
    catalog, a warehouse and the transaction log under `state_dir`."""
    tables = [{"identifier": table, "topics": ["bench"], "primary_key": ["ID1", "ID2"]}]
    environ = {
        "ICEKEEPER__STATE_DIR": str(state_dir),
        "ICEKEEPER__TABLES": json.dumps([{**tables[0], "mode": "changelog"}]),
        "ICEKEEPER__SOURCES__0__TOPICS": "[bench]",
        "ICEKEEPER__BOOKKEEPER__HTTP_PORT": "0",
        "ICEKEEPER__BOOKKEEPER__MAX_FILES_PER_COMMIT": "100000",
    }
    if layout is not None:
        environ["ICEKEEPER__CATALOG__PROPERTIES"] = json.dumps(layout.catalog_properties)
        environ.update(layout.transport_settings(state_dir.name))
    return load_config(None, environ=environ)


def phase_config(work: Path, layout: BenchLayout, phase: str) -> IcekeeperConfig:
    """The config of one phase of the bench, with a table of its own: on `local`, a catalog and
    warehouse of its own under `work/<phase>` (as before layouts); on the others, the layout's
    catalog with the table `<namespace>.tbl_<phase>`."""
    if layout.name == "local":
        return bench_config(work / phase)
    return bench_config(work / phase, layout, f"{layout.namespace}.tbl_{phase.replace('-', '_')}")


def table_location(config: IcekeeperConfig) -> str:
    """Where the bench's table goes: `<warehouse>/<namespace>/<table>`."""
    identifier = config.tables[0].identifier
    return config.catalog.properties["warehouse"].rstrip("/") + "/" + identifier.replace(".", "/")


def bench_monikers(
    config: IcekeeperConfig, schema: Schema, count: int, start_seq: int = 1
) -> list[Moniker]:
    location = table_location(config)
    identifier = config.tables[0].identifier
    schema_json = json.loads(schema.model_dump_json())
    seqs = range(start_seq, start_seq + count)
    entries = write_seed_files(
        [
            (
                f"{location.removeprefix('file://')}/data/bench/"
                f"{seq:08d}-{uuid.uuid4().hex[:8]}.parquet",
                (seq - 1) * ROWS_PER_FILE,
            )
            for seq in seqs
        ],
        schema,
    )
    monikers = []
    for seq, entry in zip(seqs, entries):
        offset = (seq - 1) * ROWS_PER_FILE
        ranges = [
            OffsetRange(
                topic="bench", partition=0, from_offset=offset, until_offset=offset + ROWS_PER_FILE
            )
        ]
        event_ms = 1646297167000 + offset
        monikers.append(
            bench_moniker(
                identifier, location, schema_json, entry, seq, ranges, event_ms, ROWS_PER_FILE
            )
        )
    return monikers


def bench_moniker(
    identifier: str,
    location: str,
    schema_json: dict,
    entry: FileEntry,
    seq: int,
    ranges: list[OffsetRange],
    first_event_ms: int,
    event_span_ms: int,
) -> Moniker:
    """Moniker `seq` of the benches' one writer (`bench`, chained on `seq - 1`): one file of
    `ROWS_PER_FILE` rows covering `ranges`."""
    return Moniker(
        id=moniker_id("bench", identifier, ranges),
        rereads_refused=True,
        writer_id="bench",
        seq=seq,
        prev_seq=seq - 1 if seq > 1 else None,
        table=identifier,
        table_location=location,
        schema=schema_json,
        files=[entry],
        offsets=ranges,
        records=ROWS_PER_FILE,
        min_event_time_ms=first_event_ms,
        max_event_time_ms=first_event_ms + event_span_ms,
    )


def bench_commit_1000(
    work: Path,
    progress: Progress,
    layout: BenchLayout,
    monikers: int = 1000,
    meter: ServerCpu | None = None,
) -> tuple[float, float, PhaseCpu]:
    """Seconds for one cycle committing `monikers` monikers (median of three fresh tables), and
    for pyiceberg's `add_files` of the first run's files into another table; what the machine
    and the stack's servers spent in the median run (`meter`)."""
    from icekeeper.common.catalog import open_catalog

    meter = meter or ServerCpu({})
    timings, phases, baseline = [], [], float("nan")
    for run in range(3):
        config = phase_config(work, layout, f"commit-{run}")
        schema = seed_schema(config)
        transport = open_transport(config)
        published = bench_monikers(config, schema, monikers)
        for moniker in published:
            transport.publish(moniker)
        bookkeeper = Bookkeeper(config)
        started = time.monotonic()
        with meter.phase() as phase:
            report = bookkeeper.run_cycle()
        timings.append(time.monotonic() - started)
        phases.append(phase)
        bookkeeper.committer.footer_reader.close()
        assert report.committed_monikers == monikers, report
        if run == 0:
            files = sorted(entry.path for moniker in published for entry in moniker.files)
            baseline_config = phase_config(work, layout, "add-files")
            catalog = open_catalog(baseline_config)
            identifier = baseline_config.tables[0].identifier
            catalog.create_namespace_if_not_exists(identifier.rsplit(".", 1)[0])
            table = catalog.create_table(
                identifier, schema=schema, location=table_location(baseline_config)
            )
            started = time.monotonic()
            table.add_files(files)
            baseline = time.monotonic() - started
        progress(f"commit of {monikers:,} monikers: run {run + 1}: {timings[-1]:.2f}s")
    median_run = sorted(range(len(timings)), key=timings.__getitem__)[len(timings) // 2]
    return statistics.median(timings), baseline, phases[median_run]


def bench_footers(
    work: Path, count: int, progress: Progress, layout: BenchLayout, meter: ServerCpu | None = None
) -> tuple[float, float, int, PhaseCpu]:
    """Seconds to read `count` footers with a fresh reader, and to also turn them into data
    files; how many of them its worker processes read (the rest this process did); what the
    machine and the stack's servers spent reading them (`meter`)."""
    config = phase_config(work, layout, "footers")
    schema = seed_schema(config)
    folder = layout.location("footers") if layout.on_object_store else str(work / "footers")
    entries = write_seed_files(
        [(f"{folder}/files/{index:06d}.parquet", index * ROWS_PER_FILE) for index in range(count)],
        schema,
    )
    progress(f"reading {count:,} footers")
    started = time.monotonic()
    with (meter or ServerCpu({})).phase() as phase:
        reader = FooterReader(os.cpu_count() or 2)
        schema_json = schema.model_dump_json()
        described = reader.describe(
            [(entry.path, schema, schema_json) for entry in entries],
            {},
            {entry.path: entry.size_bytes for entry in entries},  # as the monikers declare them
        )
    footers_s = time.monotonic() - started
    failed = [facts for facts in described.values() if isinstance(facts, Exception)]
    assert not failed, failed[:1]
    spec = PartitionSpec()
    data_files = [data_file(entry, described[entry.path], spec) for entry in entries]  # type: ignore[arg-type]
    data_files_s = time.monotonic() - started
    by_workers = reader.described_by_workers
    reader.close()
    assert len(data_files) == count
    return footers_s, data_files_s, by_workers, phase


WINDOW = 100


def bench_latency(
    work: Path, commits: int, progress: Progress, layout: BenchLayout
) -> dict[str, Any]:
    """Commit latency (median, p90) and cycle CPU time (median) over the 100 commits from the
    10th on and over the last 100 commits; where the table's metadata went, and the catalog's
    class (what the layout gave)."""
    config = phase_config(work, layout, "latency")
    schema = seed_schema(config)
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    latencies, cpu_times = [], []
    for seq in range(1, commits + 1):
        transport.publish(bench_monikers(config, schema, 1, start_seq=seq)[0])
        cpu_started = time.process_time()
        report = bookkeeper.run_cycle()
        cpu_times.append(time.process_time() - cpu_started)
        latencies.append(report.tables[0].seconds)
        if seq % 1000 == 0:
            progress(
                f"  {seq:,} commits, latest median "
                f"{statistics.median(latencies[-WINDOW:]) * 1000:.0f} ms"
            )
    bookkeeper.committer.footer_reader.close()
    from icekeeper.common.catalog import open_catalog

    catalog = open_catalog(config)
    metadata_location = catalog.load_table(config.tables[0].identifier).metadata_location
    early, late = slice(9, 9 + WINDOW), slice(-WINDOW, None)
    p90 = lambda values: statistics.quantiles(values, n=10)[-1]  # noqa: E731
    return {
        "metadata_location": metadata_location,
        "txlog_uri": config.transport.uri,
        "catalog_class": type(catalog).__name__,
        "at_10": statistics.median(latencies[early]) * 1000,
        "at_end": statistics.median(latencies[late]) * 1000,
        "p90_at_10": p90(latencies[early]) * 1000,
        "p90_at_end": p90(latencies[late]) * 1000,
        "cpu_at_10": statistics.median(cpu_times[early]) * 1000,
        "cpu_at_end": statistics.median(cpu_times[late]) * 1000,
    }


def run_bookkeeper_bench(
    state_dir: str,
    commits: int = 10_000,
    footers: int = 10_000,
    progress: Progress = print,
    layout: str = "local",
    stack_config: IcekeeperConfig | None = None,
    monikers: int = 1000,
) -> dict[str, Any]:
    """The figures above on one layout (`layouts.py`; `stack_config`: the stack whose S3 server
    and REST catalog the `s3` and `s3-rest` layouts use, running)."""
    work = fresh_work_folder(state_dir, "bench-bookkeeper")
    if stack_config is None:
        stack_config = load_config(None, environ={"ICEKEEPER__STATE_DIR": state_dir})
    where = open_layout(layout, stack_config, work)
    # The bench writes its files before any bookkeeper opens the catalog (which would do this).
    configure_storage(where.catalog_properties)
    progress(f"layout {layout}: tables under {where.root}")
    meter = ServerCpu.of_stack(stack_config, LAYOUT_SERVICES[layout])
    try:
        commit_s, baseline_s, commit_cpu = bench_commit_1000(work, progress, where, monikers, meter)
        footers_s, data_files_s, by_workers, footers_cpu = bench_footers(
            work, footers, progress, where, meter
        )
        progress(f"{footers:,} footers in {footers_s:.2f}s; now {commits:,} single-moniker commits")
        latency = bench_latency(work, commits, progress, where)
        on_store, small_writes = None, {}
        if where.on_object_store:
            small_writes = bench_small_writes(where.root)
            from icekeeper.common.storage import list_files

            listed = list_files(where.root, recursive=True)
            on_store = sum(1 for info in listed if info.path.endswith(".parquet"))
    finally:
        remove_layout_files(where)
        shutil.rmtree(work, ignore_errors=True)
    return {
        "layout": layout,
        "root": where.root,
        "catalog_class": latency["catalog_class"],
        "metadata_location": latency["metadata_location"],
        "txlog_uri": latency["txlog_uri"],
        "data_files_on_store": on_store,
        f"commit_{monikers}_monikers_s": round(commit_s, 3),
        f"baseline_add_files_{monikers}_s": round(baseline_s, 3),
        "ratio_vs_add_files": round(baseline_s / commit_s, 2),
        f"footers_{footers}_s": round(footers_s, 3),
        f"data_files_{footers}_s": round(data_files_s, 3),
        "footers_read_by_workers": by_workers,
        "commit_ms_at_10": round(latency["at_10"], 1),
        f"commit_ms_at_{commits}": round(latency["at_end"], 1),
        "latency_growth_ratio": round(latency["at_end"] / latency["at_10"], 2),
        "commit_p90_ms_at_10": round(latency["p90_at_10"], 1),
        f"commit_p90_ms_at_{commits}": round(latency["p90_at_end"], 1),
        "cycle_cpu_ms_at_10": round(latency["cpu_at_10"], 1),
        f"cycle_cpu_ms_at_{commits}": round(latency["cpu_at_end"], 1),
        "cpu_growth_ratio": round(latency["cpu_at_end"] / latency["cpu_at_10"], 2),
        **commit_cpu.figures(f"commit_{monikers}_monikers"),
        **footers_cpu.figures(f"footers_{footers}"),
        **small_writes,
    }


def bench_small_writes(root: str, count: int = 200, size: int = 6_000) -> dict[str, float]:
    """`count` files of `size` bytes (a manifest's, a moniker's) written to an S3 root by the
    door's filesystem (one PUT each, `allow_delayed_open`) and by the same filesystem without
    that option (a multipart upload: start, part, complete), taking turns; medians in ms."""
    import pyarrow.fs as pafs

    from icekeeper.common.internals import s3_filesystem_with_delayed_open
    from icekeeper.common.storage import open_filesystem

    one_put, folder = open_filesystem(f"{root}/small-writes")
    if not isinstance(one_put, pafs.S3FileSystem):
        return {}
    sides = {
        "one_put": one_put,
        "multipart": s3_filesystem_with_delayed_open(one_put, delayed=False),
    }
    body = os.urandom(size)
    timings: dict[str, list[float]] = {name: [] for name in sides}
    for index in range(count):
        for name, filesystem in sides.items() if index % 2 else reversed(sides.items()):
            started = time.perf_counter()
            with filesystem.open_output_stream(f"{folder}/{name}-{index}.avro") as out:
                out.write(body)
            timings[name].append((time.perf_counter() - started) * 1000)
    return {
        f"small_write_{name}_ms": round(statistics.median(values), 2)
        for name, values in timings.items()
    }

"""`icekeeper bench commit-history`: commits at one a second at the end of an hour of history
(issue 28's third figure), without waiting an hour.

The bookkeeper keeps `bookkeeper.keep_snapshots_for` (1 h) of snapshots: at one commit a second
3,600 of them, all in the metadata file every commit rewrites. Each snapshot's summary names its
commit; the committed offsets (and event times) of every partition the table covers are in one
table property, once per metadata file (`common/committed_state.py`; until then each summary
carried them: 3.7 KB a snapshot for 64 partitions, of which 2.8 KB offsets). This bench
builds that history on one layout (by default the stack's S3 server behind its REST catalog,
`layouts.py`) for a topic of `partitions` partitions, then times `measured` commits at one a
second, as they come at the hour's end:

1. Every file is written first (untimed; seed-like files of 100 rows, as `bench bookkeeper`),
   then `history` single-moniker commits, one per second of `keep_snapshots_for`. Each moniker
   covers a range of every partition (a writer's batch of the whole topic), starting at offset
   10^9 (a topic that has run a while: offsets have ten digits), so from the first commit on
   every summary carries `partitions` offsets.
2. Expiry depends on the snapshots' ages, so the oldest part of the history is committed at one
   a second, as it would have been (`paced`: the snapshots that expire while the commits are
   timed, plus margin); the rest back to back (their ages do not matter: none expires). While
   the history is built the bookkeeper's expiry clock stands still: nothing expires yet.
3. The bookkeeper's clock (the one expiry reads) is then set so the oldest snapshot is just
   short of the age that starts an expiry (`keep_snapshots_for` plus a tenth of it, at most a
   minute past): while the `measured` commits run at one a second, about a minute of history
   is expired once a minute, as at the end of every hour of a steady stream. The commits that
   expire are in the timed ones (they are most of the p99).

Reported: commit latency (the table's commit, `commit_ms`; and the whole cycle, `cycle_ms`,
which also reads the file's footer) p50/p99 and the slowest; the snapshots kept before and after;
the metadata file's size and what each snapshot adds to it (its entry in `snapshots` and in
`snapshot-log`), of that its summary, and of that the committed offsets and event times of the
partitions (`icekeeper.offsets`, `icekeeper.partition-event-ms`: none since they moved to the
property); the property's bytes (once per file); how long building the history took; and the
cyclic garbage collector's pauses within the timed cycles (`cycle_gc_p50_ms`, `cycle_gc_p99_ms`,
`full_collections`, and `gc_objects`, what a full collection walks); and what a timed cycle
cost the machine (`server_cpu.py`): the busy CPU of all its cores and of each stack server (the
REST catalog's rewrite of the metadata file, s3proxy's GETs and PUTs), means per cycle.

`snapshot_history.py` is its local-disk forerunner: commits back to back as the history grows,
one partition; this one is the steady state at the hour's end, at the rate the figure is about.
"""

from __future__ import annotations

import contextlib
import cProfile
import gc
import json
import shutil
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from pyiceberg.io.pyarrow import PyArrowFileIO

from icekeeper.bench.bookkeeper import (
    ROWS_PER_FILE,
    bench_config,
    bench_moniker,
    seed_schema,
    table_location,
    write_seed_files,
)
from icekeeper.bench.heap_census import CollectorPauses
from icekeeper.bench.layouts import LAYOUT_SERVICES, open_layout, remove_layout_files
from icekeeper.bench.server_cpu import ServerCpu
from icekeeper.bench.work import fresh_work_folder
from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.committed_state import KEY_EVENT_TIME, KEY_OFFSETS, KEY_STATE
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.door_fileio import DoorFileIO
from icekeeper.common.internals import add_rest_response_hook, rest_session_headers
from icekeeper.common.moniker import FileEntry, Moniker, OffsetRange

Progress = Callable[[str], None]
FIRST_OFFSET = 1_000_000_000
"""Every partition's first offset in the bench: ten digits, as a topic that has run a while."""
MARGIN_S = 10
"""Seconds of paced history beyond those the timed commits expire."""


def history_moniker(
    config: IcekeeperConfig, schema_json: dict, entry: FileEntry, seq: int, partitions: int
) -> Moniker:
    """Moniker `seq` of the bench's one writer: one file, and a range of every partition."""
    identifier = config.tables[0].identifier
    ranges = [
        OffsetRange(
            topic="bench",
            partition=partition,
            from_offset=FIRST_OFFSET + (seq - 1) * ROWS_PER_FILE,
            until_offset=FIRST_OFFSET + seq * ROWS_PER_FILE,
        )
        for partition in range(partitions)
    ]
    event_ms = 1646297167000 + seq * 1000
    return bench_moniker(
        identifier, table_location(config), schema_json, entry, seq, ranges, event_ms, 999
    )


def percentile(values: list[float], fraction: float) -> float:
    """The `fraction` quantile of `values` (linear between the nearest two, as numpy's default)."""
    ordered = sorted(values)
    rank = fraction * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _compact(value: object) -> int:
    """Bytes of `value` as compact JSON (how pyiceberg and Iceberg's Java parser write metadata)."""
    return len(json.dumps(value, separators=(",", ":")).encode())


def snapshot_bytes(metadata: dict, last: int) -> dict[str, float]:
    """What each of the newest `last` snapshots adds to the metadata file (medians, bytes): its
    entry in `snapshots` and in `snapshot-log` (and a comma each), of that its summary, and of
    that the keys of the partitions' offsets and event times with their values."""
    log_bytes = {entry["snapshot-id"]: _compact(entry) + 1 for entry in metadata["snapshot-log"]}
    newest = sorted(
        metadata["snapshots"], key=lambda s: (s.get("sequence-number", 0), s["timestamp-ms"])
    )[-last:]
    per_snapshot, summary, partitions = [], [], []
    for snapshot in newest:
        per_snapshot.append(_compact(snapshot) + 1 + log_bytes.get(snapshot["snapshot-id"], 0))
        summary.append(_compact(snapshot.get("summary", {})))
        partitions.append(
            sum(
                _compact({key: snapshot["summary"][key]}) - 2
                for key in (KEY_OFFSETS, KEY_EVENT_TIME)
                if key in snapshot.get("summary", {})
            )
        )
    return {
        "snapshot_bytes": statistics.median(per_snapshot),
        "summary_bytes": statistics.median(summary),
        "partition_offsets_bytes": statistics.median(partitions),
    }


@contextlib.contextmanager
def inputs_opened() -> Iterator[list[str]]:
    """Every location the tables' FileIO opens for reading while inside, in order: `DoorFileIO`,
    or pyiceberg's own `PyArrowFileIO`, which a REST catalog's tables on S3 keep (see
    `open_catalog`). A bench's own count, hence a patch of the classes for the while rather than
    a counter the service would carry."""
    opened: list[str] = []
    originals = {kind: kind.new_input for kind in (DoorFileIO, PyArrowFileIO)}

    def counting(original: Callable[..., Any]) -> Callable[..., Any]:
        def new_input(self: PyArrowFileIO, location: str) -> Any:
            opened.append(location)
            return original(self, location)

        return new_input

    for kind, original in originals.items():
        kind.new_input = counting(original)  # type: ignore[method-assign]
    try:
        yield opened
    finally:
        for kind, original in originals.items():
            kind.new_input = original  # type: ignore[method-assign]


MERGE_READS = 10
"""A commit that opens this many files or more is a manifest merge (pyiceberg merges at 100)."""


def _medians_by_kind(kinds: list[dict[str, Any]]) -> dict[str, float | int]:
    """Median commit milliseconds of plain appends, merges and expiries, and how many of each."""
    groups: dict[str, list[float]] = {"plain": [], "merge": [], "expiry": []}
    for kind in kinds:
        name = "expiry" if kind["expired"] else "merge" if kind["reads"] >= MERGE_READS else "plain"
        groups[name].append(kind["commit_ms"])
    figures: dict[str, float | int] = {}
    for name, values in groups.items():
        figures[f"{name}_count"] = len(values)
        if values:
            figures[name] = round(statistics.median(values), 1)
    return figures


def _cycle_cpu(kinds: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean busy CPU milliseconds per cycle of the machine's cores and of each server (a mean,
    not a median: `/proc` counts CPU in clock ticks of 10 ms, a server's share of one cycle
    is a few of them)."""
    machine = [kind["machine_cpu_ms"] for kind in kinds if kind["machine_cpu_ms"] is not None]
    servers = sorted({name for kind in kinds for name in kind["server_cpu_ms"]})
    figures: dict[str, Any] = {}
    if machine:
        figures["cycle_machine_cpu_mean_ms"] = round(statistics.fmean(machine), 1)
    if servers:
        figures["cycle_server_cpu_mean_ms"] = {
            name: round(statistics.fmean(_readings(kinds, name)), 1) for name in servers
        }
    return figures


def _readings(kinds: list[dict[str, Any]], server: str) -> list[float]:
    return [kind["server_cpu_ms"][server] for kind in kinds if server in kind["server_cpu_ms"]]


def _by_encoding(kinds: list[dict[str, Any]]) -> dict[str, dict[str, float | int]]:
    """Commit and server p50/p99 of the timed commits that asked for each answer encoding."""
    figures: dict[str, dict[str, float | int]] = {}
    for encoding in sorted({kind["encoding"] for kind in kinds}):
        mine = [kind for kind in kinds if kind["encoding"] == encoding]
        commits = [kind["commit_ms"] for kind in mine]
        servers = [kind["server_ms"] for kind in mine]
        figures[encoding] = {
            "commits": len(mine),
            # What the server sent: a header asked for and not honoured would show here.
            "answers_in": sorted({e for kind in mine for e in kind["answer_encodings"]}),
            "commit_p50_ms": round(percentile(commits, 0.5), 1),
            "commit_p99_ms": round(percentile(commits, 0.99), 1),
            "server_p50_ms": round(percentile(servers, 0.5), 1),
            "server_p99_ms": round(percentile(servers, 0.99), 1),
        }
    return figures


def run_commit_history_bench(
    stack_config: IcekeeperConfig,
    layout: str = "s3-rest",
    partitions: int = 64,
    measured: int = 200,
    keep_snapshots_for_s: float | None = None,
    answer_encodings: tuple[str, ...] = (),
    progress: Progress = print,
    profile_path: str | None = None,
) -> dict[str, Any]:
    """Build the history, time `measured` commits at one a second; figures as described above.
    `answer_encodings` (REST): the `Accept-Encoding` the timed commits ask for, taking turns
    (`identity,gzip`: the bookkeeper's default against what pyiceberg's HTTP library asks).

    Args:
        stack_config: the stack whose S3 server and REST catalog the layout uses (running); its
            state folder holds the bench's work folder.
        keep_snapshots_for_s: `bookkeeper.keep_snapshots_for` (default: the config's, an hour);
            the history is one snapshot per second of it.
        profile_path: where to save a cProfile of the timed commits (pstats format; the
            bookkeeper's thread only, so the pools' threads show as waits), to see where a commit
            at the hour's end spends its time; their latencies then include the profiler's.
    """
    work = fresh_work_folder(stack_config.state_dir, "bench-commit-history")
    where = open_layout(layout, stack_config, work)
    meter = ServerCpu.of_stack(stack_config, LAYOUT_SERVICES[layout])
    config = bench_config(
        work,
        None if layout == "local" else where,
        f"{where.namespace}.tbl_history_{uuid.uuid4().hex[:6]}",
    )
    settings = config.bookkeeper
    if keep_snapshots_for_s is not None:
        settings = settings.model_copy(update={"keep_snapshots_for": keep_snapshots_for_s})
        config = config.model_copy(update={"bookkeeper": settings})
    keep_ms = int(settings.keep_snapshots_for * 1000)
    trigger_ms = min(keep_ms // 10, 60_000)  # commit_path: expiry waits this long past the age
    history = max(2, round(settings.keep_snapshots_for))
    paced = min(history, measured + trigger_ms // 1000 + MARGIN_S)
    progress(
        f"layout {layout}: {history:,} snapshots of history ({paced:,} at one a second), then "
        f"{measured:,} timed commits at one a second; {partitions} partitions; under {where.root}"
    )
    try:
        with inputs_opened() as opened, CollectorPauses() as collector:
            result = _run(
                config,
                collector,
                history,
                paced,
                measured,
                partitions,
                trigger_ms,
                opened,
                answer_encodings,
                progress,
                profile_path,
                meter,
            )
        return {"layout": layout, **result}
    finally:
        remove_layout_files(where)
        shutil.rmtree(work, ignore_errors=True)


def _run(
    config: IcekeeperConfig,
    collector: CollectorPauses,
    history: int,
    paced: int,
    measured: int,
    partitions: int,
    trigger_ms: int,
    opened: list[str],
    answer_encodings: tuple[str, ...],
    progress: Progress,
    profile_path: str | None = None,
    meter: ServerCpu | None = None,
) -> dict[str, Any]:
    from icekeeper.common.catalog import open_catalog

    meter = meter or ServerCpu({})
    from icekeeper.common.storage import configure_storage, read_file
    from icekeeper.common.transports import open_transport

    # The bench writes its files before the bookkeeper opens the catalog (which would do this).
    configure_storage(config.catalog.properties)
    schema = seed_schema(config)
    schema_json = json.loads(schema.model_dump_json())
    location = table_location(config).removeprefix("file://")
    started = time.monotonic()
    entries = write_seed_files(
        [
            (f"{location}/data/bench/{seq:08d}-{uuid.uuid4().hex[:8]}.parquet", seq * 100)
            for seq in range(1, history + measured + 1)
        ],
        schema,
    )
    progress(f"{len(entries):,} files written in {time.monotonic() - started:.1f}s")
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    commit_s: list[float] = []
    cycle_s: list[float] = []
    answers: list[tuple[str, float]] = []
    """Each answer of a REST catalog: its request's method and the seconds from sending it to the
    answer's last byte (the server's work and the wire; the client's parse comes after). Headers
    alone would not do: a server streams a large answer, sending its headers once its first
    buffer is full, and serializes the rest while the client reads."""

    expiring: list[bool] = []
    encodings_seen: list[str] = []
    """Per answer: the encoding the server sent it in (`Content-Encoding`, none: identity)."""
    """Per answer: whether its request expired snapshots (a commit that drops a minute of them)."""

    def answered(response: Any) -> None:
        started = time.monotonic()
        _ = response.content  # read here, not by the caller: counted as the server's
        answers.append(
            (response.request.method, response.elapsed.total_seconds() + time.monotonic() - started)
        )
        expiring.append(b'"remove-snapshots"' in (response.request.body or b""))
        encodings_seen.append(response.headers.get("Content-Encoding") or "identity")

    add_rest_response_hook(bookkeeper.catalog, answered)

    kinds: list[dict[str, Any]] = []
    """Per commit: the files the table's FileIO opened for reading (the manifests a merge reads; a
    plain append reads none), whether it expired snapshots, and the server's share (REST)."""

    def commit(seq: int) -> None:
        transport.publish(history_moniker(config, schema_json, entries[seq - 1], seq, partitions))
        opened_before, answered_before = len(opened), len(answers)
        paused_before = len(collector.pauses)
        with meter.phase() as cpu:
            cycle_started = time.monotonic()  # the meter's readings of /proc left out
            report = bookkeeper.run_cycle()
            cycle_s.append(time.monotonic() - cycle_started)
        kinds.append(
            {
                **collector.since(paused_before),
                "machine_cpu_ms": None
                if cpu.machine_busy_s is None
                else round(cpu.machine_busy_s * 1000, 1),
                "server_cpu_ms": {
                    name: round(seconds * 1000, 1) for name, seconds in cpu.servers_s.items()
                },
                "reads": len(opened) - opened_before,
                "expired": any(expiring[answered_before:]),
                "answer_encodings": sorted(set(encodings_seen[answered_before:])),
                "server_ms": round(
                    sum(
                        seconds for method, seconds in answers[answered_before:] if method == "POST"
                    )
                    * 1000,
                    1,
                ),
            }
        )
        if report.committed_monikers != 1:
            raise RuntimeError(f"commit {seq}: {report}")
        commit_s.append(report.tables[0].seconds)
        kinds[-1]["commit_ms"] = round(report.tables[0].seconds * 1000, 1)

    headers = rest_session_headers(bookkeeper.catalog)

    def at_one_a_second(seqs: range, encodings: tuple[str, ...] = ()) -> None:
        first = time.monotonic()
        for index, seq in enumerate(seqs):
            time.sleep(max(0.0, first + index - time.monotonic()))
            encoding = encodings[index % len(encodings)] if encodings else None
            if encoding and headers is not None:
                headers["Accept-Encoding"] = encoding
            commit(seq)
            kinds[-1]["encoding"] = encoding

    # No snapshot expires while the history is built (nor would one in a stream's first hour):
    # the clock expiry reads stands at the epoch until the timed commits.
    bookkeeper.committer.commit_path.now_ms = lambda: 0
    build_started = time.monotonic()
    at_one_a_second(range(1, paced + 1))
    progress(f"  {paced:,} paced commits in {time.monotonic() - build_started:.0f}s")
    for seq in range(paced + 1, history + 1):
        commit(seq)
        if seq % 500 == 0:
            progress(
                f"  {seq:,} commits, latest median "
                f"{statistics.median(commit_s[-100:]) * 1000:.0f} ms"
            )
    build_s = time.monotonic() - build_started
    catalog = open_catalog(config)
    identifier = config.tables[0].identifier
    table = catalog.load_table(identifier)
    kept_before = len(table.metadata.snapshots)
    oldest_ms = min(snapshot.timestamp_ms for snapshot in table.metadata.snapshots)
    lead_ms = min(5000, trigger_ms)
    # The clock expiry reads: the oldest snapshot `lead_ms` short of starting an expiry now.
    shift_ms = oldest_ms + int(config.bookkeeper.keep_snapshots_for * 1000) + trigger_ms
    shift_ms -= lead_ms + int(time.time() * 1000)
    bookkeeper.committer.commit_path.now_ms = lambda: int(time.time() * 1000) + shift_ms
    progress(f"history built in {build_s:.0f}s ({kept_before:,} snapshots); timing {measured}")
    timed_from, answers_from = len(commit_s), len(answers)
    gc_objects_before = len(gc.get_objects())
    profiler = cProfile.Profile() if profile_path else None
    with profiler or contextlib.nullcontext():
        at_one_a_second(range(history + 1, history + measured + 1), answer_encodings)
    if profiler is not None and profile_path:
        profiler.dump_stats(profile_path)
        progress(f"profile of the timed commits saved in {profile_path}")
    bookkeeper.committer.close()
    table = catalog.load_table(identifier)
    metadata_location = table.metadata_location
    metadata_text = read_file(metadata_location)
    metadata = json.loads(metadata_text)
    per_snapshot = snapshot_bytes(metadata, measured)
    timed = [seconds * 1000 for seconds in commit_s[timed_from:]]
    cycles = [seconds * 1000 for seconds in cycle_s[timed_from:]]
    commit_answers = [
        seconds * 1000 for method, seconds in answers[answers_from:] if method == "POST"
    ]
    return {
        "catalog": config.catalog.properties.get("type", "sql"),
        "catalog_class": type(catalog).__name__,
        "metadata_location": metadata_location,
        "partitions": partitions,
        "history": history,
        "paced": paced,
        "build_s": round(build_s, 1),
        "snapshots_before": kept_before,
        "snapshots_after": len(table.metadata.snapshots),
        "measured": measured,
        "commit_p50_ms": round(percentile(timed, 0.5), 1),
        "commit_p99_ms": round(percentile(timed, 0.99), 1),
        "commit_slowest_ms": [round(ms, 1) for ms in sorted(timed)[-5:]],
        # What the slowest timed commits did: a merge reads the manifests it merges, an expiry
        # drops a minute of snapshots; and the medians of plain appends, merges and expiries.
        "slowest_commits": sorted(kinds[timed_from:], key=lambda k: k["commit_ms"])[-5:],
        "commit_p50_ms_by_kind": _medians_by_kind(kinds[timed_from:]),
        # With two answer encodings, commits take turns: the same history, table and machine.
        **(
            {"by_answer_encoding": _by_encoding(kinds[timed_from:])}
            if len(answer_encodings) > 1
            else {}
        ),
        "cycle_p50_ms": round(percentile(cycles, 0.5), 1),
        "cycle_p99_ms": round(percentile(cycles, 0.99), 1),
        # The cyclic collector's pauses within the timed cycles (any thread's), and the objects
        # it tracks (what a full collection walks) when the timing started.
        "cycle_gc_p50_ms": round(percentile([k["gc_ms"] for k in kinds[timed_from:]], 0.5), 1),
        "cycle_gc_p99_ms": round(percentile([k["gc_ms"] for k in kinds[timed_from:]], 0.99), 1),
        "full_collections": sum(k["full_collections"] for k in kinds[timed_from:]),
        "gc_objects": gc_objects_before,
        "history_commit_p50_ms": round(percentile(commit_s[:timed_from], 0.5) * 1000, 1),
        # What a timed cycle cost the machine's cores: all of them, and each stack server.
        **_cycle_cpu(kinds[timed_from:]),
        # REST only: the catalog server's answers to the timed commits (POSTs), sent to last
        # byte received, and how many requests of any kind the timed commits made.
        **(
            {
                "rest_commit_answer_p50_ms": round(percentile(commit_answers, 0.5), 1),
                "rest_commit_answer_p99_ms": round(percentile(commit_answers, 0.99), 1),
                "rest_requests_per_commit": round(len(answers[answers_from:]) / measured, 2),
            }
            if commit_answers
            else {}
        ),
        "metadata_bytes": len(metadata_text),
        # Once per metadata file, not per snapshot: the committed state (`KEY_STATE`).
        "state_property_bytes": _compact({KEY_STATE: metadata["properties"][KEY_STATE]}) - 2
        if KEY_STATE in metadata.get("properties", {})
        else 0,
        **{key: round(value) for key, value in per_snapshot.items()},
        "snapshots_share_of_metadata": round(
            per_snapshot["snapshot_bytes"] * len(metadata["snapshots"]) / len(metadata_text), 3
        ),
    }

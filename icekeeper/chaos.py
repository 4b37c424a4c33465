"""`icekeeper chaos`: kill -9 components at random moments, then prove exactly-once by offset.

Produces N synthetic records (updates and deletes of a bounded key set, schema changes, poison
messages) to a fresh 4-partition topic, then runs, as separate processes with the real CLI: two
writers sharing the topic, the bookkeeper, and the reaper on a short schedule. K times, at seeded
random moments, one of them is killed with SIGKILL and restarted. Once, the bookkeeper is paused
(SIGSTOP) while a second one takes over the lease and commits; resumed (SIGCONT), the first must
stop fenced (exit 3). R times (`reassignments`), at seeded moments too, the partitions change
writer while the bookkeeper lags and monikers are pending, writers restarting over a backlog
larger than one commit (`chaos_reassign.py`). Monikers travel through a transaction-log folder or,
with `transport` `azure-queue`, Azurite's queue, where one writer sends all of its monikers as
pointers to their journal copy. The bookkeeper commits at most `MAX_FILES_PER_COMMIT` files a
table and cycle, so monikers wait whenever it lagged.

The topic feeds two tables (`mode` both, the default; or one of them): `chaos.orders` in changelog
mode and, fanned out from the same records, `chaos.orders_mirror` in upsert mode, kept one row per
key through the bookkeeper's key index and position deletes while the reaper compacts it. At the
end (`chaos_verify.py`): every good record exactly once in the changelog table, by
topic/partition/offset (`duplicates`, `missing`), with the payload of its Kafka record
(`payload_mismatched`); the upsert table equal to a reference built from the Kafka records
themselves, no key twice (`upsert_duplicate_keys`, `upsert_mismatched`); every poison record in the
dead-letter topic, repeated at most once per writer kill (`dead_letter_duplicates`: dead letters
go at least once); each table read by pyiceberg, Spark and
DuckDB, each read checked on its own and the three alike row by row (`engines_disagreeing`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pyiceberg.table import Table

from icekeeper.chaos_pacing import RecordGate
from icekeeper.chaos_processes import Component
from icekeeper.chaos_reassign import Reassignment, first_layout, writer_components
from icekeeper.chaos_verify import dead_letter_positions, failures, verify, waiting_for_gone
from icekeeper.common.catalog import load_table_or_none, open_catalog
from icekeeper.common.committed_state import committed_state
from icekeeper.common.config import IcekeeperConfig, load_config
from icekeeper.common.fencing import current_lease
from icekeeper.common.kafka_clients import connection_environ
from icekeeper.common.storage import read_lines
from icekeeper.common.transports import MonikerTransport, open_transport
from icekeeper.samples.produce import ensure_topic, produce_at_rate
from icekeeper.samples.synthetic import SyntheticSpec

Progress = Callable[[str], None]
Mode = Literal["both", "changelog", "upsert"]
MODES: tuple[Mode, ...] = ("both", "changelog", "upsert")
TransportKind = Literal["txlog", "azure-queue"]
TRANSPORTS: tuple[TransportKind, ...] = ("txlog", "azure-queue")
MAX_FILES_PER_COMMIT = 4
"""`bookkeeper.max_files_per_commit` of a chaos run: a writer's moniker has one data file per table
here, so a bookkeeper that keeps up commits what two or three writers publish in a cycle, and one
that lagged (killed, paused, down through a reassignment) has more waiting than one commit takes."""
AZURE_VISIBILITY_TIMEOUT_S = 2
"""`transport.visibility_timeout` of a chaos run on the Azure queue: a moniker left waiting (no
room in the cycle) comes back after this, so a backlog commits `MAX_FILES_PER_COMMIT` files a
table every 2 s, about what two writers publish at a batch a second. At the default 60 s it would
commit four files a minute while the writers publish more; it also receives messages again
within one long receive, which the transport must settle."""
STALL_S = 300.0
"""Settling gives up early when monikers stay pending and nothing commits for this long: one that
waits for a predecessor that will never come would otherwise hold the run to its timeout."""
IDLE_S = 600.0
"""Settling gives up early, too, when the tables lack records while nothing is pending and nothing
is committed or published for this long: the writers have moved past records that never reached
a table (a slow writer's batch took up to 169 s in the longest run)."""
CHANGELOG_TABLE = "chaos.orders"
UPSERT_TABLE = "chaos.orders_mirror"
PARTITIONS = 4
FENCED_EXIT = 3


def chaos_tables(mode: Mode) -> dict[str, bool]:
    """The run's tables: identifier -> whether it is an upsert table.

    The upsert table comes first: the reaper takes tables in config order, and a short run may
    end before its first pass gets to the second table; compacting the upsert table while its
    keys keep changing is the harder case.
    """
    if mode not in MODES:
        raise ValueError(f"chaos mode {mode!r}: use one of {', '.join(MODES)}")
    return {
        **({UPSERT_TABLE: True} if mode != "changelog" else {}),
        **({CHANGELOG_TABLE: False} if mode != "upsert" else {}),
    }


@dataclass
class ChaosRun:
    kills: list[dict[str, Any]] = field(default_factory=list)
    fenced_exit_code: int | None = None
    restarts: int = 0
    reassignments: list[dict[str, Any]] = field(default_factory=list)


def chaos_environ(
    base: IcekeeperConfig,
    work: Path,
    topic: str,
    max_offsets: int = 500,
    mode: Mode = "both",
    transport: TransportKind = "txlog",
    catalog_properties: dict[str, str] | None = None,
) -> dict[str, str]:
    """Settings every component gets (environment overrides on the embedded defaults); a writer's
    share of the topic comes on top (`chaos_reassign.WriterLayout.environ`). `catalog_properties`:
    another catalog than the run's own SQLite one (a REST catalog, the warehouse on S3)."""
    source = base.sources[0]
    # Both tables claim the topic alike, so the writers fan each batch out to both
    # (writers/routing.py).
    tables = ", ".join(
        f"{{identifier: {identifier}, topics: [{topic}], primary_key: [id], mode: "
        f"{'upsert' if upsert else 'changelog'}}}"
        for identifier, upsert in chaos_tables(mode).items()
    )
    return {
        "ICEKEEPER__STATE_DIR": str(work / "state"),
        "ICEKEEPER__CACHE_DIR": str(base.cache_dir),
        # Bootstrap servers, registry and their credentials (as references), security.
        **connection_environ(source),
        "ICEKEEPER__SOURCES__0__TOPICS": f"[{topic}]",
        "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": topic + ".dlq",
        "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": str(max_offsets),
        "ICEKEEPER__TABLES": f"[{tables}]",
        "ICEKEEPER__SPARK__MASTER": "local[1]",
        "ICEKEEPER__BOOKKEEPER__LEASE_TTL": "6",
        "ICEKEEPER__BOOKKEEPER__MAX_FILES_PER_COMMIT": str(MAX_FILES_PER_COMMIT),
        "ICEKEEPER__REAPER__LEASE_TTL": "30",
        "ICEKEEPER__BOOKKEEPER__HTTP_PORT": "0",
        "ICEKEEPER__REAPER__HTTP_PORT": "0",
        "ICEKEEPER__WRITER__HTTP_PORT": "0",  # several writers on one host: no port each
        "ICEKEEPER__REAPER__SNAPSHOT_EXPIRE_TIME": "0",
        "ICEKEEPER__REAPER__RETAIN_LAST": "5",
        # Shorter than a slow batch here: writers' claims on their folders, not the grace, must
        # keep unpublished files (a 138 s batch against a 120 s grace once lost a committed file).
        "ICEKEEPER__GROUP__ORPHAN_GRACE": "30",
        **(azure_queue_environ(base, topic) if transport == "azure-queue" else {}),
        **(
            {"ICEKEEPER__CATALOG__PROPERTIES": json.dumps(catalog_properties)}
            if catalog_properties
            else {}
        ),
    }


def azure_queue_environ(base: IcekeeperConfig, topic: str) -> dict[str, str]:
    """The Azure queue transport on the local stack's Azurite, with queues of the run's own (the
    journal and the dead-letter folder are in the run's state folder)."""
    from icekeeper.localstack.stack import LocalStack

    queue = topic.replace(".", "-").lower()  # chaos-<seed>-<hex>: a valid queue name
    return {
        "ICEKEEPER__TRANSPORT__KIND": "azure-queue",
        "ICEKEEPER__TRANSPORT__CONNECTION_STRING": LocalStack(base)
        .service("azurite-queue")
        .connection_string(),
        "ICEKEEPER__TRANSPORT__QUEUE_NAME": queue,
        "ICEKEEPER__TRANSPORT__DEAD_LETTER_QUEUE_NAME": queue + "-dlq",
        "ICEKEEPER__TRANSPORT__VISIBILITY_TIMEOUT": str(AZURE_VISIBILITY_TIMEOUT_S),
    }


def run_chaos(
    base: IcekeeperConfig,
    records: int,
    kills: int,
    seed: int,
    progress: Progress = print,
    timeout_s: float = 900,
    mode: Mode = "both",
    transport: TransportKind = "txlog",
    reassignments: int = 1,
    catalog_properties: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One chaos run; the report's `failures` lists, in words, every check that did not hold (see
    `chaos_verify.failures`), and the logs of every component stay under `logs`.

    Args:
        transport: how monikers travel: `txlog` (a folder) or `azure-queue` (Azurite's queue,
            one writer's monikers all as pointers to their journal copy).
        reassignments: how many times the writers' partitions change writer while monikers are
            pending (`chaos_reassign.py`), at seeded moments between kills.
        catalog_properties: the catalog of the run's tables, if not a SQLite file of its own
            (a REST catalog with the warehouse on S3: its tables must not exist yet).
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"chaos transport {transport!r}: use one of {', '.join(TRANSPORTS)}")
    tables = chaos_tables(mode)
    started = time.monotonic()
    rng = random.Random(seed)
    # The reassignments' own random stream: the kills of a seed stay those of runs without them.
    event_rng = random.Random(f"chaos-reassignments-{seed}")
    work = Path(base.state_dir) / "chaos"
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    topic = f"chaos.{seed}.{uuid.uuid4().hex[:6]}"
    # Several batches per writer between kills, whatever the size of the run.
    overrides = chaos_environ(
        base,
        work,
        topic,
        max_offsets=max(500, records // 40),
        mode=mode,
        transport=transport,
        catalog_properties=catalog_properties,
    )
    config = load_config(None, environ=overrides)
    # A bounded key set, each key changed about ten times: deletes nearly as frequent as creates
    # and any free key re-created, so keys are deleted and come back all along, and about a
    # third of them end deleted (the upsert table's hard deletes must show).
    spec = SyntheticSpec(
        seed=seed,
        keys=max(10, records // 10),
        events=records,
        update_ratio=0.5,
        delete_ratio=0.22,
        key_reuse="random",
        schema_changes=2,
        poison_ratio=0.02,
        server="chaos",
        db="shop",
        table="orders",
    )
    ensure_topic(config.sources[0], topic, PARTITIONS)

    environ = {**os.environ, **overrides}
    command = [sys.executable, "-m", "icekeeper.cli"]
    logs = work / "logs"
    layout = first_layout(pointers=transport == "azure-queue")
    components = {
        **writer_components(layout, command, environ, logs),
        "bookkeeper": Component("bookkeeper", [*command, "bookkeeper"], environ, logs),
        "reaper": Component("reaper", [*command, "reaper", "--every", "20s"], environ, logs),
    }
    moniker_transport = open_transport(config)
    # A share of the records per kill and per reassignment, one to start with.
    gate = RecordGate(records, steps=1 + kills + reassignments)
    reassignment = Reassignment(
        command,
        environ,
        logs,
        moniker_transport,
        list(tables),
        MAX_FILES_PER_COMMIT,
        PARTITIONS,
        progress,
        gate,
    )
    reassign_at = Counter(event_rng.randint(0, kills) for _ in range(reassignments))
    # Records arrive throughout the chaos (about 10 s per kill, the pause and a minute per
    # reassignment), so kills land in the middle of batches, commits and maintenance passes.
    produced: dict[str, Any] = {}
    rate = records / max(20.0, 10.0 * kills + 20.0 + 60.0 * reassignments)
    producer = threading.Thread(
        target=lambda: produced.update(
            produce_at_rate(config, spec, rate, topic=topic, partitions=PARTITIONS, gate=gate)
        )
    )
    run = ChaosRun()
    try:
        for component in components.values():
            component.start()
        producer.start()
        progress(
            f"producing {records:,} records (+2% poison) at {rate:,.0f}/s to {topic} while killing"
            f" (monikers over {transport})"
        )
        pause_at = rng.randint(0, kills) if kills else 0
        for index in range(kills + 1):
            if index == pause_at:
                _pause_and_fence(
                    components,
                    environ,
                    command,
                    logs,
                    run,
                    (config.group.lease_uri, config.group.name),
                    progress,
                )
            for _ in range(reassign_at[index]):
                at_s = round(time.monotonic() - started, 1)
                layout, record = reassignment.run(components, layout)
                run.reassignments.append({"at_s": at_s, **record})
                gate.step_done()
            if index == kills:
                gate.release_all()
                break
            time.sleep(rng.uniform(4, 12))
            victim = components[rng.choice(sorted(components))]
            victim.kill()
            run.kills.append(
                {"component": victim.name, "at_s": round(time.monotonic() - started, 1)}
            )
            progress(f"kill -9 {victim.name} ({len(run.kills)}/{kills})")
            time.sleep(rng.uniform(0.5, 3))
            victim.start()
            gate.step_done()
        producer.join()
        poison_expected = sum(produced["poison"].values())
        progress(
            f"chaos over; {produced['records']:,} records produced ({poison_expected} poison); "
            "waiting until all are settled"
        )
        settled = _wait_until_settled(
            config,
            topic,
            produced["records"],
            tables,
            components,
            deadline=started + timeout_s,
            transport=moniker_transport,
            progress=progress,
        )
    finally:
        gate.release_all()  # a producer waiting at the gate would keep the process alive
        for component in components.values():
            component.terminate()
    progress("verifying against the topic read back")
    result = verify(
        config,
        overrides,
        topic,
        poison_expected,
        changelog_table=CHANGELOG_TABLE if CHANGELOG_TABLE in tables else None,
        upsert_table=UPSERT_TABLE if UPSERT_TABLE in tables else None,
    )
    result.update(
        {
            "mode": mode,
            "transport": transport,
            "settled": settled,
            "kills": len(run.kills),
            "killed": Counter(k["component"] for k in run.kills),
            "fenced_exit_code": run.fenced_exit_code,
            "reassignments": run.reassignments,
            "event_writer_kills": sum(r["writer_kills"] for r in run.reassignments),
            "writers": layout.describe(PARTITIONS),
            **transport_leftovers(moniker_transport, committed_seqs(config, tables)),
            "seed": seed,
            "seconds": round(time.monotonic() - started, 1),
            "logs": str(logs),
            "refusals_logged": _lines_saying(logs, "moniker refused"),
        }
    )
    result.update(reaper_files_compacted=_files_compacted(config.reaper.report_path))
    result["failures"] = failures(result)
    return result


def _lines_saying(logs: Path, words: str) -> int:
    """How many lines of the components' logs contain `words` (the bookkeepers' refusals: a
    reassignment that never made one did not test what it is for)."""
    return sum(
        line.count(words.encode()) for path in logs.glob("*.log") for line in path.open("rb")
    )


def committed_seqs(config: IcekeeperConfig, tables: dict[str, bool]) -> dict[str, dict[str, int]]:
    """Per table, each writer's last committed seq."""
    catalog = open_catalog(config)
    return {
        identifier: committed_state(table).writer_seqs
        for identifier in tables
        if (table := load_table_or_none(catalog, identifier)) is not None
    }


def transport_leftovers(
    transport: MonikerTransport, committed: dict[str, dict[str, int]], examples: int = 10
) -> dict[str, Any]:
    """What the transport holds at the end of a run: monikers still pending, the writers' chains
    among them that wait for a moniker that is gone (`chaos_verify.waiting_for_gone`: a failure),
    and monikers dead-lettered (refused as overlapping committed offsets, quarantined), with a
    few examples of each."""
    pending = sorted(transport.pending(), key=lambda m: (m.table, m.writer_id, m.seq))
    quarantined = transport.quarantined()
    return {
        "chains_waiting_for_gone": waiting_for_gone(pending, committed),
        "pending_at_end": len(pending),
        "pending_at_end_examples": [
            f"{m.table} {m.writer_id} seq {m.seq} (prev_seq {m.prev_seq}): "
            + ", ".join(f"[{r.partition}] {r.from_offset}..{r.until_offset}" for r in m.offsets)
            for m in pending[:examples]
        ],
        "monikers_dead_lettered": len(quarantined),
        "monikers_dead_lettered_examples": [
            (
                f"{item.moniker.table} {item.moniker.writer_id} seq {item.moniker.seq}: "
                if item.moniker is not None
                else ""
            )
            + item.reason[:200]
            for item in quarantined[:examples]
        ],
    }


def _files_compacted(report_uri: str) -> dict[str, int]:
    """Data files each table's compactions replaced, from the reaper's pass reports: whether the
    reaper's passes really rewrote the tables under the other components' feet."""
    compacted: dict[str, int] = {}
    for line in read_lines(report_uri):
        try:
            tables = json.loads(line).get("tables", [])
        except ValueError:  # the reaper was killed while writing this line
            continue
        for table in tables:
            compacted[table["table"]] = compacted.get(table["table"], 0) + int(
                table.get("files_compacted", 0)
            )
    return compacted


def lease_holder_pid(lease_uri: str, group: str) -> int | None:
    """The process id in the newest lease of the bookkeeper group (owner `host:pid:nonce`)."""
    try:
        lease = current_lease(lease_uri, group)
        return int(lease.owner.split(":")[1]) if lease is not None else None
    except (ValueError, IndexError, OSError):
        return None


def _pause_and_fence(
    components: dict[str, Component],
    environ: dict[str, str],
    command: list[str],
    logs: Path,
    run: ChaosRun,
    lease: tuple[str, str],
    progress: Progress,
) -> None:
    """SIGSTOP the bookkeeper; a second one takes the
    lease and commits; SIGCONT: the first is fenced."""
    first = components["bookkeeper"]
    if not first.alive():
        first.start()
    # Pause the active bookkeeper (holding the lease), not a standby waiting for it.
    deadline = time.monotonic() + 60
    while lease_holder_pid(*lease) != first.process.pid and time.monotonic() < deadline:
        time.sleep(0.5)
    os.killpg(first.process.pid, signal.SIGSTOP)
    progress("bookkeeper paused (SIGSTOP); starting a second one")
    second = Component("bookkeeper-b", [*command, "bookkeeper"], environ, logs)
    second.start()
    time.sleep(15)  # the lease (6 s) expires, the second takes it and commits
    os.killpg(first.process.pid, signal.SIGCONT)
    try:
        run.fenced_exit_code = first.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        run.fenced_exit_code = None
        first.kill()
    progress(f"first bookkeeper resumed and exited with {run.fenced_exit_code} (3 = fenced)")
    second.name = "bookkeeper"
    components["bookkeeper"] = second


def _wait_until_settled(
    config: IcekeeperConfig,
    topic: str,
    records: int,
    tables: dict[str, bool],
    components: dict[str, Component],
    deadline: float,
    transport: MonikerTransport,
    progress: Progress = print,
) -> bool:
    """Until every table covers every offset and nothing is pending (True), or the deadline
    (False): a changelog table's rows plus the dead letters, an upsert table's committed offsets
    (one row per key, so its rows count nothing). Also False, early, once monikers stay pending
    and no table commits for `STALL_S` (they wait for something that will not come), or nothing
    is pending, committed or published for `IDLE_S` (records were lost)."""
    catalog = open_catalog(config)
    last_change = time.monotonic()
    last_seen: tuple[Any, ...] | None = None
    while time.monotonic() < deadline:
        for component in components.values():
            if not component.alive():
                # a crashed component (say, fenced) comes back, as a supervisor would
                component.start()
        loaded = {identifier: load_table_or_none(catalog, identifier) for identifier in tables}
        pending = transport.pending()
        if (
            all(
                _covers(config, loaded[identifier], upsert, topic, records)
                for identifier, upsert in tables.items()
            )
            and not pending
        ):
            return True
        seen = (
            tuple(
                table.current_snapshot().snapshot_id
                if table is not None and table.current_snapshot() is not None
                else None
                for table in loaded.values()
            ),
            frozenset(m.id for m in pending),
        )
        if seen != last_seen:
            last_seen, last_change = seen, time.monotonic()
        elif time.monotonic() - last_change > (STALL_S if pending else IDLE_S):
            progress(
                f"{len(pending)} monikers pending, no commit and no new moniker for "
                f"{time.monotonic() - last_change:.0f} s while the tables lack records: giving up "
                "settling"
            )
            return False
        time.sleep(2)
    return False


def _covers(
    config: IcekeeperConfig, table: Table | None, upsert: bool, topic: str, records: int
) -> bool:
    """Whether `table` has committed all `records` of `topic`."""
    if table is None or table.current_snapshot() is None:
        return False
    if upsert:
        return (
            sum(
                offset
                for (committed_topic, _), offset in committed_state(table).offsets.items()
                if committed_topic == topic
            )
            >= records
        )
    rows = int(table.current_snapshot().summary.additional_properties.get("total-records", 0))
    return rows + len(dead_letter_positions(config, topic + ".dlq")) >= records

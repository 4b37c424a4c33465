"""`icekeeper chaos`: kill -9 components at random moments, then prove exactly-once by offset.

Produces N synthetic records (schema changes, poison messages) to a fresh 4-partition topic,
then runs, as separate processes with the real CLI: two writers sharing the topic, the
bookkeeper, and the reaper on a short schedule. K times, at seeded random moments, one of them
is killed with SIGKILL and restarted. Once, the bookkeeper is paused (SIGSTOP) while a second
one takes over the lease and commits; resumed (SIGCONT), the first must stop fenced (exit 3).

At the end, by topic/partition/offset: every good record exactly once in the table
(`duplicates`, `missing`), every poison record in the dead-letter topic, and the table read by
Spark and DuckDB with the same row count.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from confluent_kafka import Consumer, TopicPartition

from common.catalog import load_table_or_none, open_catalog
from common.config import IcekeeperConfig, load_config
from common.transports import open_transport
from icekeeper.samples.produce import ensure_topic, produce_at_rate
from icekeeper.samples.synthetic import SyntheticSpec

Progress = Callable[[str], None]
TABLE = "chaos.orders"
PARTITIONS = 4
FENCED_EXIT = 3


@dataclass
class Component:
    """One icekeeper process that chaos may kill and restart."""

    name: str
    argv: list[str]
    env: dict[str, str]
    logs: Path
    process: subprocess.Popen | None = None
    starts: int = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.logs / f"{self.name}.{self.starts}.log", "wb")  # noqa: SIM115 - the child owns it
        self.process = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group: the Python driver and its Spark JVM."""
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()

    def terminate(self, timeout_s: float = 60) -> int | None:
        if not self.alive():
            return self.process.returncode if self.process else None
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None


@dataclass
class ChaosRun:
    kills: list[dict[str, Any]] = field(default_factory=list)
    fenced_exit_code: int | None = None
    restarts: int = 0


def chaos_environ(base: IcekeeperConfig, work: Path, topic: str, max_offsets: int = 500) -> dict[str, str]:
    """Settings every component gets (environment overrides on the embedded defaults)."""
    source = base.sources[0]
    return {
        "ICEKEEPER__STATE_DIR": str(work / "state"),
        "ICEKEEPER__CACHE_DIR": str(base.cache_dir),
        "ICEKEEPER__SOURCES__0__BOOTSTRAP_SERVERS": source.bootstrap_servers,
        "ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_URL": source.schema_registry_url or "",
        "ICEKEEPER__SOURCES__0__TOPICS": f"[{topic}]",
        "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": topic + ".dlq",
        "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": str(max_offsets),
        "ICEKEEPER__TABLES": f"[{{identifier: {TABLE}, topics: [{topic}], primary_key: [id], mode: changelog}}]",
        "ICEKEEPER__WRITER__SPARK_MASTER": "local[1]",
        "ICEKEEPER__WRITER__INSTANCE_COUNT": "2",
        "ICEKEEPER__BOOKKEEPER__LEASE_TTL": "6",
        "ICEKEEPER__REAPER__LEASE_TTL": "30",
        "ICEKEEPER__BOOKKEEPER__HTTP_PORT": "0",
        "ICEKEEPER__REAPER__SNAPSHOT_EXPIRE_TIME": "0",
        "ICEKEEPER__REAPER__RETAIN_LAST": "5",
        # Shorter than a slow batch here: writers' claims on their folders, not the grace, must
        # keep unpublished files (a 138 s batch against a 120 s grace once lost a committed file).
        "ICEKEEPER__REAPER__ORPHAN_GRACE": "30",
    }


def run_chaos(base: IcekeeperConfig, records: int, kills: int, seed: int, progress: Progress = print,
              timeout_s: float = 900) -> dict[str, Any]:
    started = time.monotonic()
    rng = random.Random(seed)
    work = Path(base.state_dir) / "chaos"
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    topic = f"chaos.{seed}.{uuid.uuid4().hex[:6]}"
    # Several batches per writer between kills, whatever the size of the run.
    overrides = chaos_environ(base, work, topic, max_offsets=max(500, records // 40))
    config = load_config(None, environ=overrides)
    spec = SyntheticSpec(seed=seed, keys=max(10, records // 10), events=records, schema_changes=2, poison_ratio=0.02,
                         server="chaos", db="shop", table="orders")
    ensure_topic(config.sources[0].bootstrap_servers, topic, PARTITIONS)

    environ = {**os.environ, **overrides}
    command = [sys.executable, "-m", "icekeeper.cli"]
    logs = work / "logs"
    components = {
        "writer-1": Component("writer-1", [*command, "writer", "--writer-id", "w1"], {**environ, "ICEKEEPER__WRITER__INSTANCE_INDEX": "0"}, logs),
        "writer-2": Component("writer-2", [*command, "writer", "--writer-id", "w2"], {**environ, "ICEKEEPER__WRITER__INSTANCE_INDEX": "1"}, logs),
        "bookkeeper": Component("bookkeeper", [*command, "bookkeeper"], environ, logs),
        "reaper": Component("reaper", [*command, "reaper", "--every", "20s"], environ, logs),
    }
    # Records arrive throughout the chaos (about 10 s per kill plus the pause), so kills land
    # in the middle of batches, commits and maintenance passes.
    produced: dict[str, Any] = {}
    rate = records / max(20.0, 10.0 * kills + 20.0)
    producer = threading.Thread(target=lambda: produced.update(produce_at_rate(config, spec, rate, topic=topic, partitions=PARTITIONS)))
    run = ChaosRun()
    try:
        for component in components.values():
            component.start()
        producer.start()
        progress(f"producing {records:,} records (+2% poison) at {rate:,.0f}/s to {topic} while killing")
        pause_at = rng.randint(0, kills) if kills else 0
        for index in range(kills + 1):
            if index == pause_at:
                _pause_and_fence(components, environ, command, logs, run, Path(config.bookkeeper.lease_uri) / config.bookkeeper.group, progress)
            if index == kills:
                break
            time.sleep(rng.uniform(4, 12))
            victim = components[rng.choice(sorted(components))]
            victim.kill()
            run.kills.append({"component": victim.name, "at_s": round(time.monotonic() - started, 1)})
            progress(f"kill -9 {victim.name} ({len(run.kills)}/{kills})")
            time.sleep(rng.uniform(0.5, 3))
            victim.start()
        producer.join()
        poison_expected = sum(produced["poison"].values())
        progress(f"chaos over; {produced['records']:,} records produced ({poison_expected} poison); waiting until all are settled")
        _wait_until_settled(config, topic, produced["records"], components, deadline=started + timeout_s)
    finally:
        for component in components.values():
            component.terminate()
    result = verify(config, overrides, topic, poison_expected)
    result.update({"kills": len(run.kills), "killed": Counter(k["component"] for k in run.kills), "fenced_exit_code": run.fenced_exit_code,
                   "seed": seed, "seconds": round(time.monotonic() - started, 1), "logs": str(logs)})
    return result


def lease_holder_pid(folder: Path) -> int | None:
    """The process id in the newest lease file of the bookkeeper group (owner `host:pid:nonce`)."""
    leases = sorted(folder.glob("lease-*.json"), key=lambda p: int(p.stem.split("-")[1])) if folder.exists() else []
    try:
        return int(json.loads(leases[-1].read_text())["owner"].split(":")[1]) if leases else None
    except (ValueError, KeyError, IndexError, OSError):
        return None


def _pause_and_fence(components: dict[str, Component], environ: dict[str, str], command: list[str], logs: Path, run: ChaosRun,
                     lease_folder: Path, progress: Progress) -> None:
    """SIGSTOP the bookkeeper; a second one takes the lease and commits; SIGCONT: the first is fenced."""
    first = components["bookkeeper"]
    if not first.alive():
        first.start()
    # Pause the active bookkeeper (holding the lease), not a standby waiting for it.
    deadline = time.monotonic() + 60
    while lease_holder_pid(lease_folder) != first.process.pid and time.monotonic() < deadline:
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


def _wait_until_settled(config: IcekeeperConfig, topic: str, records: int, components: dict[str, Component], deadline: float) -> None:
    """Until table rows + dead letters cover every offset and nothing is pending (or the deadline)."""
    catalog = open_catalog(config)
    transport = open_transport(config)
    while time.monotonic() < deadline:
        for component in components.values():
            if not component.alive():
                component.start()  # a crashed component (say, fenced) comes back, as a supervisor would
        table = load_table_or_none(catalog, TABLE)
        if table is not None and table.current_snapshot() is not None:
            rows = int(table.current_snapshot().summary.additional_properties.get("total-records", 0))
            dead = len(dead_letter_positions(config, topic + ".dlq"))
            if rows + dead >= records and not transport.pending():
                return
        time.sleep(2)


def dead_letter_positions(config: IcekeeperConfig, topic: str) -> set[tuple[int, int]]:
    """(source partition, source offset) of every record in the dead-letter topic."""
    consumer = Consumer({"bootstrap.servers": config.sources[0].bootstrap_servers, "group.id": f"chaos-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return set()
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in metadata.partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in metadata.partitions])
        positions, read = set(), 0
        while read < sum(ends.values()):
            message = consumer.poll(5)
            if message is None:
                break
            if message.error():
                continue
            read += 1
            headers = {k: v.decode() for k, v in (message.headers() or [])}
            positions.add((int(headers["icekeeper.source.partition"]), int(headers["icekeeper.source.offset"])))
        return positions
    finally:
        consumer.close()


def verify(config: IcekeeperConfig, overrides: dict[str, str], topic: str, poison_expected: int) -> dict[str, Any]:
    """Every offset of the topic: exactly once in the table, or in the dead-letter topic."""
    from icekeeper.readers import duckdb_rows

    table = open_catalog(config).load_table(TABLE)
    arrow = table.scan(selected_fields=("_kfk_partition", "_kfk_offset")).to_arrow()
    positions = Counter(zip(arrow.column("_kfk_partition").to_pylist(), arrow.column("_kfk_offset").to_pylist()))
    dead = dead_letter_positions(config, topic + ".dlq")
    consumer = Consumer({"bootstrap.servers": config.sources[0].bootstrap_servers, "group.id": "chaos-verify"})
    try:
        offsets = {(p, o) for p in range(PARTITIONS) for o in range(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1])}
    finally:
        consumer.close()
    duplicates = sum(count - 1 for count in positions.values() if count > 1)
    missing = len(offsets - set(positions) - dead)
    duckdb_count = int(duckdb_rows(table, "count(*) AS n")[0]["n"])
    spark_count = _spark_count(overrides)
    return {
        "records_in": len(offsets), "rows": sum(positions.values()), "duplicates": duplicates, "missing": missing,
        "dead_lettered": len(dead), "poison_expected": poison_expected, "poison_in_table": len(dead & set(positions)),
        "spark_rows": spark_count, "duckdb_rows": duckdb_count, "snapshots": len(table.snapshots()),
    }


def _spark_count(overrides: dict[str, str]) -> int:
    """Rows of the table as Spark counts them, in a process of its own: a SparkSession is one per
    process, and the caller's (a test's, say) must neither be reused with another catalog nor stopped."""
    code = ("from common.config import load_config; from common.spark import spark_session; c = load_config(None); "
            "s = spark_session(c, 'icekeeper-chaos-verify', master='local[1]'); "
            f"print(s.sql('SELECT count(*) FROM ' + c.catalog.name + '.{TABLE}').first()[0]); s.stop()")
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, **overrides}, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"Spark could not read {TABLE}: {result.stderr[-2000:]}")
    return int(result.stdout.strip().splitlines()[-1])

"""`icekeeper dead-letters list | replay`: what was set
aside, and putting it back once the cause is fixed.

Three places hold what did not reach a table:
- quarantined monikers, in the transport's dead-letter folder: monikers the bookkeeper could not
  read or commit (a file that is not Parquet or not what the moniker says, a file missing past
  `bookkeeper.missing_file_timeout`, an incompatible schema), each with its reason. Replay
  publishes the moniker again. The bookkeeper commits a replay
  once: the table's committed state lists the ids of the monikers it quarantined, and the commit
  of a replayed one takes its id off, in the same snapshot; a second replay, or a replay after a
  crash half way, is then a duplicate. (A moniker refused for overlapping offsets is not set aside
  at all: its writer reads its records again; one dead-lettered by an older version is dropped as
  a duplicate when replayed.)
- dead-lettered records, in each source's dead-letter topic: records a writer could not decode or
  route, raw, with the reason and their source topic, partition and offset in headers
  (`writers/dead_letters.py`). Replay produces them again to their source topic, as Kafka Connect
  users replay a dead-letter queue: the writers read them like any new record, so a fixed schema
  registry or routing rule applies to them. (For upsert tables a replayed change lands after the
  changes the key had since: replay only what the mirror can take out of order, or rebuild it.)

- rewrite requests the bookkeeper set aside, beside each upsert table
  (`<table>/icekeeper/rewrites/set-aside/`): a compaction or purge whose files storage said were
  missing for `bookkeeper.missing_file_timeout`, or a request file that is not a request, with the
  reason. Their files are kept (orphan removal spares them). Replay publishes the request again;
  the bookkeeper commits it once (its snapshot names it), or sets it aside again.

Exactly once, for records: the replay consumer group's offsets on the dead-letter topic say what
was replayed, and a batch in flight is marked in them first (see `replay_records`), so a replay
that dies resumes after the last batch it finished and never produces a record twice. A
dead-lettered copy whose source record is already in a table (a writer that dead-lettered it,
died, and decoded it after a restart), or that repeats one replayed before (the writer
dead-lettered its batch twice), is skipped: the tables' Kafka metadata columns and the source
coordinates of the copies replayed before tell.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from icekeeper.common.config.model import IcekeeperConfig, KafkaSource
from icekeeper.common.exit_codes import UsageError
from icekeeper.common.transports.base import MonikerTransport, Quarantined

if TYPE_CHECKING:
    from confluent_kafka import Message
    from pyiceberg.catalog import Catalog

    from icekeeper.common.rewrites import SetAsideRewrite

# The headers `writers/dead_letters.py` adds (that module imports PySpark, which `icekeeper --help`
# should not wait for).
REASON_HEADER = "icekeeper.reason"
SOURCE_TOPIC_HEADER = "icekeeper.source.topic"
SOURCE_PARTITION_HEADER = "icekeeper.source.partition"
SOURCE_OFFSET_HEADER = "icekeeper.source.offset"

log = logging.getLogger(__name__)

REPLAY_OF_HEADER = "icekeeper.replay.of"
"""Added to a replayed record:
`<dead-letter topic>/<partition>/<offset>` of the copy it came from."""
REPLAY_BATCH = 1000
"""Records per Kafka transaction."""

SourceRecord = tuple[str, int, int]
"""A record's source topic, partition and offset."""


@dataclass(frozen=True)
class DeadLetteredRecord:
    """One record of a dead-letter topic: where it sits, where it came from, why."""

    topic: str
    partition: int
    offset: int
    source: SourceRecord | None
    reason: str
    key: bytes | None = field(default=None, repr=False)
    value: bytes | None = field(default=None, repr=False)
    headers: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)

    def to_json(self) -> dict:
        source = (
            None
            if self.source is None
            else {"topic": self.source[0], "partition": self.source[1], "offset": self.source[2]}
        )
        return {
            "dead_letter": f"{self.topic}/{self.partition}/{self.offset}",
            "source": source,
            "reason": self.reason,
        }


@dataclass
class RecordReplay:
    """What replaying one dead-letter topic did."""

    dead_letter_topic: str
    replayed: int = 0
    already_in_a_table: int = 0
    already_replayed: int = 0
    without_source: int = 0
    """Copies without source headers: nothing says where they belong (not icekeeper's)."""


def add_dead_letter_arguments(parser: argparse.ArgumentParser) -> None:
    """`list` / `replay` and their options (the command itself is registered in `icekeeper.cli`)."""
    parser.add_argument("action", choices=["list", "replay"])
    parser.add_argument(
        "--monikers",
        action="store_true",
        help="only quarantined monikers (default: monikers and records)",
    )
    parser.add_argument(
        "--records", action="store_true", help="only records of the sources' dead-letter topics"
    )
    parser.add_argument(
        "--rewrites",
        action="store_true",
        help="only rewrite requests (compactions, purges) the bookkeeper set aside",
    )
    parser.add_argument(
        "--name",
        action="append",
        default=None,
        metavar="NAME",
        help="replay: only the quarantined moniker(s) or set-aside rewrite request(s) of this "
        "name (as `list` shows them; no record unless --records); repeatable; an unknown name "
        "replays nothing and exits 2",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to read a dead-letter topic to its end"
    )


def run_dead_letters(config: IcekeeperConfig, args: argparse.Namespace) -> int:
    from icekeeper.common.catalog import open_catalog
    from icekeeper.common.transports import open_transport

    everything = not (args.monikers or args.records or args.rewrites)
    monikers = args.monikers or everything
    records = args.records or everything
    rewrites = args.rewrites or everything
    transport = open_transport(config)
    if args.action == "list":
        listing = {
            "monikers": [_moniker_json(item) for item in transport.quarantined()]
            if monikers
            else [],
            "records": [
                record.to_json()
                for source in config.sources
                for record in dead_lettered_records(source, args.timeout)
            ]
            if records
            else [],
            "rewrites": [
                _rewrite_json(table, entry)
                for table, _, entry in set_aside_rewrites_of(config, open_catalog(config))
            ]
            if rewrites
            else [],
        }
        if args.json:
            print(json.dumps(listing))
        else:
            _print_listing(listing)
        return 0
    if args.name:
        # Names select monikers and rewrite requests; records have none, so `--name` alone
        # replays no record. A name that matches nothing is a typo, said before anything moves.
        records = args.records
        known = {item.name for item in transport.quarantined()} if monikers else set()
        if rewrites:
            set_aside = set_aside_rewrites_of(config, open_catalog(config))
            known |= {entry.request_id for _, _, entry in set_aside}
        unknown = sorted(set(args.name) - known)
        if unknown:
            kinds = " or ".join(
                kind
                for kind, chosen in (
                    ("quarantined moniker", monikers),
                    ("set-aside rewrite request", rewrites),
                )
                if chosen
            )
            raise UsageError(
                f"no {kinds or 'moniker or rewrite request (--name selects those)'} named "
                f"{', '.join(unknown)}: nothing replayed (`icekeeper dead-letters list` shows the "
                "names)"
            )
    outcome: dict = {"monikers": [], "records": [], "rewrites": []}
    if monikers:
        outcome["monikers"] = replay_monikers(transport, args.name)
    if rewrites:
        outcome["rewrites"] = replay_rewrites(config, open_catalog(config), args.name)
    if records:
        catalog = open_catalog(config)
        outcome["records"] = [
            asdict(replay_records(config, source, catalog, args.timeout))
            for source in config.sources
        ]
    if args.json:
        print(json.dumps(outcome))
    else:
        for name in outcome["monikers"]:
            print(f"moniker {name}: published again")
        for name in outcome["rewrites"]:
            print(f"rewrite request {name}: published again")
        for replay in outcome["records"]:
            print(
                f"records of {replay['dead_letter_topic']}: {replay['replayed']} produced again to "
                f"their source topics; skipped {replay['already_in_a_table']} already in a table, "
                f"{replay['already_replayed']} replayed before, {replay['without_source']} without "
                "source headers"
            )
    return 0


# -- monikers ------------------------------------------------------------------------------------


def replay_monikers(transport: MonikerTransport, names: Iterable[str] | None = None) -> list[str]:
    """Publish quarantined monikers again (all, or those `names`); returns the names replayed.
    Unreadable ones stay where they are: there is no moniker to publish."""
    wanted = set(names) if names else None
    replayed = []
    for item in transport.quarantined():
        if wanted is not None and item.name not in wanted:
            continue
        if item.moniker is None:
            log.warning(
                "not a readable moniker; left in the dead-letter place",
                extra={"name": item.name, "reason": item.reason},
            )
            continue
        transport.replay(item)
        replayed.append(item.name)
    return replayed


def _moniker_json(item: Quarantined) -> dict:
    moniker = item.moniker
    facts: dict = {
        "name": item.name,
        "reason": item.reason,
        "source": item.source,
        "quarantined_ms": item.quarantined_ms,
    }
    if moniker is not None:
        facts.update(
            table=moniker.table,
            writer_id=moniker.writer_id,
            seq=moniker.seq,
            records=moniker.records,
            files=len(moniker.files),
            offsets=[
                f"{r.topic}[{r.partition}] {r.from_offset}..{r.until_offset}"
                for r in moniker.offsets
            ],
        )
    return facts


# -- rewrite requests ----------------------------------------------------------------------------


def set_aside_rewrites_of(
    config: IcekeeperConfig, catalog: Catalog
) -> list[tuple[str, str, SetAsideRewrite]]:
    """(table, its location, entry) of every rewrite request set aside for the upsert tables."""
    from icekeeper.common.catalog import load_table_or_none
    from icekeeper.common.rewrites import set_aside_rewrites

    found = []
    for spec in config.tables:
        table = load_table_or_none(catalog, spec.identifier) if spec.upsert else None
        if table is not None:
            found.extend(
                (spec.identifier, table.location(), entry)
                for entry in set_aside_rewrites(table.location())
            )
    return found


def replay_rewrites(
    config: IcekeeperConfig, catalog: Catalog, names: Iterable[str] | None = None
) -> list[str]:
    """Publish set-aside rewrite requests again (all, or those `names`); returns the names
    replayed. Unreadable ones stay where they are: there is no request to publish."""
    from icekeeper.common.rewrites import replay_set_aside

    wanted = set(names) if names else None
    replayed = []
    for _, location, entry in set_aside_rewrites_of(config, catalog):
        if wanted is not None and entry.request_id not in wanted:
            continue
        if entry.request is None:
            log.warning(
                "not a readable rewrite request; left set aside",
                extra={"name": entry.request_id, "reason": entry.reason},
            )
            continue
        replay_set_aside(location, entry)
        replayed.append(entry.request_id)
    return replayed


def _rewrite_json(table: str, entry: SetAsideRewrite) -> dict:
    facts: dict = {
        "name": entry.request_id,
        "table": table,
        "reason": entry.reason,
        "set_aside_ms": entry.set_aside_ms,
    }
    if entry.request is not None:
        facts.update(
            origin=entry.request.origin,
            files_replaced=len(entry.request.replaced),
            files=len(entry.request.files),
            output_folder=entry.request.output_folder,
        )
    return facts


def _print_listing(listing: dict) -> None:
    print(f"quarantined monikers: {len(listing['monikers'])}")
    for item in listing["monikers"]:
        what = (
            f"{item['table']} writer {item['writer_id']} seq {item['seq']}, {item['records']} "
            "records"
            if "table" in item
            else "unreadable"
        )
        print(f"  {item['name']}  {what}\n      {item['reason']}")
    print(f"dead-lettered records: {len(listing['records'])}")
    for record in listing["records"]:
        source = record["source"]
        where = (
            f"{source['topic']}[{source['partition']}]@{source['offset']}"
            if source
            else "unknown source"
        )
        print(f"  {record['dead_letter']}  from {where}\n      {record['reason']}")
    print(f"set-aside rewrite requests: {len(listing['rewrites'])}")
    for item in listing["rewrites"]:
        what = (
            f"{item['table']} {item['origin']}, {item['files']} files replacing "
            f"{item['files_replaced']}"
            if "origin" in item
            else f"{item['table']} unreadable"
        )
        print(f"  {item['name']}  {what}\n      {item['reason']}")


# -- records -------------------------------------------------------------------------------------


def dead_lettered_records(source: KafkaSource, timeout_s: float = 60.0) -> list[DeadLetteredRecord]:
    """Every record of the source's dead-letter topic, in offset order per partition."""
    from icekeeper.samples.readback import topic_messages

    return [
        _record(message) for message in topic_messages(source, source.dead_letter_topic, timeout_s)
    ]


def replay_group(source: KafkaSource) -> str:
    """The consumer group whose offsets on the dead-letter topic mark what was replayed."""
    return f"icekeeper-dead-letter-replay.{source.name}"


def replay_records(
    config: IcekeeperConfig, source: KafkaSource, catalog: Catalog, timeout_s: float = 60.0
) -> RecordReplay:
    """Produce the source's dead-lettered records not
    replayed yet to their source topics, exactly once.

    Not in Kafka transactions: a transaction's commit marker takes an offset of the source topic,
    and writers refuse offsets without a record (`sources[].offset_gaps`). Instead, before each
    batch the replay group's offsets on the dead-letter topic are committed again, unchanged, with
    the source partitions' end offsets as their metadata, and after it, moved past the batch. A
    replay that finds such a mark (its predecessor died mid-batch) reads the source partitions
    from the marked offsets and skips the copies whose `icekeeper.replay.of` it finds there.
    """
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    from icekeeper.common.kafka_clients import librdkafka_config

    outcome = RecordReplay(source.dead_letter_topic)
    records = dead_lettered_records(source, timeout_s)
    if not records:
        return outcome
    topic = source.dead_letter_topic
    consumer = Consumer(
        librdkafka_config(source, {"group.id": replay_group(source), "enable.auto.commit": False}),
        logger=logging.getLogger("librdkafka"),
    )
    producer = Producer(
        librdkafka_config(source, {"enable.idempotence": True, "acks": "all", "linger.ms": 5}),
        logger=logging.getLogger("librdkafka"),
    )
    try:
        partitions = sorted({record.partition for record in records})
        committed = {
            tp.partition: tp
            for tp in consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
        }
        positions = {p: max(0, tp.offset) for p, tp in committed.items()}
        marks: dict[str, int] = {}
        for tp in committed.values():
            marks.update(json.loads(tp.metadata).get("producing_from", {}) if tp.metadata else {})
        produced_before = _replayed_copies(source, marks, timeout_s)
        done = {
            record.source
            for record in records
            if record.offset < positions[record.partition] and record.source is not None
        }
        todo = [record for record in records if record.offset >= positions[record.partition]]
        in_tables = _already_in_tables(
            config, catalog, {record.source for record in todo if record.source is not None}
        )
        for start in range(0, len(todo), REPLAY_BATCH):
            batch = todo[start : start + REPLAY_BATCH]
            sending = []
            for record in batch:
                if record.source is None:
                    outcome.without_source += 1
                elif record.source in done or _copy_name(record) in produced_before:
                    outcome.already_replayed += 1
                elif record.source in in_tables:
                    outcome.already_in_a_table += 1
                else:
                    sending.append(record)
                if record.source is not None:
                    done.add(record.source)
            targets = {(r.source[0], r.source[1]) for r in sending}
            ends = {
                f"{t}/{p}": consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1]
                for t, p in targets
            }
            mark = json.dumps({"producing_from": ends})
            consumer.commit(
                offsets=[TopicPartition(topic, p, positions[p], metadata=mark) for p in partitions],
                asynchronous=False,
            )
            failures: list[str] = []
            for record in sending:
                producer.produce(
                    record.source[0],
                    key=record.key,
                    value=record.value,
                    partition=record.source[1],
                    headers=[
                        *_own_headers(record.headers),
                        (REPLAY_OF_HEADER, _copy_name(record).encode()),
                    ],
                    # Delivery reports run inside `flush` below, in this same iteration.
                    on_delivery=lambda error, _: failures.append(str(error)) if error else None,  # noqa: B023
                )
                producer.poll(0)
            if producer.flush(60) or failures:
                raise KafkaException(
                    f"replayed records not delivered: {failures[:3] or 'flush timed out'}"
                )
            outcome.replayed += len(sending)
            for record in batch:
                positions[record.partition] = max(positions[record.partition], record.offset + 1)
            consumer.commit(
                offsets=[TopicPartition(topic, p, positions[p], metadata="") for p in partitions],
                asynchronous=False,
            )
    finally:
        consumer.close()
    log.info("dead-lettered records replayed", extra=asdict(outcome))
    return outcome


def _copy_name(record: DeadLetteredRecord) -> str:
    """What `icekeeper.replay.of` says of a replayed record: the dead-lettered copy it came from."""
    return f"{record.topic}/{record.partition}/{record.offset}"


def _replayed_copies(source: KafkaSource, marks: dict[str, int], timeout_s: float) -> set[str]:
    """The `icekeeper.replay.of` values of records in
    the source partitions from the marked offsets on."""
    from icekeeper.samples.readback import partition_messages

    starts = {
        (name.rsplit("/", 1)[0], int(name.rsplit("/", 1)[1])): offset
        for name, offset in marks.items()
    }
    found: set[str] = set()
    for message in partition_messages(source, starts, timeout_s):
        headers = dict(message.headers() or [])
        if REPLAY_OF_HEADER in headers:
            found.add(headers[REPLAY_OF_HEADER].decode())
    return found


def _already_in_tables(
    config: IcekeeperConfig, catalog: Catalog, sources: set[SourceRecord]
) -> set[SourceRecord]:
    """The source records among `sources` that a configured table holds, by its Kafka metadata
    columns (tables without them cannot tell, and are not asked)."""
    from pyiceberg.expressions import And, EqualTo, In

    from icekeeper.common.catalog import load_table_or_none

    kafka = config.metadata_columns.kafka
    names = {
        field: f"{kafka.prefix}{field}"
        for field in ("topic", "partition", "offset")
        if field in kafka.columns
    }
    if not sources or len(names) < 3:
        return set()
    by_partition: dict[tuple[str, int], list[int]] = {}
    for topic, partition, offset in sources:
        by_partition.setdefault((topic, partition), []).append(offset)
    found: set[SourceRecord] = set()
    for spec in config.tables:
        table = load_table_or_none(catalog, spec.identifier)
        if table is None or not set(names.values()) <= set(table.schema().column_names):
            continue
        for (topic, partition), offsets in by_partition.items():
            condition = And(
                EqualTo(names["topic"], topic),
                EqualTo(names["partition"], partition),
                In(names["offset"], offsets),
            )
            rows = (
                table.scan(row_filter=condition, selected_fields=(names["offset"],))
                .to_arrow()
                .column(0)
                .to_pylist()
            )
            found.update((topic, partition, offset) for offset in rows)
    return found


def _record(message: Message) -> DeadLetteredRecord:
    headers = tuple((name, value or b"") for name, value in (message.headers() or []))
    ours = {name: value.decode("utf-8", "replace") for name, value in headers}
    source = None
    if {SOURCE_TOPIC_HEADER, SOURCE_PARTITION_HEADER, SOURCE_OFFSET_HEADER} <= ours.keys():
        source = (
            ours[SOURCE_TOPIC_HEADER],
            int(ours[SOURCE_PARTITION_HEADER]),
            int(ours[SOURCE_OFFSET_HEADER]),
        )
    return DeadLetteredRecord(
        message.topic(),
        message.partition(),
        message.offset(),
        source,
        ours.get(REASON_HEADER, ""),
        message.key(),
        message.value(),
        headers,
    )


def _own_headers(headers: Iterable[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """The record's own headers, without those the dead-lettering added."""
    added = {REASON_HEADER, SOURCE_TOPIC_HEADER, SOURCE_PARTITION_HEADER, SOURCE_OFFSET_HEADER}
    return [(name, value) for name, value in headers if name not in added]

"""One source's batch into every table it feeds: engine, dead letters, reconciliation, monikers.

The configured engine writes the batch (`writers/engines.py`); one that cannot take it says why,
and the batch runs on `spark-sql` instead. Then, if the writing pass failed any record, the
dead-letter pass finds them (`spark_sql_engine/rejected_records.py`), whichever engine wrote: a
dead letter naming a schema id the registry knows under another subject, or a delete without
`before` whose record key names a key schema the writer did not know yet, makes the batch be
written again with that schema (schemas are learnt this way, by id: batches without such records
never ask the registry); unknown schema ids the registry is to blame for pause the writer
(`registry.registry_outage`). Every record read must then be accounted for once
(`reconciliation.py`). A batch the arrow engine wrote whose counts do not reconcile (the engines
classify some record differently, a bug) is written again on `spark-sql`, whose counts come from
the same classification as the dead-letter pass, its arrow files discarded first; a batch
`spark-sql` wrote that does not reconcile fails loudly. Each fallback is counted
(`BatchOutcome.fallback`) and logged (`FallbackLog`: a refusal once per source and kind,
every unreconciled batch). Dead
letters are sent for the write that is published only (not per attempt), once it reconciles and
before the monikers are returned: a moniker covers its whole offset range, poison included, so
once it is published a restart never reads these records again (chaos found it; a writer dying
in between sends them again, `dead_letters.py`). The monikers come back to the caller, which
publishes them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from pyiceberg.catalog import Catalog
from pyspark.sql import SparkSession

from icekeeper.common.config.model import IcekeeperConfig, KafkaSource
from icekeeper.common.in_flight import InFlightClaims
from icekeeper.common.moniker import Moniker
from icekeeper.common.source_formats import source_format
from icekeeper.writers.arrow_engine.arrow_batch import ArrowEngine
from icekeeper.writers.engines import EngineRefusal, EngineWrite, SourceBatch, WriterEngine
from icekeeper.writers.files import discard_output
from icekeeper.writers.key_columns import record_keys_for
from icekeeper.writers.offsets import BatchPlan
from icekeeper.writers.progress import TableProgress
from icekeeper.writers.reconciliation import (
    BatchIntake,
    BatchUnreconciled,
    discrepancies,
    ledger,
)
from icekeeper.writers.registry import (
    RegisteredSchema,
    RegistryUnavailable,
    TopicSchemas,
    registry_outage,
)
from icekeeper.writers.routing import Routes
from icekeeper.writers.spark_sql_engine.rejected_records import DeadLetterPass, RejectedRecords
from icekeeper.writers.spark_sql_engine.sql_batch import SparkSqlEngine
from icekeeper.writers.table_batch import TableBatches

log = logging.getLogger(__name__)
UNRECONCILED = "unreconciled"
"""The kind of fallback of a batch the configured engine wrote but whose counts did not reconcile
(`icekeeper_writer_engine_fallbacks_total`'s reason)."""


class BatchIncomplete(RuntimeError):
    """Kafka returned fewer records than the planned offsets span; nothing was published (a
    failed read from Kafka, `icekeeper_writer_kafka_read_errors_total`)."""


@dataclass
class BatchOutcome:
    """What writing one source's batch gave: monikers
    to publish, and counts for the batch report."""

    monikers: list[Moniker] = field(default_factory=list)
    rows: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    output_dirs: list[str] = field(default_factory=list)
    failed: int = 0
    tombstones: int = 0
    intake: BatchIntake | None = None
    """What the writing pass counted, reconciled with the dead letters before the monikers are
    returned (`writers/reconciliation.py`)."""
    fallback: str | None = None
    """Why `spark-sql` wrote the batch instead of the configured engine: the kind of reason that
    engine gave for not taking it (`EngineRefusal.kind`), or `UNRECONCILED` (what it wrote did
    not reconcile); None when the configured engine wrote it."""

    def skipped_tombstones(self, source: KafkaSource) -> int:
        return self.tombstones if source.tombstones == "skip" else 0

    def dead_lettered(self, source: KafkaSource) -> int:
        """Failed records that go to the dead-letter topic (skipped tombstones do not)."""
        return self.failed - self.skipped_tombstones(source)


class SourceBatchWriter:
    """Writes sources' batches for one writer; remembers per source the record key schemas its
    deletes without `before` named so far."""

    def __init__(
        self,
        config: IcekeeperConfig,
        spark: SparkSession,
        catalog: Catalog,
        writer_id: str,
        claims: InFlightClaims,
        tables: dict[str, TableProgress],
        schemas: dict[str, TopicSchemas],
    ) -> None:
        self.config = config
        self.schemas = schemas
        self.tables = TableBatches(config, catalog, writer_id, claims, tables)
        self.spark_sql = SparkSqlEngine(config, spark, self.tables)
        self.engine: WriterEngine = (
            ArrowEngine(config, spark, catalog, self.tables)
            if config.writer.engine == "arrow"
            else self.spark_sql
        )
        self.dead_letter_pass = DeadLetterPass(config, spark, self.spark_sql.decode)
        self.fallbacks = FallbackLog()
        self._key_schemas: dict[str, list[RegisteredSchema]] = {}
        """Per Avro source, the key schemas its deletes without
        `before` named so far (`_learn_key_schemas`)."""

    def write(
        self,
        source: KafkaSource,
        plan: BatchPlan,
        seq: int,
        schemas: list[RegisteredSchema],
        routes: Routes,
    ) -> BatchOutcome:
        """Write the batch's files, then send its dead letters (nothing is published yet; see the
        module docstring)."""
        batch = SourceBatch(source, plan, seq, routes, schemas, self._key_schemas_of(source))
        # Set when the batch is written again on `spark-sql` (None: the configured engine writes
        # it, or says why not).
        fallback: str | None = None
        while True:
            outcome = self._write_tables(batch, fallback)
            rejected: RejectedRecords | None = None
            dead_letters: dict[str, int] = {}
            try:
                while outcome.dead_lettered(source):
                    # Cached (poison is a handful of rows): counted by reason, searched for schema
                    # ids and sent without reading the batch again.
                    rejected = self.dead_letter_pass.rejected(batch)
                    registered = self._newly_registered(batch, rejected)
                    learnt_keys = self._learn_key_schemas(batch, rejected)
                    if not registered and not learnt_keys:
                        break
                    rejected.release()
                    rejected = None
                    discard_output(outcome.output_dirs)
                    batch = replace(
                        batch,
                        schemas=batch.schemas + registered,
                        key_schemas=self._key_schemas_of(source),
                    )
                    outcome = self._write_tables(batch, fallback)
                if rejected is not None:
                    dead_letters = rejected.by_reason()
                    outcome.errors = dict(dead_letters)
                    if outcome.errors.get("unknown-schema-id") and (
                        outage := self._registry_outage(batch, rejected)
                    ):
                        raise RegistryUnavailable(outage)
                if not self._reconciled(batch, outcome, dead_letters):
                    fallback = UNRECONCILED
                    continue
                if rejected is not None:
                    rejected.send(source)
            except (RegistryUnavailable, BatchUnreconciled):
                # Nothing of the batch is published or dead-lettered: the writer pauses
                # and reads it again, or fails the batch loudly.
                discard_output(outcome.output_dirs)
                raise
            finally:
                if rejected is not None:
                    rejected.release()
            return outcome

    def _reconciled(
        self, batch: SourceBatch, outcome: BatchOutcome, dead_letters: dict[str, int]
    ) -> bool:
        """True when every record the batch read is accounted for once (`reconciliation.py`).
        False when the configured engine wrote it and it does not reconcile: its files are
        discarded (no moniker names them, nothing was dead-lettered), logged with its offsets,
        and `spark-sql`, whose counts come from the same classification as the dead-letter
        pass, is to write the batch. A batch `spark-sql` wrote that does not reconcile raises
        `BatchUnreconciled`, logged at error level with the counts."""
        source, plan, seq = batch.source, batch.plan, batch.seq
        unreconciled = _unreconciled(source, outcome, dead_letters)
        if unreconciled is None:
            return True
        details = {
            "seq": seq,
            "offsets": _offsets(plan),
            "problems": unreconciled.problems,
            **unreconciled.counts,
        }
        if outcome.fallback is None and self.engine is not self.spark_sql:
            discard_output(outcome.output_dirs)
            self.fallbacks.fell_back(
                source,
                UNRECONCILED,
                "writer.engine arrow's counts of this batch do not reconcile with the dead-letter "
                "pass; its files are discarded and it runs on spark-sql",
                **details,
            )
            return False
        log.error(
            "batch does not reconcile; nothing of it is published or dead-lettered, its files "
            "are discarded",
            extra={"source": source.name, **details},
        )
        raise unreconciled

    def _key_schemas_of(self, source: KafkaSource) -> list[RegisteredSchema]:
        return list(self._key_schemas.get(source.name, []))

    def _write_tables(self, batch: SourceBatch, fallback: str | None = None) -> BatchOutcome:
        """The configured engine's write of the batch, or `spark-sql`'s where it refuses or a
        `fallback` is given, with a moniker for each table it wrote files for."""
        if fallback is None:
            written = self.engine.write(batch)
            if isinstance(written, EngineRefusal):
                self.fallbacks.fell_back(
                    batch.source,
                    written.kind,
                    "writer.engine arrow does not take this batch; it runs on spark-sql",
                    reason=written.reason,
                )
                fallback = written.kind
                written = self.spark_sql.write(batch)
        else:
            written = self.spark_sql.write(batch)
        assert isinstance(written, EngineWrite)
        if not batch.source.offset_gaps and written.records != batch.plan.records:
            discard_output(written.output_dirs)
            raise BatchIncomplete(
                f"read {written.records} records where offsets span {batch.plan.records}; the "
                "batch is retried"
            )
        outcome = BatchOutcome(
            output_dirs=written.output_dirs,
            failed=written.intake.failed,
            tombstones=written.intake.tombstones,
            intake=written.intake,
            fallback=fallback,
        )
        for table in written.tables:
            moniker = self.tables.moniker(table.table, batch.plan, batch.seq, table.files)
            if moniker is None:
                discard_output([table.table.output_uri])  # no rows: nothing refers to the folder
                continue
            outcome.monikers.append(moniker)
            outcome.rows += moniker.records
        return outcome

    def _newly_registered(
        self, batch: SourceBatch, rejected: RejectedRecords
    ) -> list[RegisteredSchema]:
        """Schemas the registry knows by id that dead
        letters of this batch name but the batch's schemas lack."""
        if not source_format(batch.source.format).registry:
            return []
        known = {schema.schema_id for schema in batch.schemas}
        found = [
            self.schemas[batch.source.name].by_id(schema_id)
            for schema_id in rejected.unknown_schema_ids()
            if schema_id not in known
        ]
        return [schema for schema in found if schema is not None]

    def _registry_outage(self, batch: SourceBatch, rejected: RejectedRecords) -> str | None:
        """Why the unknown schema ids of the rejected records are the registry's fault
        (`registry_outage`), or None."""
        registry = self.schemas[batch.source.name]
        try:
            subjects: list[str] | RegistryUnavailable = registry.subjects()
        except RegistryUnavailable as error:
            subjects = error
        schema_ids = [schema.schema_id for schema in batch.schemas]
        return registry_outage(
            subjects,
            rejected.unknown_schema_topics(),
            lambda topics: self.dead_letter_pass.topics_naming(batch, topics, schema_ids),
        )

    def _learn_key_schemas(self, batch: SourceBatch, rejected: RejectedRecords) -> bool:
        """Remember the registry's key schemas that deletes without `before` among the rejected
        records name by id and the writer lacks; True when it found any (then the batch is
        written again)."""
        source = batch.source
        if (
            not source_format(source.format).record_keys
            or record_keys_for(batch.routes.tables, batch.key_schemas) is None
        ):
            return False
        known = self._key_schemas.setdefault(source.name, [])
        ids = rejected.key_schema_ids() - {schema.schema_id for schema in known}
        found = [
            schema
            for schema_id in sorted(ids)
            if (schema := self.schemas[source.name].by_id(schema_id)) is not None
        ]
        known.extend(found)
        return bool(found)


class FallbackLog:
    """Says that a source's batch runs on `spark-sql` instead of the configured engine: an
    expected refusal once per source and kind of reason (`EngineRefusal.kind`) for one writer (a
    reason's text names counts, columns and ids that change from batch to batch, and
    `icekeeper_writer_engine_fallbacks_total` counts every batch); an `UNRECONCILED` batch every
    time, with its offsets and problems, since it means the engine lost or miscounted records and
    each occurrence is evidence for the bug report."""

    def __init__(self) -> None:
        self._logged: set[tuple[str, str]] = set()

    def fell_back(self, source: KafkaSource, kind: str, message: str, **details: object) -> None:
        """Log `message` at warning level with `details`, unless this source's batches fell back
        for this (expected) kind before."""
        if kind != UNRECONCILED and (source.name, kind) in self._logged:
            return
        self._logged.add((source.name, kind))
        log.warning(message, extra={"source": source.name, "kind": kind, **details})


def _unreconciled(
    source: KafkaSource, outcome: BatchOutcome, dead_letters: dict[str, int]
) -> BatchUnreconciled | None:
    """Why a record the batch read would land nowhere, or twice: written, dead-lettered or
    skipped (`reconciliation.py`), with the counts; None when every record is accounted for."""
    if outcome.intake is None:
        return None
    skip = source.tombstones == "skip"
    problems = discrepancies(outcome.intake, dead_letters, skip)
    if not problems:
        return None
    return BatchUnreconciled(problems, ledger(outcome.intake, dead_letters, skip))


def _offsets(plan: BatchPlan) -> dict[str, list[int]]:
    """The batch's offset ranges, for a log line: "topic:partition" -> [from, until]."""
    return {f"{t}:{p}": list(span) for (t, p), span in sorted(plan.read_ranges.items())}

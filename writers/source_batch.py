"""One source's batch into every table it feeds: engine, dead letters, reconciliation, monikers.

The configured engine writes the batch (`writers/engines.py`); one that cannot take it says why,
and the batch runs on `spark-sql` instead, logged once per source and kind of reason
(`FallbackLog`). Then, if the
writing pass failed any record, the dead-letter pass finds them (`spark_sql_engine/
rejected_records.py`), whichever engine wrote: a dead letter naming a schema id the registry
knows under another subject, or a delete without `before` whose record key names a key schema
the writer did not know yet, makes the batch be written again with that schema (schemas are
learnt this way, by id: batches without such records never ask the registry); unknown schema
ids the registry is to blame for pause the writer (`registry.registry_outage`). Every record
read must then be accounted for once (`reconciliation.py`), or the batch fails loudly. Dead
letters are sent before the monikers are returned: a moniker covers its whole offset range,
poison included, so once it is published a restart never reads these records again (chaos found
it). The monikers come back to the caller, which publishes them.
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
    """The kind of reason the configured engine gave for not taking the batch, which `spark-sql`
    then wrote (`EngineRefusal.kind`); None when it took it."""

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
        outcome = self._write_tables(batch)
        rejected: RejectedRecords | None = None
        dead_letters: dict[str, int] = {}
        try:
            while outcome.dead_lettered(source):
                # Cached (poison is a handful of rows): counted by reason, searched for schema ids
                # and sent without reading the batch again.
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
                outcome = self._write_tables(batch)
            if rejected is not None:
                dead_letters = rejected.by_reason()
                outcome.errors = dict(dead_letters)
                if outcome.errors.get("unknown-schema-id") and (
                    outage := self._registry_outage(batch, rejected)
                ):
                    raise RegistryUnavailable(outage)
            _reconcile(source, plan, seq, outcome, dead_letters)
            if rejected is not None:
                rejected.send(source)
        except (RegistryUnavailable, BatchUnreconciled):
            # Nothing of the batch is published or dead-lettered: the writer pauses
            # and reads it again, or fails the batch loudly (`_reconcile`).
            discard_output(outcome.output_dirs)
            raise
        finally:
            if rejected is not None:
                rejected.release()
        return outcome

    def _key_schemas_of(self, source: KafkaSource) -> list[RegisteredSchema]:
        return list(self._key_schemas.get(source.name, []))

    def _write_tables(self, batch: SourceBatch) -> BatchOutcome:
        """The configured engine's write of the batch, or `spark-sql`'s where it refuses, with a
        moniker for each table it wrote files for."""
        written = self.engine.write(batch)
        fallback = None
        if isinstance(written, EngineRefusal):
            self.fallbacks.fell_back(
                batch.source,
                written.kind,
                "writer.engine arrow does not take this batch; it runs on spark-sql",
                reason=written.reason,
            )
            fallback = written.kind
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
    """Says that a source's batch runs on `spark-sql` instead of the configured engine, once per
    source and kind of reason (`EngineRefusal.kind`) for one writer: a reason's
    text names counts, columns and ids that change from batch to batch, and
    `icekeeper_writer_engine_fallbacks_total` counts every batch."""

    def __init__(self) -> None:
        self._logged: set[tuple[str, str]] = set()

    def fell_back(self, source: KafkaSource, kind: str, message: str, **details: object) -> None:
        """Log `message` at warning level with `details`, unless this source's batches fell back
        for this kind before."""
        if (source.name, kind) in self._logged:
            return
        self._logged.add((source.name, kind))
        log.warning(message, extra={"source": source.name, "kind": kind, **details})


def _reconcile(
    source: KafkaSource,
    plan: BatchPlan,
    seq: int,
    outcome: BatchOutcome,
    dead_letters: dict[str, int],
) -> None:
    """Raise `BatchUnreconciled`, logged at error level with the counts, when a record the batch
    read would land nowhere, or twice: written, dead-lettered or skipped (`reconciliation.py`)."""
    if outcome.intake is None:
        return
    skip = source.tombstones == "skip"
    problems = discrepancies(outcome.intake, dead_letters, skip)
    if not problems:
        return
    counts = ledger(outcome.intake, dead_letters, skip)
    log.error(
        "batch does not reconcile; nothing of it is published or dead-lettered, its files are "
        "discarded",
        extra={
            "source": source.name,
            "seq": seq,
            "offsets": {
                f"{t}:{p}": list(span) for (t, p), span in sorted(plan.read_ranges.items())
            },
            "problems": problems,
            **counts,
        },
    )
    raise BatchUnreconciled(problems, counts)

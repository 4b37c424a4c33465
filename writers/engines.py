"""The writer engines' one interface: write a source's batch, return what it wrote.

Two engines write the same tables: `arrow` (Spark schedules tasks whose Python body decodes,
flattens and writes with Arrow, `arrow_engine/`) and `spark-sql` (Spark reads, decodes and
writes the rows, `spark_sql_engine/`). The core (`source_batch.py`) hands either a
`SourceBatch`: the offsets to read, the source's routes and the schemas its records may name.
The engine plans each table it writes through the core (`table_batch.TableBatches.plan`), so
both lay out a table's batch alike, and returns an `EngineWrite`: each table's file facts, and
what the writing pass counted of every record (read, accepted by a route, failed and why), which
the batch reconciles with its dead letters before anything is published. An engine that cannot
take a batch says why (`EngineRefusal`), having kept nothing; the core then runs it on
`spark-sql`, which takes every batch, as it does a batch whose counts from the arrow engine do
not reconcile (its files discarded). Neither engine imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from icekeeper.common.config.model import KafkaSource
from icekeeper.writers.offsets import BatchPlan
from icekeeper.writers.reconciliation import BatchIntake
from icekeeper.writers.registry import RegisteredSchema
from icekeeper.writers.routing import Routes
from icekeeper.writers.table_batch import TableBatch, TableFiles


@dataclass(frozen=True)
class SourceBatch:
    """One source's batch, as the core hands it to an engine."""

    source: KafkaSource
    plan: BatchPlan
    seq: int
    routes: Routes
    schemas: list[RegisteredSchema] = field(default_factory=list)
    """The registered value schemas the batch's records may name (registry formats)."""
    key_schemas: list[RegisteredSchema] = field(default_factory=list)
    """The record key schemas the writer has learnt, for deletes without `before`."""


@dataclass(frozen=True)
class WrittenTable:
    """One table's share of the batch and the files written for it (none: no rows)."""

    table: TableBatch
    files: TableFiles


@dataclass
class EngineWrite:
    """What an engine wrote of one source's batch."""

    records: int
    """Records read (fewer than the offsets span on a source with `offset_gaps`)."""
    intake: BatchIntake
    """What the writing pass counted, for the reconciliation (`reconciliation.py`)."""
    tables: list[WrittenTable] = field(default_factory=list)
    output_dirs: list[str] = field(default_factory=list)
    """Every batch folder written, to discard if the batch is not published."""


@dataclass(frozen=True)
class EngineRefusal:
    """Why an engine does not take a batch (it kept nothing of it)."""

    reason: str
    kind: str
    """The reason's kind, one of a few fixed words (the label of
    `icekeeper_writer_engine_fallbacks_total`; `reason` names columns, keys and ids)."""


class WriterEngine(Protocol):
    """Writes sources' batches for one writer."""

    def write(self, batch: SourceBatch) -> EngineWrite | EngineRefusal:
        """Write every table the batch feeds; publish nothing."""
        ...

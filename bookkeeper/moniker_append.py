"""The moniker append: a table's ready monikers as one snapshot, their offsets in its summary.

Planned on the table as the commit path read it (`commit_path.py`), in every attempt:
`select_ready` says which monikers go in (`exactly_once.py`); their files' footers are read
(`pending_files.py`) and checked against what the moniker says (`datafiles.validate`), the
schema evolves by field id (`evolution.py`), the table is created with the first one if it does
not exist, and on an upsert table the row delta deletes the rows their keys replace
(`row_delta.py`). `advanced_state` is the committed state the snapshot carries.

Two things keep a moniker out of a commit without losing it. A file storage cannot serve now
(not found yet, a network error, throttling) is retried with backoff within the cycle, then the
moniker is left pending, and with it its writer's later monikers (they wait, as for ordering);
only a file missing for `bookkeeper.missing_file_timeout`, or definitely not what the moniker
says (not Parquet, size or field ids differ), quarantines it. And a moniker whose offsets start
below what the table committed for a partition is refused (`exactly_once.py`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from icekeeper.bookkeeper.commit_path import SnapshotChanges, SnapshotProducer, TableCommit
from icekeeper.bookkeeper.datafiles import FileUnavailable, InvalidFile, data_file, validate
from icekeeper.bookkeeper.evolution import Evolution, IncompatibleSchema, plan_evolution
from icekeeper.bookkeeper.exactly_once import advanced_state, select_ready
from icekeeper.bookkeeper.pending_files import PendingFiles, checked_files
from icekeeper.bookkeeper.row_delta import Addition, RowDelta
from icekeeper.bookkeeper.table_key_indexes import TableKeyIndexes
from icekeeper.common.catalog import REQUESTED_LOCATION, monikers_location, table_properties
from icekeeper.common.committed_state import CommittedState
from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.common.locations import batch_folder_of, is_in_batch_folder, normalize_location
from icekeeper.common.moniker import Moniker
from icekeeper.common.partitioning import partition_spec
from icekeeper.common.transports.base import Delivery

log = logging.getLogger(__name__)


@dataclass
class _Prepared:
    """The monikers of one attempt that can go in, their files, and the schema they need."""

    table: Table | None
    committed: list[Delivery] = field(default_factory=list)
    quarantined: list[tuple[Delivery, str]] = field(default_factory=list)
    data_files: list[DataFile] = field(default_factory=list)
    files_of: dict[str, list[DataFile]] = field(default_factory=dict)
    """Moniker id -> its data files."""
    new_schema: Schema | None = None
    schema_changes: list[str] = field(default_factory=list)
    held_writers: dict[str, int] = field(default_factory=dict)
    """Writer -> the seq of its moniker left pending for a file: its later monikers wait."""


class MonikerAppend(SnapshotProducer):
    """Commits the ready monikers among `deliveries` (one table's) as one snapshot."""

    what = "commit"

    def __init__(
        self,
        identifier: str,
        deliveries: list[Delivery],
        config: IcekeeperConfig,
        catalog: Catalog,
        files: PendingFiles,
        key_indexes: TableKeyIndexes | None,
    ) -> None:
        """`catalog` creates the table if it does not exist; `files` is the bookkeeper's footer
        cache; `key_indexes` is given for an upsert table (its row delta)."""
        self.identifier = identifier
        self.deliveries = deliveries
        self.config = config
        self.catalog = catalog
        self.files = files
        self.key_indexes = key_indexes
        self.row_delta: RowDelta | None = None
        """This attempt's row delta (a new one each attempt: a lost swap plans it again)."""
        self._committed: list[Delivery] = []
        self._quarantined: list[Delivery] = []

    def plan(
        self, table: Table | None, state: CommittedState, outcome: TableCommit
    ) -> SnapshotChanges | None:
        settings = self.config.bookkeeper
        self.row_delta = RowDelta(self.key_indexes) if self.key_indexes is not None else None
        self._committed, self._quarantined = [], []
        selection = select_ready(
            self.deliveries, state, settings.max_files_per_commit, settings.max_bytes_per_commit
        )
        outcome.duplicates, outcome.copies, outcome.waiting, outcome.refused = (
            selection.duplicates,
            selection.copies,
            selection.waiting,
            selection.refused,
        )
        # A duplicate's files may have been read in an earlier cycle (its moniker waited, then
        # another bookkeeper committed it): nothing reads them again.
        self.files.forget(d.moniker for d in selection.duplicates)
        if not selection.ready and not selection.refused:
            return None
        prepared = self._prepare(table, selection.ready, outcome)
        if prepared.held_writers:
            # A refused moniker after one left pending would
            # move its writer's chain past it: it waits too.
            held = [
                (d, reason)
                for d, reason in outcome.refused
                if d.moniker.seq > prepared.held_writers.get(d.moniker.writer_id, d.moniker.seq)
            ]
            outcome.refused = [item for item in outcome.refused if item not in held]
            outcome.waiting.extend(d for d, _ in held)
        outcome.quarantined = prepared.quarantined
        outcome.schema_changes = prepared.schema_changes
        if prepared.table is None:
            # Nothing was committed to move the refused
            # monikers' writers on: they are refused next time.
            outcome.waiting.extend(d for d, _ in outcome.refused)
            outcome.refused = []
            return None
        if not (prepared.committed or prepared.quarantined or outcome.refused):
            return None  # every ready moniker waits for a file
        committed = [d.moniker for d in prepared.committed]
        outcome.records = sum(moniker.records for moniker in committed)
        outcome.bytes = sum(moniker.bytes for moniker in committed)
        self._committed = prepared.committed
        self._quarantined = [d for d, _ in prepared.quarantined]
        changes = SnapshotChanges(
            table=prepared.table,
            state=advanced_state(
                state,
                committed,
                [d.moniker for d, _ in prepared.quarantined],
                [d.moniker for d, _ in outcome.refused],
            ),
            moniker_ids=[moniker.id for moniker in committed],
            data_files=prepared.data_files,
            new_schema=prepared.new_schema,
        )
        if self.row_delta is not None:
            self.row_delta.add_to(changes)
        return changes

    def committed(self, changes: SnapshotChanges, snapshot_id: int, outcome: TableCommit) -> None:
        if self.row_delta is not None:
            self.row_delta.committed(snapshot_id, changes.table, outcome)
        outcome.committed = list(self._committed)
        outcome.files = len(changes.data_files)
        self.files.forget(d.moniker for d in self._committed + self._quarantined)

    # -- checking the ready monikers -------------------------------------------------------------

    def _prepare(
        self, table: Table | None, ready: list[Delivery], outcome: TableCommit
    ) -> _Prepared:
        """Validate files, evolve the schema, build data files, create the table if needed, and
        on an upsert table plan the row delta; monikers that cannot go in are quarantined or wait
        (in `outcome`)."""
        upsert = self.key_indexes is not None
        # Monikers of a batch share their schema: parse (and below, compare) each distinct one once.
        schemas = self.files.schemas_of([d.moniker for d in ready])
        entries = [
            (entry, schema, schema_key)
            for delivery, (schema, schema_key) in zip(ready, schemas)
            for entry in checked_files(delivery.moniker, upsert)
        ]
        self.files.read(
            [(entry.path, schema, schema_key) for entry, schema, schema_key in entries],
            table.properties if table is not None else {},
            {entry.path: entry.size_bytes for entry, _, _ in entries},
        )
        prepared = _Prepared(table=table)
        held_writers = prepared.held_writers
        current_schema = table.schema() if table is not None else None
        # What ids the table gave out, as the cycle's schema changes move it on (see evolution.py).
        last_column_id = table.metadata.last_column_id if table is not None else 0
        known_schemas = list(table.metadata.schemas) if table is not None else []
        evolutions: dict[tuple[int, str], Evolution | str] = {}
        for delivery, (file_schema, schema_key) in zip(ready, schemas):
            moniker = delivery.moniker
            if moniker.writer_id in held_writers:
                outcome.waiting.append(delivery)
                continue
            unavailable = [
                facts
                for entry in checked_files(moniker, upsert)
                if isinstance(facts := self.files.facts(entry.path), FileUnavailable)
            ]
            if unavailable:
                held_writers[moniker.writer_id] = moniker.seq
                outcome.waiting.append(delivery)
                outcome.unavailable.append(
                    (delivery, "; ".join(str(problem) for problem in unavailable))
                )
                continue
            try:
                if current_schema is None:
                    table = create_table(
                        self.catalog, self.config, self.identifier, moniker, file_schema
                    )
                    prepared.table, current_schema = table, table.schema()
                    last_column_id = table.metadata.last_column_id
                    known_schemas = list(table.metadata.schemas)
                evolution_key = (id(current_schema), schema_key)
                if evolution_key not in evolutions:
                    try:
                        evolutions[evolution_key] = plan_evolution(
                            current_schema,
                            file_schema,
                            self.config.bookkeeper.allow_drop_columns,
                            last_column_id=last_column_id,
                            earlier_schemas=known_schemas,
                        )
                    except IncompatibleSchema as error:
                        # The reason, not the exception: its traceback holds this frame, whose
                        # dict would then hold it (a cycle keeping the table until the cyclic
                        # collector runs).
                        evolutions[evolution_key] = str(error)
                evolution = evolutions[evolution_key]
                if isinstance(evolution, str):
                    raise IncompatibleSchema(evolution)
                files = self._data_files(prepared.table, moniker, file_schema, upsert)
            except (IncompatibleSchema, InvalidFile) as error:
                prepared.quarantined.append((delivery, str(error)))
                continue
            if evolution.schema is not None:
                current_schema = evolution.schema
                # As Iceberg's metadata builder (and pyiceberg's AddSchemaUpdate) will set it.
                last_column_id = max(last_column_id, current_schema.highest_field_id)
                known_schemas.append(current_schema)
                prepared.new_schema = evolution.schema
                prepared.schema_changes.extend(evolution.changes)
            prepared.committed.append(delivery)
            prepared.data_files.extend(files)
            prepared.files_of[moniker.id] = files
        if prepared.table is not None and prepared.committed and self.row_delta is not None:
            self._plan_row_delta(prepared, outcome)
        return prepared

    def _data_files(
        self, table: Table, moniker: Moniker, file_schema: Schema, upsert: bool
    ) -> list[DataFile]:
        """The moniker's data files, each checked against what its footer says (and on an upsert
        table its deleted-keys files too, which must also lie in the moniker's own batch folder,
        `is_in_batch_folder`); `InvalidFile` when one is not what the moniker says."""
        location = monikers_location(table, moniker.table_location)
        files = []
        for entry in moniker.files:
            facts = self.files.facts(entry.path)
            if isinstance(facts, InvalidFile):
                raise facts
            validate(entry, facts, location, file_schema)
            spec = table.specs().get(entry.spec_id, table.spec())
            files.append(data_file(entry, facts, spec))
        for entry in moniker.delete_files if upsert else ():
            facts = self.files.facts(entry.path)
            if isinstance(facts, InvalidFile):
                raise facts
            validate(entry, facts, location, file_schema)
            if not is_in_batch_folder(entry.path, location, moniker.writer_id, moniker.seq):
                raise InvalidFile(
                    f"{entry.path}: a deleted-keys file outside its moniker's batch folder "
                    f"{batch_folder_of(location, moniker.writer_id, moniker.seq)}[-*]/ (writer "
                    f"{moniker.writer_id} seq {moniker.seq}); not committed: it would delete "
                    "another batch's keys"
                )
        return files

    def _plan_row_delta(self, prepared: _Prepared, outcome: TableCommit) -> None:
        """The upsert table's deletes for the monikers prepared; those whose keys cannot be read
        now wait (their writers' later monikers too), or are quarantined."""
        assert self.row_delta is not None and prepared.table is not None
        held = self.row_delta.plan(
            prepared.table,
            [
                Addition(d, prepared.files_of[d.moniker.id], d.moniker.delete_files)
                for d in prepared.committed
            ],
        )
        if not (held.waiting or held.quarantined):
            return
        gone = held.deliveries()
        kept = [d for d in prepared.committed if id(d) not in gone]
        prepared.data_files = [data for d in kept for data in prepared.files_of[d.moniker.id]]
        prepared.committed = kept
        prepared.quarantined.extend(held.quarantined)
        outcome.waiting.extend(held.waiting)
        outcome.unavailable.extend(held.unavailable)
        for writer, seq in held.writers.items():
            prepared.held_writers.setdefault(writer, seq)


def create_table(
    catalog: Catalog, config: IcekeeperConfig, identifier: str, moniker: Moniker, schema: Schema
) -> Table:
    """Table `identifier` as its config says, with the first moniker's schema (its files' field
    ids: `IncompatibleSchema` when the catalog gave others) at its location; the table another
    bookkeeper created meanwhile if there is one."""
    spec = config.table(identifier)
    namespace = identifier.rsplit(".", 1)[0]
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass
    properties = table_properties(None, spec)
    if spec.comment:
        properties["comment"] = spec.comment
    location = spec.location or moniker.table_location
    # Recorded with the creation itself (one request): a catalog may place the table elsewhere
    # (Nessie appends `_<uuid>`), and the files of batches written before the table existed lie
    # under `location`; set in a second request, a crash or a lost answer between the two left
    # those monikers quarantined for good.
    properties[REQUESTED_LOCATION] = location
    try:
        table = catalog.create_table(
            identifier,
            schema=schema,
            partition_spec=partition_spec(spec.partition_by, schema),
            location=location,
            properties=properties,
        )
    except TableAlreadyExistsError:
        table = catalog.load_table(identifier)
    if normalize_location(table.location()).rstrip("/") != normalize_location(location).rstrip(
        "/"
    ) and not table.properties.get(REQUESTED_LOCATION):
        # The catalog placed the table elsewhere (Nessie appends `_<uuid>`; REST servers may):
        # writers put the files of batches written before the table existed under `location`.
        with table.transaction() as transaction:
            transaction.set_properties({REQUESTED_LOCATION: location})
        table = catalog.load_table(identifier)
    created_ids = {f.name: f.field_id for f in table.schema().fields}
    if created_ids != {f.name: f.field_id for f in schema.fields}:
        raise IncompatibleSchema(
            f"{identifier}: the new table's field ids differ from the files' ({created_ids})"
        )
    log.info("table created", extra={"table": identifier, "location": table.location()})
    return table

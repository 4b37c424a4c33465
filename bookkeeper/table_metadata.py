"""The bookkeeper's catalog: commits whose cost does not grow with the history a table keeps.

A table's metadata file lists every snapshot kept; streaming readers need an hour of them (3,600
at one commit a second, ~1 KB of JSON each). pyiceberg 0.12's commit path handles that history
several times per commit, measured at 1,000 snapshots
(`python -m icekeeper.bench.snapshot_history`):

- every `load_table` parses the metadata file, ~75 ms, and a cycle loads twice (the committer,
  then the SQL or Hive catalog's `commit_table` once more, to compare-and-swap against);
- `update_table_metadata` deep-copies the whole metadata after applying the updates, ~195 ms.

For the bookkeeper's catalog object only (nothing global is changed):

- metadata files are immutable (every version is a new file), so the newest metadata of each
  table that this catalog parsed or wrote is kept by file location and returned instead of
  parsing that file again (SQL and Hive catalogs, whose commit reads the current table once more
  under its compare-and-swap or lock; other catalogs parse as before);
- updates are applied without the final deep copy: metadata models are frozen and pyiceberg's
  update functions build new lists and dicts instead of changing the base's (the reasoning of
  `common.internals.UncopiedTransaction`), so the new metadata may share untouched snapshots;
- each snapshot's JSON is made once per table (kept as a slice of the list's JSON, not a string
  of its own), and the usual commit appends one to the list;
- snapshots are looked up from the newest end (the current and parent snapshots are).

Behind a REST catalog the server applies the updates and writes the file; the client parses
its answer, the new metadata whole, on every commit (~75 us a snapshot with pydantic, 56 ms at
3,600). Snapshots are immutable and the answer lists the ones the client built from the last
answer, plus one: each is reused when its JSON is the same (`SnapshotReuse`).

What is left grows with history but stays small: the rest of the metadata file's JSON (the
snapshot log), writing its bytes, and the expiry's pass over the snapshot list (once a minute).
The private pyiceberg API this needs is in `common/internals.py`, checked at import;
tests/bookkeeper/test_table_metadata.py compares the result with pyiceberg's own path.
"""

from __future__ import annotations

import collections
import logging
import operator
import threading
from dataclasses import dataclass
from datetime import datetime

import pydantic_core
from pydantic import BaseModel
from pyiceberg.catalog import Catalog, MetastoreCatalog
from pyiceberg.io import FileIO, InputFile, OutputFile
from pyiceberg.serializers import Compressor, FromInputFile, ToOutputFile
from pyiceberg.table.metadata import TableMetadata, TableMetadataV2
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import TableUpdate, update_table_metadata
from pyiceberg.utils.config import Config
from pyiceberg.utils.datetime import datetime_to_millis

from icekeeper.common.collector import gc_paused
from icekeeper.common.internals import (
    append_metadata_log,
    apply_table_updates,
    leave_metadata_cleanup_to_server,
    replace_hive_metadata_reader,
    replace_metadata_update,
    replace_metadata_writer,
    replace_rest_answer_parser,
    replace_sql_metadata_reader,
)

log = logging.getLogger(__name__)


class MetadataCache:
    """The newest metadata of each table (by the folder
    of its metadata files), with its file location."""

    def __init__(self) -> None:
        self._newest: dict[str, tuple[str, TableMetadata]] = {}
        self._snapshots_written: dict[str, _SnapshotsJson] = {}
        """Per table, the snapshots of the newest metadata file written and their JSON."""
        self._lock = threading.Lock()
        self.parsed = 0
        """Metadata files parsed (cache misses), for tests and the benchmark."""

    def read(self, input_file: InputFile, encoding: str = "utf-8") -> TableMetadata:
        """`FromInputFile.table_metadata`, parsing a file
        only when it is not the newest one known."""
        location = input_file.location
        with self._lock:
            known = self._newest.get(_folder(location))
        if known is not None and known[0] == location:
            return known[1]
        metadata = FromInputFile.table_metadata(input_file, encoding)
        self.parsed += 1
        self.remember(location, metadata)
        return metadata

    def remember(self, location: str, metadata: TableMetadata) -> None:
        newest_first(metadata)
        with self._lock:
            self._newest[_folder(location)] = (location, metadata)

    def write(self, metadata: TableMetadata, output_file: OutputFile) -> None:
        """`ToOutputFile.table_metadata`, with each snapshot's JSON made once per table: snapshots
        never change, and serializing them (pyiceberg's summary serializer is Python) was most of
        the metadata file's cost. The same JSON document as pyiceberg's, with `snapshots` last."""
        location = output_file.location
        if metadata.format_version != 2 or Config().get_bool("legacy-current-snapshot-id"):
            ToOutputFile.table_metadata(metadata, output_file)
            self.remember(location, metadata)
            return
        folder = _folder(location)
        snapshots = metadata.snapshots
        with self._lock:
            previous = self._snapshots_written.get(folder)
        if (
            previous is not None
            and len(snapshots) == len(previous.snapshots) + 1
            and all(map(operator.is_, snapshots, previous.snapshots))
        ):
            # The usual commit: the snapshot objects last written, plus one.
            listed = (
                previous.listed + ("," if previous.listed else "") + snapshots[-1].model_dump_json()
            )
            written = _SnapshotsJson(list(snapshots), [*previous.ends, len(listed)], listed)
        else:
            # By object, not snapshot id: pyiceberg replaces a snapshot whose parent is expired
            # with a copy that has no parent id.
            known = (
                {id(snapshot): index for index, snapshot in enumerate(previous.snapshots)}
                if previous is not None
                else {}
            )
            fragments = [
                previous.fragment(known[id(snapshot)])
                if previous is not None and id(snapshot) in known
                else snapshot.model_dump_json()
                for snapshot in snapshots
            ]
            written = _SnapshotsJson.joined(list(snapshots), fragments)
        head = metadata.model_dump_json(exclude={"snapshots"})
        document = head[:-1] + ',"snapshots":[' + written.listed + "]}"
        content = Compressor.get_compressor(location).bytes_compressor()(document.encode("utf-8"))
        with output_file.create(overwrite=False) as out:
            out.write(content)
        with self._lock:
            self._snapshots_written[folder] = written
        self.remember(location, metadata)


class _NewestFirstMetadataV2(TableMetadataV2):
    """Format-version 2 metadata whose snapshot look-ups start from the newest snapshot. A commit
    looks up the current and parent snapshots a dozen times (snapshot producer, summary, refs),
    each a scan of the whole list from the oldest in pyiceberg: ~0.5 ms at 1,000 snapshots,
    ~1 µs from the newest end (measured; behind a REST catalog, profiled at 3,600 snapshots,
    nine scans a commit were 15% of its time).

    Equal to pyiceberg's own `TableMetadataV2` of the same values, either way round (pydantic's
    equality also compares the classes; Python asks the subclass first)."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TableMetadataV2):
            return NotImplemented
        # pydantic's checks but the class's (its fields are all in `__dict__`: frozen models).
        private = "__pydantic_private__"
        return (
            getattr(self, private, None) == getattr(other, private, None)
            and (self.__pydantic_extra__ or {}) == (other.__pydantic_extra__ or {})
            and self.__dict__ == other.__dict__
        )

    __hash__ = TableMetadataV2.__hash__

    def snapshot_by_id(self, snapshot_id: int) -> Snapshot | None:
        return next(
            (
                snapshot
                for snapshot in reversed(self.snapshots)
                if snapshot.snapshot_id == snapshot_id
            ),
            None,
        )


@dataclass(frozen=True)
class _SnapshotsJson:
    """The snapshot objects of a metadata file (kept, so their ids are not reused) and the JSON of
    their list, with where each one's JSON ends in it.

    Each snapshot's JSON is a slice of `listed`, not a string of its own: one string of ~1 KB per
    snapshot kept for the whole history, among the commit's short-lived allocations of that size,
    left the allocator's heap ever more fragmented (and doubled the JSON held; issue 26)."""

    snapshots: list[Snapshot]
    ends: list[int]
    """Offset in `listed` just past each snapshot's JSON (the next one starts after a comma)."""
    listed: str

    @classmethod
    def joined(cls, snapshots: list[Snapshot], fragments: list[str]) -> _SnapshotsJson:
        ends, end = [], -1
        for fragment in fragments:
            end += 1 + len(fragment)
            ends.append(end)
        return cls(snapshots, ends, ",".join(fragments))

    def fragment(self, index: int) -> str:
        """The JSON of `snapshots[index]`."""
        return self.listed[(self.ends[index - 1] + 1 if index else 0) : self.ends[index]]


def newest_first(metadata: TableMetadata) -> TableMetadata:
    """`metadata` itself, its snapshot look-ups from the newest end (`_NewestFirstMetadataV2`:
    the same fields and values) when it is pyiceberg's format-version 2 metadata."""
    if type(metadata) is TableMetadataV2:
        metadata.__class__ = _NewestFirstMetadataV2
    return metadata


def _folder(location: str) -> str:
    return location.rsplit("/", 1)[0]


def update_without_copy(
    base_metadata: TableMetadata,
    updates: tuple[TableUpdate, ...],
    enforce_validation: bool = False,
    metadata_location: str | None = None,
) -> TableMetadata:
    """pyiceberg 0.12's `update_table_metadata` without its final deep copy (a new table, which
    pyiceberg validates from scratch, takes pyiceberg's own path)."""
    if enforce_validation:
        return update_table_metadata(base_metadata, updates, enforce_validation, metadata_location)
    metadata, changed = apply_table_updates(base_metadata, updates)
    if changed:
        if metadata_location:
            metadata = append_metadata_log(
                metadata, metadata_location, base_metadata.last_updated_ms
            )
        if base_metadata.last_updated_ms == metadata.last_updated_ms:
            metadata = metadata.model_copy(
                update={"last_updated_ms": datetime_to_millis(datetime.now().astimezone())}
            )
    metadata.spec().check_compatible(metadata.schema())
    metadata.sort_order().check_compatible(metadata.schema())
    return metadata


class SnapshotReuse:
    """Parses a REST catalog's answers holding a table's metadata (commit, load), reusing the
    `Snapshot` objects built from the table's previous answer.

    A snapshot is reused when its snapshot id is known and its JSON equals the JSON it was built
    from: a server may rewrite a snapshot it keeps (drop the parent id of an expired one, say),
    which is then built anew. The rest of the answer is validated by pydantic as pyiceberg does,
    with the snapshots in place (pydantic takes model instances as they are). Kept per table
    (table uuid): the snapshots of its latest answer only, so expired ones are let go. The result
    is what `model.model_validate_json(text)` gives; any answer this path cannot take (not JSON,
    not the expected shape, invalid) is left to exactly that, for the same result or error.
    Two threads parsing answers of one table at once may keep either's snapshots: a cache only,
    every reuse is checked against the JSON."""

    TABLES = 64
    """Tables whose latest answer is kept, the most recently answered: a table dropped or no
    longer served is let go (at 3,600 snapshots one table's entry is ~20 MB); a group of more
    tables than this only parses some answers the slow way."""

    def __init__(self) -> None:
        self._kept: collections.OrderedDict[str, dict[int, tuple[dict, Snapshot]]] = (
            collections.OrderedDict()
        )
        self.fallbacks = 0
        """Answers left to pyiceberg's own parse (logged the first time): a count that grows
        says the fast path no longer applies (a pyiceberg or server change)."""

    def parse(self, model: type[BaseModel], text: str) -> BaseModel:
        """`model.model_validate_json(text)`, reusing the snapshots of the table's last answer."""
        try:
            with gc_paused():
                return self._parse_reusing(model, text)
        except Exception as error:  # noqa: BLE001 - pyiceberg's own parse decides: same result or error
            self.fallbacks += 1
            if self.fallbacks == 1:
                log.warning(
                    "a REST catalog answer is parsed by pyiceberg alone (slower at long histories)",
                    extra={"error": repr(error)[:300]},
                )
            return model.model_validate_json(text)

    def _parse_reusing(self, model: type[BaseModel], text: str) -> BaseModel:
        # pydantic's own JSON parser: as fast as json.loads or faster at 3 MB (measured), its
        # string cache for keys only (values, manifest list paths and ids, are all different):
        # the same key objects in every snapshot, so comparing a snapshot with the one it was
        # built from finds its keys by identity (3x faster at 3,600 snapshots, measured).
        answer = pydantic_core.from_json(text, cache_strings="keys")
        metadata = answer["metadata"]
        listed, table = metadata.get("snapshots"), metadata.get("table-uuid")
        if not isinstance(listed, list) or not isinstance(table, str):
            return model.model_validate(answer)
        known = self._kept.get(table, {})
        kept: dict[int, tuple[dict, Snapshot]] = {}
        snapshots = []
        for raw in listed:
            snapshot_id = raw["snapshot-id"]
            built = known.get(snapshot_id)
            if built is None or built[0] != raw:
                built = (raw, Snapshot.model_validate(raw))
            kept[snapshot_id] = built
            snapshots.append(built[1])
        metadata["snapshots"] = snapshots
        parsed = model.model_validate(answer)
        newest_first(parsed.metadata)  # type: ignore[attr-defined]
        self._kept[table] = kept
        self._kept.move_to_end(table)
        while len(self._kept) > self.TABLES:
            self._kept.popitem(last=False)
        return parsed


def with_lean_commits(catalog: Catalog) -> Catalog:
    """Give this catalog object the cheap metadata path described above; returns it.

    A REST catalog applies the updates and writes the metadata file itself, and answers with the
    new metadata: a commit is one request whose answer pyiceberg parses (the commit path then
    plans the next commit on that table instead of loading it again,
    `CommitPath.current_table`). Its answers, and those of `load_table`, are parsed reusing the
    snapshots of the table's previous answer (`SnapshotReuse`), and the client's redundant
    removal of old metadata files is left out (`leave_metadata_cleanup_to_server`)."""
    if not isinstance(catalog, MetastoreCatalog):
        replace_rest_answer_parser(catalog, SnapshotReuse().parse)
        leave_metadata_cleanup_to_server(catalog)
        return catalog
    cache = MetadataCache()
    catalog.metadata_cache = cache  # type: ignore[attr-defined]
    replace_metadata_update(catalog, update_without_copy)

    def write_metadata(metadata: TableMetadata, io: FileIO, metadata_path: str) -> None:
        cache.write(metadata, io.new_output(metadata_path))

    replace_metadata_writer(catalog, write_metadata)
    replace_sql_metadata_reader(catalog, cache.read) or replace_hive_metadata_reader(
        catalog, cache.read
    )
    return catalog

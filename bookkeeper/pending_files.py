"""What reading the footers of pending monikers' files found, kept from cycle to cycle.

A moniker waits in the queue until it is committed, and the cycles it waits through would read
its files' footers again each time: what a read found is kept by file path until the moniker is
committed, quarantined or found a duplicate (`forget`). A file storage could not serve is read
again with backoff within the cycle that first meets it, then once a cycle; one missing for
`bookkeeper.missing_file_timeout` becomes an `InvalidFile` (`missing_files.py`).

The monikers' schemas are parsed here too, once for every cycle: footer statistics are planned
per schema object (`datafiles.ParsedSchemas`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping

from pyiceberg.schema import Schema

from icekeeper.bookkeeper.datafiles import (
    EMPTY_SIZES,
    Described,
    FileUnavailable,
    FooterFacts,
    FooterReader,
    InvalidFile,
    ParsedSchemas,
)
from icekeeper.bookkeeper.missing_files import MissingSince
from icekeeper.common.moniker import FileEntry, Moniker
from icekeeper.common.retries import retry

FILE_RETRY_DELAYS_S = (0.2, 0.5, 1.0)
"""Waits before re-reading files storage could not serve, within one cycle (then: next cycle)."""

FileRequest = tuple[str, Schema, str]
"""A file to describe: its path, the schema it was written with, and that schema's JSON."""


def checked_files(moniker: Moniker, upsert: bool) -> list[FileEntry]:
    """The files of `moniker` whose footers are read and checked: its data files, and for an
    upsert table its deleted-keys files too (each one deletes every key it holds)."""
    return [*moniker.files, *moniker.delete_files] if upsert else list(moniker.files)


class PendingFiles:
    """The footers of the files of monikers not yet settled, and their schemas."""

    def __init__(self, reader: FooterReader, missing_file_timeout: float) -> None:
        self.reader = reader
        self.missing_file_timeout = missing_file_timeout
        self._footers: dict[str, Described] = {}
        """File path -> what reading its footer found, until its moniker is committed,
        quarantined or found a duplicate."""
        self._schemas = ParsedSchemas()
        """Monikers' schemas, parsed once for every cycle (see `ParsedSchemas`)."""
        self._missing = MissingSince()

    def schemas_of(self, monikers: list[Moniker]) -> list[tuple[Schema, str]]:
        """Each moniker's file schema and its JSON (a key: equal schemas, equal JSON)."""
        parsed: list[tuple[Schema, str]] = []
        previous_schema, schema_key = None, ""
        for moniker in monikers:
            # Comparing with the previous moniker's schema dict (C, ~1 µs) spares serializing
            # each one (~40 µs): 1,000 monikers of a cycle usually carry equal schemas.
            if moniker.schema_ != previous_schema:
                previous_schema, schema_key = (
                    moniker.schema_,
                    json.dumps(moniker.schema_, sort_keys=True),
                )
                schema = self._schemas.get(
                    schema_key, functools.partial(Schema.model_validate, moniker.schema_)
                )
            parsed.append((schema, schema_key))
        return parsed

    def read(
        self,
        requests: list[FileRequest],
        table_properties: dict[str, str],
        sizes: Mapping[str, int] = EMPTY_SIZES,
    ) -> None:
        """Describe the files of `requests` not read yet (or unavailable last time); `sizes`: what
        the monikers declare, by path (on S3 a footer is then one request). A file
        storage cannot serve is read again after `FILE_RETRY_DELAYS_S` in the cycle that first
        meets it (later cycles read it once each: the commit interval spaces them); one missing
        for `missing_file_timeout`, counted from when this bookkeeper first found it missing,
        becomes an `InvalidFile`."""
        requests = [
            request
            for request in requests
            if not isinstance(self._footers.get(request[0]), (FooterFacts, InvalidFile))
        ]
        unavailable_before = {
            path for path, _, _ in requests if isinstance(self._footers.get(path), FileUnavailable)
        }

        def newly_unavailable() -> list[FileRequest]:
            return [
                request
                for request in requests
                if isinstance(self._footers[request[0]], FileUnavailable)
                and request[0] not in unavailable_before
            ]

        def describe(attempt: int) -> list[FileRequest]:
            pending = requests if attempt == 1 else newly_unavailable()
            self._footers.update(self.reader.describe(pending, table_properties, sizes))
            return newly_unavailable()

        retry(
            describe,
            attempts=len(FILE_RETRY_DELAYS_S) + 1,
            what="storage could not serve files, reading them again",
            retry_while=bool,
            wait_s=FILE_RETRY_DELAYS_S,
        )
        timeout = self.missing_file_timeout
        for path, _, _ in requests:
            problem = self._footers[path]
            if not isinstance(problem, FileUnavailable) or not problem.missing:
                # Read, or it exists and storage failed to serve it: retried as long as it takes.
                self._missing.forget(path)
                continue
            missing_for = self._missing.missing_for(path)
            if missing_for >= timeout:
                self._footers[path] = InvalidFile(
                    f"{path}: missing for {missing_for:.0f} s (bookkeeper.missing_file_timeout "
                    f"{timeout:.0f} s)"
                )

    def facts(self, path: str) -> Described:
        """What reading the footer of `path` found (`read` first)."""
        return self._footers[path]

    def forget(self, monikers: Iterable[Moniker | None]) -> None:
        """Drop what is known about the files of monikers that are done with (committed,
        quarantined, duplicates), so that only pending monikers' files are kept."""
        for moniker in monikers:
            # Data and deleted-keys files alike (a no-op for a file never read).
            for entry in checked_files(moniker, True) if moniker is not None else ():
                self._footers.pop(entry.path, None)
                self._missing.forget(entry.path)

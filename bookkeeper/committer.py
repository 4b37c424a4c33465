"""The bookkeeper's commits: one producer per commit kind on one commit path, and what they share.

Every snapshot the bookkeeper makes goes through `CommitPath.commit` (`commit_path.py`: one
compare-and-swap loop, one settlement of an unknown outcome, the epoch check). What a snapshot
holds is its producer's: moniker appends (`moniker_append.py`, with the upsert row delta of
`row_delta.py`), Event Grid files (`event_grid_files.py`), rewrites (`rewrites.py`) and heartbeats
(`heartbeats.py`). This module only builds them, and owns the state they share across cycles,
each part passed to the producers that need it: the footer reader, the footers of pending
monikers' files (`pending_files.py`) and the upsert tables' key indexes (`table_key_indexes.py`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from pyiceberg.catalog import Catalog

from icekeeper.bookkeeper.commit_path import CommitPath, TableCommit
from icekeeper.bookkeeper.datafiles import FooterReader
from icekeeper.bookkeeper.event_grid_files import EventGridFiles
from icekeeper.bookkeeper.heartbeats import Heartbeat
from icekeeper.bookkeeper.moniker_append import MonikerAppend
from icekeeper.bookkeeper.pending_files import PendingFiles
from icekeeper.bookkeeper.rewrites import RewriteCommitter
from icekeeper.bookkeeper.table_key_indexes import TableKeyIndexes
from icekeeper.common.catalog import load_table_or_none
from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.common.transports.base import Delivery

log = logging.getLogger(__name__)


class Committer:
    """Commits monikers, Event Grid files, rewrites and heartbeats into one catalog's tables."""

    def __init__(self, config: IcekeeperConfig, catalog: Catalog, epoch: int = 0) -> None:
        settings = config.bookkeeper
        workers = settings.footer_workers or os.cpu_count() or 2
        self.config = config
        self.catalog = catalog
        self.commit_path = CommitPath(catalog, settings, epoch)
        """Where every producer's snapshot is committed; carries the epoch and the clock."""
        self.footer_reader = FooterReader(workers)
        self.pending_files = PendingFiles(self.footer_reader, settings.missing_file_timeout)
        """The footers of monikers' files not committed yet, kept from cycle to cycle."""
        self.key_indexes = TableKeyIndexes(workers, settings.key_index_save_interval)
        """The upsert tables' key indexes (also the purges' and rewrites')."""
        self.rewrites = RewriteCommitter(
            catalog,
            self.commit_path,
            self.footer_reader,
            self.key_indexes,
            settings.missing_file_timeout,
            settings.rewrite_failed_polls,
        )
        """The rewrite requests' producers (the reaper's compactions, the bookkeeper's purges)."""

    @property
    def epoch(self) -> int:
        """This bookkeeper's epoch, written into every snapshot (set when it takes the lease)."""
        return self.commit_path.epoch

    def hold(self, epoch: int, fence: Callable[[], None]) -> None:
        """Commit under `epoch` from now on, `fence` (the lease's check) deciding before a
        snapshot records a refusal that this bookkeeper still holds the lease (`commit_path.py`)."""
        self.commit_path.epoch = epoch
        self.commit_path.fence = fence

    def close(self, save_key_indexes: bool = True) -> None:
        """Stop the footer readers; save the upsert tables'
        key indexes, the next bookkeeper's start."""
        self.footer_reader.close()
        if save_key_indexes:
            try:
                tables = {
                    identifier: table
                    for identifier in self.key_indexes.identifiers()
                    if (table := load_table_or_none(self.catalog, identifier))
                }
                self.key_indexes.save_all(tables)
            except Exception as error:  # noqa: BLE001 - a stop must not fail: the next bookkeeper catches up or rebuilds
                log.warning("could not save the key indexes", extra={"error": repr(error)})

    def commit_table(self, identifier: str, deliveries: list[Delivery]) -> TableCommit:
        """Commit what is ready for `identifier` among its monikers' deliveries; never
        acknowledges anything itself."""
        return self.commit_path.commit(
            identifier,
            MonikerAppend(
                identifier,
                deliveries,
                self.config,
                self.catalog,
                self.pending_files,
                self._key_indexes_of(identifier),
            ),
        )

    def commit_files(self, identifier: str, deliveries: list[Delivery]) -> TableCommit:
        """Commit Parquet files announced by Event Grid (no moniker), exactly once by file
        (`event_grid_files.py`)."""
        return self.commit_path.commit(
            identifier,
            EventGridFiles(
                identifier, deliveries, self.footer_reader, self._key_indexes_of(identifier)
            ),
        )

    def heartbeat(self, identifier: str) -> TableCommit:
        """A snapshot with no files that carries the
        committed state forward (liveness for schedulers)."""
        return self.commit_path.commit(identifier, Heartbeat(identifier))

    def _key_indexes_of(self, identifier: str) -> TableKeyIndexes | None:
        """The key indexes for an upsert table's row delta; None for an append-only table."""
        return self.key_indexes if self.config.table(identifier).upsert else None

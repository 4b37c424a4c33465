"""Iceberg's own maintenance actions, run through Spark on the catalog pyiceberg uses.

pyiceberg 0.12 expires snapshots in metadata only and has no orphan removal, compaction or
manifest rewrite; Iceberg's Spark actions (iceberg-spark-runtime) do all of them and are what
Iceberg users trust. Spark opens the same SQLite catalog through its JdbcCatalog
(`common.spark.iceberg_catalog_conf`), so both sides see one table.

Two places where we decide and Iceberg executes:
- which snapshots to expire (`expirable_snapshots`: never the newest icekeeper commit, whose id
  the committed-state property is checked against, which a plain `retain_last` could drop after
  maintenance commits);
- which orphans to delete: Iceberg computes the unreachable files, and its delete callback
  comes back here, where files named by pending monikers are spared.
"""

from __future__ import annotations

import logging
import posixpath
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pyarrow.fs as pafs
from pyiceberg.table import Table
from pyiceberg.types import DateType, IntegerType, LongType, TimestampType, TimestamptzType

from icekeeper.common.committed_state import expirable_snapshots
from icekeeper.common.config.model import ReaperConfig
from icekeeper.common.fencing import LeaseRecord
from icekeeper.common.in_flight import under_any
from icekeeper.common.internals import (
    java_dataset,
    java_exception_of,
    java_spark_session,
    py4j_gateway,
    spark_jvm,
)
from icekeeper.common.locations import normalize_location
from icekeeper.common.retries import retry
from icekeeper.common.rewrites import REWRITE_ORIGIN_PROPERTY
from icekeeper.common.storage import open_filesystem
from icekeeper.reaper.upsert_compaction import UpsertCompaction

if TYPE_CHECKING:
    from py4j.java_gateway import JavaObject
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def is_commit_conflict(error: BaseException) -> bool:
    """Whether a py4j error is Iceberg's `CommitFailedException`: the catalog row moved under the
    commit (a bookkeeper append won), every internal retry included. Such a step is safe to redo
    from a fresh read of the table; any other error is not retried."""
    java_exception = java_exception_of(error)
    while java_exception is not None:
        if (
            java_exception.getClass().getName()
            == "org.apache.iceberg.exceptions.CommitFailedException"
        ):
            return True
        # A partial-progress rewrite reports file groups that lost their commits this way, as a
        # plain RuntimeException without the CommitFailedException as its cause.
        if "rewrite commits failed" in (java_exception.getMessage() or ""):
            return True
        java_exception = java_exception.getCause()
    return False


@dataclass
class TableReport:
    """What one maintenance pass did to (or, in a dry run, would do to) one table."""

    table: str
    dry_run: bool = False
    retention_filter: str | None = None
    retention_rows_deleted: int = 0
    retention_files_deleted: int = 0
    files_compacted: int = 0
    files_added: int = 0
    bytes_compacted: int = 0
    manifests_rewritten: int = 0
    snapshots_expired: int = 0
    files_deleted: int = 0
    bytes_deleted: int = 0
    orphans_removed: int = 0
    """Of `files_deleted`: the files orphan removal deleted (the rest went with expired
    snapshots)."""
    orphans_spared: int = 0
    compaction_pending: str | None = None
    """Upsert tables: why the pass's compaction is not committed yet (no bookkeeper running, or
    not within `rewrite_wait`); the bookkeeper commits it when it runs."""
    seconds: float = 0.0
    step_seconds: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    planned: list[str] = field(default_factory=list)
    """Dry run: what would change, one line each."""
    skipped: list[str] = field(default_factory=list)
    """Steps left out of the pass, each with why (`gc_disabled`)."""

    def to_json(self) -> dict:
        return {
            key: value for key, value in self.__dict__.items() if key != "planned" or self.dry_run
        }


class FileDeleter:
    """Iceberg's delete callback (a `java.util.function.Consumer<String>` through py4j).

    Iceberg decides what is unreachable; this deletes it, except files in `spared` and files
    inside `spared_folders` (batch folders writers still claim), and counts files and bytes
    (Iceberg's actions report counts but not bytes). In a dry run it only lists.
    """

    def __init__(
        self, spared: set[str], dry_run: bool, spared_folders: set[str] | None = None
    ) -> None:
        self.spared = spared
        self.spared_folders = spared_folders or set()
        self.dry_run = dry_run
        self.deleted: list[str] = []
        self.kept: list[str] = []
        self.bytes = 0

    def accept(self, location: str) -> None:
        try:
            if normalize_location(location) in self.spared or under_any(
                location, self.spared_folders
            ):
                self.kept.append(location)
                return
            filesystem, path = open_filesystem(location)
            info = filesystem.get_file_info(path)
            if info.type != pafs.FileType.File:
                return
            if not self.dry_run:
                filesystem.delete_file(path)
                if isinstance(filesystem, pafs.LocalFileSystem):
                    # Hadoop's local filesystem leaves a `.name.crc` beside files Java wrote.
                    checksum = posixpath.join(
                        posixpath.dirname(path), f".{posixpath.basename(path)}.crc"
                    )
                    if filesystem.get_file_info(checksum).type == pafs.FileType.File:
                        filesystem.delete_file(checksum)
            self.deleted.append(location)
            self.bytes += info.size or 0
        except Exception:
            log.exception("could not delete", extra={"file": location})

    class Java:
        implements = ["java.util.function.Consumer"]


class SparkMaintenance:
    """Retention, compaction, manifest rewrite, expiry and orphan removal for one catalog."""

    def __init__(
        self,
        spark: SparkSession,
        catalog_name: str,
        settings: ReaperConfig,
        orphan_grace_s: float,
        bookkeeper_lease: Callable[[], LeaseRecord | None],
    ) -> None:
        """`bookkeeper_lease`: the group's bookkeeper lease while one holds it (None: no
        bookkeeper is running), which an upsert compaction waits on."""
        from pyspark.java_gateway import ensure_callback_server_started

        self.spark = spark
        self.catalog_name = catalog_name
        self.settings = settings
        self.bookkeeper_lease = bookkeeper_lease
        self.orphan_grace_s = orphan_grace_s  # group.orphan_grace: writers' claims rely on it
        self._jvm = spark_jvm(spark)  # Iceberg's action API has no Python binding
        ensure_callback_server_started(py4j_gateway(spark))

    def spark_name(self, identifier: str) -> str:
        return ".".join(f"`{part}`" for part in [self.catalog_name, *identifier.split(".")])

    def _java_table(self, identifier: str) -> JavaObject:
        self.spark.sql(f"REFRESH TABLE {self.spark_name(identifier)}")
        return self._jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
            java_spark_session(self.spark), f"{self.catalog_name}.{identifier}"
        )

    def _until_committed(self, identifier: str, step: str, action: Callable[[], None]) -> None:
        """Run `action` again while its commit loses to concurrent commits, up to `commit_attempts`.

        Iceberg retries a failed compare-and-swap itself (`commit.retry.num-retries`, 4), but a
        bookkeeper that commits back to back can win all of those; each attempt here re-reads
        the table, so it redoes the step on what is current. Nothing is deleted for a commit that
        failed: Iceberg cleans up only after its commit succeeds."""
        retry(
            lambda _: action(),
            attempts=self.settings.commit_attempts,
            what="maintenance commit lost to concurrent commits",
            retry_on=is_commit_conflict,
            wait_s=lambda attempt: random.uniform(0.1, 0.5) * attempt,  # apart from the bookkeeper
            log_extra={"table": identifier, "step": step},
        )

    def _actions(self) -> JavaObject:
        return self._jvm.org.apache.iceberg.spark.actions.SparkActions.get(
            java_spark_session(self.spark)
        )

    # -- retention ---------------------------------------------------------------------------

    def retention(self, table: Table, identifier: str, report: TableReport, now: datetime) -> None:
        """Delete rows older than the retention age. Iceberg drops whole files in metadata when the
        filter covers them (by partition or column bounds) and rewrites only the files it cuts."""
        settings = self.settings
        if settings.retention is None or not settings.retention_column:
            return
        condition = time_filter(
            table, settings.retention_column, upper=now - timedelta(seconds=settings.retention)
        )
        report.retention_filter = condition
        name = self.spark_name(identifier)
        if report.dry_run:
            rows = self.spark.sql(f"SELECT count(*) FROM {name} WHERE {condition}").first()[0]
            report.planned.append(f"retention: delete {rows} rows where {condition}")
            report.retention_rows_deleted = rows
            return
        before = table.current_snapshot()
        self._until_committed(
            identifier, "retention", lambda: self.spark.sql(f"DELETE FROM {name} WHERE {condition}")
        )
        after = table.refresh().current_snapshot()
        if after is not None and (before is None or after.snapshot_id != before.snapshot_id):
            summary = after.summary.additional_properties if after.summary else {}
            report.retention_rows_deleted = int(summary.get("deleted-records", 0))
            report.retention_files_deleted = int(summary.get("deleted-data-files", 0))

    # -- compaction --------------------------------------------------------------------------

    def compact(
        self,
        table: Table,
        identifier: str,
        report: TableReport,
        now: datetime,
        upsert: bool = False,
    ) -> None:
        """Bin-pack small files to the target size (Iceberg's `rewrite_data_files`), limited to one
        day of the compact filter column when set (seed 000: offset 0 is yesterday). Upsert tables
        are compacted through the bookkeeper instead (`upsert_compaction.py`)."""
        settings = self.settings
        if upsert and not report.dry_run:
            self._compact_upsert_table(table, identifier, report)
            return
        where = None
        if settings.compact_filter_column:
            day = (now - timedelta(days=1 + settings.compact_day_offset)).replace(
                hour=0, minute=0, second=0, microsecond=0
            )
            where = time_filter(
                table, settings.compact_filter_column, lower=day, upper=day + timedelta(days=1)
            )
        target = settings.compact_target_file_size_bytes
        if report.dry_run:
            small = self.spark.sql(
                f"SELECT count(*) FROM {self.spark_name(identifier)}.files WHERE "
                f"file_size_in_bytes < {int(target * 0.75)}"
            ).first()[0]
            report.planned.append(
                f"compaction: of {small} files under 75% of {target} bytes, those"
                + (f" where {where}" if where else "")
            )
            return
        options = {
            "target-file-size-bytes": str(target),
            "min-input-files": "2",
            # Upsert tables: a file whose rows are mostly replaced is rewritten without them,
            # and delete files that no longer apply to any live file leave in the same pass.
            "delete-ratio-threshold": str(settings.compact_delete_ratio),
            "remove-dangling-deletes": "true",
            # Partial progress commits per file group, so an append that lands meanwhile
            # costs one group a retry, not the whole rewrite. A group whose commit lost
            # every retry is dropped silently (not in `failed_data_files_count`) unless the
            # allowed failures are 0: then the call raises and `_until_committed` replans.
            "partial-progress.enabled": "true",
            "partial-progress.max-commits": "10",
            "partial-progress.max-failed-commits": "0",
        }
        arguments = [
            f"table => '{self.catalog_name}.{identifier}'",
            f"options => map({_sql_map(options)})",
        ]
        if where:
            arguments.append(f'where => "{where}"')
        call = f"CALL `{self.catalog_name}`.system.rewrite_data_files({', '.join(arguments)})"

        def rewrite_once() -> None:
            # The groups that lost their commits are planned and rewritten again on the next
            # attempt; the ones that landed are not (they are no longer small).
            failed = int(self.spark.sql(call).first()["failed_data_files_count"])
            if failed:
                report.errors.append(f"compaction: {failed} files failed to be rewritten")

        def rewrite_deletes_once() -> None:
            # Position deletes other engines wrote (a Spark DELETE or MERGE on this table): merged
            # into fewer files, dropping entries whose data files compaction just replaced.
            self.spark.sql(
                f"CALL `{self.catalog_name}`.system.rewrite_position_delete_files(table => "
                f"'{self.catalog_name}.{identifier}', options => map('rewrite-all', 'true'))"
            )

        before = {snapshot.snapshot_id for snapshot in table.refresh().snapshots()}
        try:
            self._until_committed(identifier, "compaction", rewrite_once)
            current = table.refresh().current_snapshot()
            if (
                current is not None
                and current.summary is not None
                and int(current.summary.get("total-delete-files", "0") or 0)
            ):
                self._until_committed(identifier, "compaction", rewrite_deletes_once)
        finally:
            # Counted from the table's history rather than the calls' results: a call that raised
            # may still have committed some groups.
            _count_replaced(table, before, report)

    def _compact_upsert_table(self, table: Table, identifier: str, report: TableReport) -> None:
        """Compacted files written here, committed by the bookkeeper (see `upsert_compaction.py`).

        Iceberg's `rewrite_position_delete_files` is not run on these tables: the bookkeeper's
        commits keep winning over it, and it is not needed, since the delete files of every
        compacted data file leave with it and a data file that collects many is compacted."""
        settings = self.settings
        before = {snapshot.snapshot_id for snapshot in table.refresh().snapshots()}
        try:
            outcome = UpsertCompaction(self.spark, self.catalog_name).run(
                table,
                identifier,
                settings.compact_target_file_size_bytes,
                settings.compact_delete_ratio,
                settings.rewrite_wait,
                self.bookkeeper_lease,
            )
        finally:
            _count_replaced(table, before, report)
        if outcome.refused:
            report.errors.append(
                f"compaction: the bookkeeper refused it ({outcome.refused}); the next pass plans "
                "again"
            )
        elif outcome.set_aside:
            report.errors.append(
                f"compaction: the bookkeeper set it aside ({outcome.set_aside}); see "
                "`icekeeper dead-letters list --rewrites`"
            )
        elif outcome.waiting:
            report.compaction_pending = (
                "no bookkeeper is running; it commits the compaction when it starts"
                if outcome.no_bookkeeper
                else f"not committed within reaper.rewrite_wait ({settings.rewrite_wait:g} s); "
                "the bookkeeper commits it when it can"
            )
            log.info(
                "compaction handed to the bookkeeper, not committed yet",
                extra={
                    "table": identifier,
                    "files": outcome.files_replaced,
                    "waited_s": outcome.waited_s,
                    "reason": report.compaction_pending,
                },
            )

    def rewrite_manifests(self, table: Table, identifier: str, report: TableReport) -> None:
        """Rewrite manifests when the current snapshot has more than `max_manifests`."""
        snapshot = table.refresh().current_snapshot()
        count = len(snapshot.manifests(table.io)) if snapshot else 0
        if count <= self.settings.max_manifests:
            return
        if report.dry_run:
            report.planned.append(
                f"manifests: rewrite {count} manifests (over {self.settings.max_manifests})"
            )
            return
        target = str(self.settings.manifests_file_length)
        if table.properties.get("commit.manifest.target-size-bytes") != target:
            # The rewrite sizes manifests by this table property (seed 000: manifests.file.length).
            table.transaction().set_properties(
                {"commit.manifest.target-size-bytes": target}
            ).commit_transaction()
        call = (
            f"CALL `{self.catalog_name}`.system.rewrite_manifests(table => "
            f"'{self.catalog_name}.{identifier}')"
        )

        def rewrite_once() -> None:
            report.manifests_rewritten = int(
                self.spark.sql(call).first()["rewritten_manifests_count"]
            )

        self._until_committed(identifier, "manifests", rewrite_once)

    # -- expiry and deletion -----------------------------------------------------------------

    def expire(
        self, table: Table, identifier: str, report: TableReport, spared: set[str], now: datetime
    ) -> None:
        """Expire snapshots older than `snapshot_expire_time` beyond the newest `retain_last`, then
        let Iceberg delete the files only they reached (data, manifests, manifest lists)."""
        older_than_ms = int(
            (now - timedelta(seconds=self.settings.snapshot_expire_time)).timestamp() * 1000
        )
        deleter = FileDeleter(spared, dry_run=False)

        def expire_once() -> None:
            expired = expirable_snapshots(table.refresh(), self.settings.retain_last, older_than_ms)
            if not expired:
                return
            if report.dry_run:
                report.planned.append(
                    f"expiry: {len(expired)} snapshots ({expired[-1]} ... {expired[0]})"
                )
                report.snapshots_expired = len(expired)
                return
            # Iceberg's core `ExpireSnapshots` (with file cleanup) rather than the
            # Spark action: the action finds unreachable files with Spark jobs
            # over every manifest, which at streaming history sizes costs far more
            # than it saves (300 snapshots here: 21 s vs 0.9 s, measured).
            update = self._java_table(identifier).expireSnapshots()
            # Only the chosen ids: an age of 0 keeps Iceberg's own age rule from adding others.
            update = update.expireOlderThan(0).retainLast(1).deleteWith(deleter)
            for snapshot_id in expired:
                update = update.expireSnapshotId(snapshot_id)
            update.commit()
            report.snapshots_expired += len(expired)

        self._until_committed(identifier, "expiry", expire_once)
        self._count(report, deleter)

    def remove_orphans(
        self,
        identifier: str,
        report: TableReport,
        spared: set[str],
        claimed: set[str],
        now: datetime,
    ) -> None:
        """Delete files under the table location that no snapshot reaches and that are older than
        the grace period; files named by pending monikers, and files inside batch folders that
        writers still claim, are spared whatever their age (common/in_flight.py).

        The Java action rather than the SQL procedure: the procedure refuses grace periods under
        24 hours, which tests and small deployments need (pending and claimed files are protected
        by name, the grace covers a claim's or a file's first moments)."""
        older_than_ms = int((now - timedelta(seconds=self.orphan_grace_s)).timestamp() * 1000)
        deleter = FileDeleter(spared, dry_run=report.dry_run, spared_folders=claimed)
        java_table = self._java_table(identifier)
        action = (
            self._actions()
            .deleteOrphanFiles(java_table)
            .olderThan(older_than_ms)
            .deleteWith(deleter)
        )
        location = java_table.location()
        if "://" in location and not location.startswith("file:"):
            # Iceberg lists the table's folder with Hadoop's FileSystem by default: on Azure that
            # needs hadoop-azure's abfs driver and a DFS endpoint (Azurite has neither; nor has
            # PySpark the driver). The door lists every store icekeeper writes to.
            action = action.compareToFileList(self._listing(location))
        action.execute()
        if report.dry_run:
            report.planned.extend(f"orphan: {path}" for path in deleter.deleted)
        report.orphans_removed += len(deleter.deleted)
        self._count(report, deleter)

    def _listing(self, location: str) -> JavaObject:
        """Every file under `location` as Iceberg's `compareToFileList` takes them (`file_path`
        in the location's URI form, `last_modified`), listed through the storage door; files in
        hidden folders (`_x`, `.x`, not a `_column=value` partition) are left out, as Iceberg's
        own listing leaves them."""
        filesystem, root = open_filesystem(location)
        selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
        rows = []
        for info in filesystem.get_file_info(selector):
            if info.type != pafs.FileType.File:
                continue
            relative = posixpath.relpath(info.path, root)
            if any(is_hidden(part) for part in relative.split("/")):
                continue
            rows.append((f"{location.rstrip('/')}/{relative}", info.mtime))
        frame = self.spark.createDataFrame(rows, "file_path string, last_modified timestamp")
        return java_dataset(frame)

    @staticmethod
    def _count(report: TableReport, deleter: FileDeleter) -> None:
        report.files_deleted += len(deleter.deleted)
        report.bytes_deleted += deleter.bytes
        report.orphans_spared += len(deleter.kept)


def is_hidden(name: str) -> bool:
    """Whether a folder or file name is hidden from orphan removal, as Iceberg's Hadoop listing
    hides it: a leading `_` or `.`, unless it names a partition (`_kfk_partition=3`)."""
    return name.startswith((".", "_")) and "=" not in name


def _count_replaced(table: Table, before: set[int], report: TableReport) -> None:
    """Count the `replace` snapshots committed since the snapshots `before` into `report`, but
    the bookkeeper's purges (`bookkeeper/purges.py`), which are not this pass's work."""
    for snapshot in table.refresh().snapshots():
        summary = snapshot.summary
        if (
            snapshot.snapshot_id in before
            or summary is None
            or summary.operation.value != "replace"
            or summary.additional_properties.get(REWRITE_ORIGIN_PROPERTY) == "bookkeeper"
        ):
            continue
        properties = summary.additional_properties
        report.files_compacted += int(properties.get("deleted-data-files", 0))
        report.files_added += int(properties.get("added-data-files", 0))
        report.bytes_compacted += int(properties.get("removed-files-size", 0))


def time_filter(
    table: Table, column: str, lower: datetime | None = None, upper: datetime | None = None
) -> str:
    """`column >= lower AND column < upper` as Spark SQL (also parsed by pyiceberg), typed by the
    column: timestamps and dates compare as literals, integers as epoch milliseconds."""
    field_type = table.schema().find_field(column).field_type

    def literal(moment: datetime) -> str:
        if isinstance(field_type, (TimestampType, TimestamptzType)):
            return f"TIMESTAMP '{moment.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%S')}'"
        if isinstance(field_type, DateType):
            return f"DATE '{moment.date().isoformat()}'"
        if isinstance(field_type, (LongType, IntegerType)):
            return str(int(moment.timestamp() * 1000))
        raise ValueError(
            f"{column} is {field_type}: time filters need a timestamp, date or epoch-millisecond "
            "column"
        )

    parts = []
    if lower is not None:
        parts.append(f"{column} >= {literal(lower)}")
    if upper is not None:
        parts.append(f"{column} < {literal(upper)}")
    return " AND ".join(parts)


def _sql_map(options: dict[str, str]) -> str:
    return ", ".join(f"'{key}', '{value}'" for key, value in options.items())


def gc_disabled(table: Table) -> bool:
    """Whether the table says its files must not be deleted by table maintenance (`gc.enabled`
    false): Nessie sets it on every table, since a file may belong to the table on another branch
    too, and leaves garbage collection to its own tool. Iceberg's expiry and orphan removal
    refuse such a table (`ValidationException`); the reaper leaves both out rather than failing
    them on every pass."""
    return table.properties.get("gc.enabled", "true").strip().lower() == "false"

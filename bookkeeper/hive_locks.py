"""A Hive catalog's commit never leaves its table locked in the metastore.

pyiceberg's Hive commit (0.12 `HiveCatalog.commit_table`) takes an exclusive lock on the table
in the metastore, alters the table, and releases the lock in a `finally` over the same
connection. When that connection is lost mid-commit (the metastore restarted, a proxy cut it,
the answer to `alter_table` never came), the release cannot be sent: the commit's outcome is
unknown, which the commit path settles by reading the table back, but the lock stays held. It
is not heartbeated, and Hive Metastore 3.1.3 keeps it until its housekeeping times it out
(`metastore.txn.timeout`, 300 s, and only where the housekeeper runs: see docs/operations.md).
Every commit meanwhile waits for the lock and fails, however many cycles the bookkeeper runs.

Here the bookkeeper's catalog object notes the lock each commit takes and, when the commit
fails with its lock not released, keeps it until the commit path has settled the outcome
(`settle_locks`): a commit found in the table is released over a new connection at once; one not
found is left to the metastore's timeout. Releasing before the outcome is known lost
acknowledged commits in a review: Hive Metastore 3.1.3's `alter_table` is an unconditional write
of the metadata pointer, the lock is all that orders commits, and an `alter_table` still in flight
when the client gave up (a stalled metastore thread, a proxy that cut the client first) landed
after the next, acknowledged commits and set the pointer back over them. Nothing of a commit
found in the table is still in flight. A process that dies mid-commit still leaves its lock to
the metastore's timeout.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from pyiceberg.catalog import Catalog

from icekeeper.common.internals import hive_metastore_client, wrap_hive_clients

log = logging.getLogger(__name__)


class _HeldLocks(threading.local):
    """The locks the current thread's commit took and has not released."""

    def __init__(self) -> None:
        self.ids: list[int] | None = None


def with_released_locks(catalog: Catalog) -> Catalog:
    """Make this Hive catalog object release the lock of a commit that failed before releasing
    it; returns the catalog. Other catalogs are returned unchanged."""
    held = _HeldLocks()

    def tracking(client: Any) -> Any:
        lock, unlock = client.lock, client.unlock

        def locked(request: Any) -> Any:
            response = lock(request)
            if held.ids is not None:
                held.ids.append(response.lockid)
            return response

        def unlocked(request: Any) -> Any:
            result = unlock(request)
            if held.ids is not None and request.lockid in held.ids:
                held.ids.remove(request.lockid)
            return result

        client.lock, client.unlock = locked, unlocked
        return client

    if not wrap_hive_clients(catalog, tracking):
        return catalog
    commit_table = catalog.commit_table

    def committing(*args: Any, **kwargs: Any) -> Any:
        _forget(catalog)  # an earlier commit's, unsettled: left to the metastore's timeout
        held.ids = []
        try:
            return commit_table(*args, **kwargs)
        finally:
            left, held.ids = held.ids, None
            if left:
                setattr(catalog, _UNSETTLED, left)

    catalog.commit_table = committing  # type: ignore[method-assign]  # this object only
    return catalog


_UNSETTLED = "_icekeeper_unsettled_locks"
"""The catalog object's attribute holding the locks of its last failed commit until settled."""


def settle_locks(catalog: Catalog, landed: bool) -> None:
    """The failed commit's outcome is known: release its locks if it `landed` (nothing of it is
    in flight any more), else leave them to the metastore's timeout (its `alter_table` may still
    be on its way, and the lock is what keeps the next commit from being overwritten by it)."""
    if landed:
        left = getattr(catalog, _UNSETTLED, None)
        if left:
            delattr(catalog, _UNSETTLED)
            _release(catalog, left)
        return
    _forget(catalog)


def _forget(catalog: Catalog) -> None:
    left = getattr(catalog, _UNSETTLED, None)
    if left:
        delattr(catalog, _UNSETTLED)
        log.warning(
            "the metastore lock of a commit not found in the table is left to the metastore's "
            "timeout (metastore.txn.timeout); commits to the table wait until then",
            extra={"lock_ids": left},
        )


def _release(catalog: Catalog, lock_ids: list[int]) -> None:
    """Release `lock_ids` over a new connection; a metastore that cannot be reached keeps them
    until its own timeout (logged: commits to the table wait until then)."""
    from hive_metastore.ttypes import NoSuchLockException, UnlockRequest

    try:
        with hive_metastore_client(catalog) as client:
            for lock_id in lock_ids:
                try:
                    client.unlock(UnlockRequest(lockid=lock_id))
                except NoSuchLockException:
                    pass  # released or timed out meanwhile
        log.warning(
            "released the metastore lock of a failed commit",
            extra={"lock_ids": lock_ids},
        )
    except Exception as error:  # noqa: BLE001 - whatever the metastore client raises
        log.warning(
            "could not release the metastore lock of a failed commit; commits to the table "
            "wait for the metastore to time it out",
            extra={"lock_ids": lock_ids, "error": repr(error)},
        )

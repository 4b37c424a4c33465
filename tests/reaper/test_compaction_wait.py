"""How long a reaper pass waits for the bookkeeper to commit its compaction of an upsert table:
only while a bookkeeper runs, which it shows by holding the group's lease (renewed every cycle).
With none the pass goes on at once; while one runs the wait says so at info level, and it ends
when the commit lands or the bookkeeper's lease lapses (killed, hung, stopped). Real lease files
and rewrite requests, no Spark: `wait_for_commit` is the reaper's wait, as its pass calls it."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from icekeeper.common.fencing import Lease, live_lease
from icekeeper.common.rewrites import RewriteRequest, finish_rewrite, is_pending, publish_rewrite
from icekeeper.reaper import upsert_compaction
from icekeeper.reaper.upsert_compaction import CompactionOutcome, wait_for_commit

GROUP = "shop"
WAITING = "waiting for the bookkeeper to commit the compaction"


def handed_over(table_location: Path) -> str:
    """A rewrite request left for the bookkeeper, as the reaper's compaction leaves one."""
    request = RewriteRequest(
        table="shop.items",
        base_snapshot_id=1,
        replaced=[],
        files=[],
        schema={},
        output_folder=str(table_location / "data" / "icekeeper-rewrites" / "r"),
    )
    publish_rewrite(str(table_location), request)
    return request.id


def wait(tmp_path: Path, request_id: str, wait_s: float) -> tuple[bool, CompactionOutcome, float]:
    outcome = CompactionOutcome()
    started = time.monotonic()
    committed = wait_for_commit(
        str(tmp_path / "table"),
        "shop.items",
        request_id,
        wait_s,
        lambda: live_lease(str(tmp_path / "leases"), GROUP),
        outcome,
    )
    return committed, outcome, time.monotonic() - started


@pytest.mark.parametrize("bookkeeper", ["never ran", "stopped"])
def test_no_bookkeeper_running_no_wait(tmp_path: Path, bookkeeper: str) -> None:
    request_id = handed_over(tmp_path / "table")
    if bookkeeper == "stopped":  # it released its lease, as on SIGTERM or after --once
        lease = Lease(str(tmp_path / "leases"), GROUP, ttl_s=30)
        lease.acquire(timeout_s=1)
        lease.release()
    committed, outcome, seconds = wait(tmp_path, request_id, wait_s=60)
    assert not committed and outcome.no_bookkeeper and seconds < 1
    assert is_pending(str(tmp_path / "table"), request_id)  # left for the bookkeeper's start


def test_a_running_bookkeeper_is_waited_for_with_progress_until_it_commits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upsert_compaction, "WAIT_PROGRESS_EVERY_S", 0.5)
    request_id = handed_over(tmp_path / "table")
    bookkeeper = Lease(str(tmp_path / "leases"), GROUP, ttl_s=30)
    bookkeeper.acquire(timeout_s=1)
    commits = threading.Timer(2.0, finish_rewrite, [str(tmp_path / "table"), request_id])
    commits.start()
    with caplog.at_level(logging.INFO, logger="icekeeper.reaper.upsert_compaction"):
        committed, outcome, seconds = wait(tmp_path, request_id, wait_s=60)
    assert committed and not outcome.no_bookkeeper and 1.5 < seconds < 10
    progress = [record for record in caplog.records if record.msg == WAITING]
    assert len(progress) >= 3, "the wait logs its progress"
    assert all(record.levelno == logging.INFO for record in progress)
    assert progress[0].bookkeeper == bookkeeper.owner and progress[0].epoch == 1
    assert progress[-1].waited_s > progress[0].waited_s


def test_the_wait_ends_when_the_bookkeepers_lease_lapses(tmp_path: Path) -> None:
    """A bookkeeper killed or hung mid-wait stops renewing its lease: the wait ends once the lease
    expires (2 s here), not after `rewrite_wait`."""
    request_id = handed_over(tmp_path / "table")
    Lease(str(tmp_path / "leases"), GROUP, ttl_s=2).acquire(timeout_s=1)  # never renewed
    committed, outcome, seconds = wait(tmp_path, request_id, wait_s=60)
    assert not committed and outcome.no_bookkeeper and 1.5 < seconds < 5
    assert is_pending(str(tmp_path / "table"), request_id)

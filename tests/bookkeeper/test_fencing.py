"""Two bookkeepers for the same tables never both commit; a paused one wakes up fenced.

Real processes (`icekeeper bookkeeper`), real signals: the first is stopped with SIGSTOP while
a second takes the lease and commits, then resumed with SIGCONT. Monikers keep arriving the
whole time. Afterwards every record is in the table exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from icekeeper.common.catalog import open_catalog
from icekeeper.common.fencing import Fenced, Lease
from icekeeper.common.transports import open_transport
from tests.support.shop_items import bookkeeper_config, make_moniker
from tests.support.waiting import wait_until


def test_lease_epochs_increase_and_a_newer_lease_fences_the_older(tmp_path: Path) -> None:
    first = Lease(str(tmp_path), "g", ttl_s=0.3)
    assert first.acquire(timeout_s=1) == 1
    second = Lease(str(tmp_path), "g", ttl_s=0.3)
    started = time.monotonic()
    assert second.acquire(timeout_s=5) == 2  # only after the first lease expired
    assert time.monotonic() - started >= 0.25
    try:
        first.renew()
        raise AssertionError("the old holder renewed")
    except Fenced as error:
        assert "stale" in str(error)
    second.release()
    assert Lease(str(tmp_path), "g", ttl_s=30).acquire(timeout_s=1) == 3  # released: no wait


def start_bookkeeper(config_path: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "icekeeper.cli", "bookkeeper", "--config", str(config_path)],
        stdout=open(log.with_suffix(".out"), "w"),
        stderr=open(log, "w"),
        start_new_session=True,
    )


def test_paused_bookkeeper_resumes_fenced_without_duplicates_or_loss(tmp_path: Path) -> None:
    config = bookkeeper_config(
        tmp_path, bookkeeper__lease_ttl="2s", bookkeeper__commit_interval="0.2"
    )
    config_path = tmp_path / "bookkeeper.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")), encoding="utf-8")
    transport = open_transport(config)
    published = 0

    def publish(count: int) -> None:
        nonlocal published
        for _ in range(count):
            seq = published + 1
            transport.publish(
                make_moniker(config, seq, seq - 1 or None, (published * 10, seq * 10))
            )
            published = seq

    first = start_bookkeeper(config_path, tmp_path / "first.log")
    publish(5)
    wait_until(lambda: transport.pending() == [], 60, "the first bookkeeper to commit")
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = start_bookkeeper(config_path, tmp_path / "second.log")
        publish(5)
        wait_until(  # the second took over after the lease TTL and committed
            lambda: transport.pending() == [], 60, "the second bookkeeper to commit", interval_s=0.2
        )
    finally:
        os.kill(first.pid, signal.SIGCONT)
    publish(5)
    assert first.wait(timeout=60) == 3  # woke up, found itself fenced, stopped
    wait_until(lambda: transport.pending() == [], 60, "the second bookkeeper to commit the rest")
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=60) == 0
    assert "fenced" in (tmp_path / "first.log").read_text()
    table = open_catalog(config).load_table("shop.items")
    offsets = sorted(table.scan().to_arrow().column("_kfk_offset").to_pylist())
    assert offsets == list(range(150))
    epochs = {int(s.summary.additional_properties["icekeeper.epoch"]) for s in table.snapshots()}
    assert epochs == {1, 2}


def test_a_second_bookkeeper_once_right_after_the_first_does_not_wait_for_the_lease(
    tmp_path: Path,
) -> None:
    """A bookkeeper that exits cleanly releases its lease: the next one takes it at once instead
    of standing by for the TTL (here two minutes, so a wait fails the test by its timeout)."""
    config = bookkeeper_config(tmp_path, bookkeeper__lease_ttl="120s")
    config_path = tmp_path / "bookkeeper.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")), encoding="utf-8")
    transport = open_transport(config)
    for seq in (1, 2):
        transport.publish(make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 10, seq * 10)))
        started = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "icekeeper.cli",
                "bookkeeper",
                "--config",
                str(config_path),
                "--once",
            ],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "standing by" not in done.stderr, f"run {seq} waited for a lease nobody held"
        assert time.monotonic() - started < 90
    assert transport.pending() == []
    table = open_catalog(config).load_table("shop.items")
    assert sorted(table.scan().to_arrow().column("_kfk_offset").to_pylist()) == list(range(20))

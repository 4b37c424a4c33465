"""Writers' claims on batch folders they are still filling (local disk; one test on every store)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from icekeeper.common.in_flight import (
    InFlightClaims,
    claims_folder,
    live_claimed_folders,
    under_any,
)
from tests.support.waiting import wait_until


def claim_files(location: str) -> list[Path]:
    folder = Path(claims_folder(location).removeprefix("file://"))
    return sorted(folder.glob("*.json")) if folder.exists() else []


def backdate(path: Path, seconds: float) -> None:
    moment = time.time() - seconds
    os.utime(path, (moment, moment))


def test_a_claim_is_live_until_released(tmp_path: Path) -> None:
    location = f"file://{tmp_path}/wh/shop/items"
    folder = f"{location}/data/w1/000000000007-abcd1234"
    claims = InFlightClaims("w1", heartbeat_s=60)
    claims.claim(location, folder)
    try:
        assert live_claimed_folders(location, grace_s=120) == {
            f"{tmp_path}/wh/shop/items/data/w1/000000000007-abcd1234"
        }
        claims.release([folder])
        assert live_claimed_folders(location, grace_s=120) == set() and claim_files(location) == []
    finally:
        claims.close()


def test_the_heartbeat_keeps_a_long_batch_claimed_past_the_grace(tmp_path: Path) -> None:
    location = str(tmp_path / "items")
    claims = InFlightClaims("w1", heartbeat_s=0.2)
    claims.claim(location, f"{location}/data/w1/1")
    try:
        [claim] = claim_files(location)
        backdate(claim, 3600)  # as if the batch had run an hour without a rewrite ...
        assert live_claimed_folders(location, grace_s=60, remove_stale=False) == set()
        wait_until(  # ... then the heartbeat rewrites it
            lambda: live_claimed_folders(location, grace_s=60, remove_stale=False),
            10,
            "the heartbeat to rewrite the claim",
        )
        assert live_claimed_folders(location, grace_s=60) == {f"{location}/data/w1/1"}
    finally:
        claims.close()
    assert claim_files(location) == []


def test_a_dead_writers_claim_goes_stale_and_is_removed(tmp_path: Path) -> None:
    location = str(tmp_path / "items")
    InFlightClaims("w9", heartbeat_s=3600).claim(
        location, f"{location}/data/w9/1"
    )  # never released
    [claim] = claim_files(location)
    backdate(claim, 121)
    assert live_claimed_folders(location, grace_s=120, remove_stale=False) == set()
    assert claim.exists(), "a dry run removes nothing"
    assert live_claimed_folders(location, grace_s=120) == set()
    assert not claim.exists()


def test_a_claimed_folder_covers_its_files_and_nothing_beside_it() -> None:
    folders = {"/wh/t/data/w1/000000000002-aa"}
    assert under_any("file:/wh/t/data/w1/000000000002-aa/part-0.parquet", folders)
    assert under_any("/wh/t/data/w1/000000000002-aa/_ik_p0=3/part-0.parquet", folders)
    assert not under_any("/wh/t/data/w1/000000000002-aa2/part-0.parquet", folders)
    assert not under_any("/wh/t/data/w1/000000000002-aa", folders)


def test_a_reaper_whose_clock_runs_ahead_of_the_store_keeps_live_claims(
    store_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim's age is the store's modification time (its clock) against ... the reaper's clock:
    a reaper node ten minutes ahead of S3 took a claim rewritten a second ago for stale past a
    120 s grace, deleted it, and orphan removal would then delete the batch being written."""
    from icekeeper.common import in_flight

    location = f"{store_root}/items"
    claims = InFlightClaims("w1", heartbeat_s=60)
    claims.claim(location, f"{location}/data/w1/1")
    real_time = time.time
    monkeypatch.setattr(in_flight, "time", SimpleNamespace(time=lambda: real_time() + 600))
    try:
        live = live_claimed_folders(location, grace_s=120)
        assert [folder.rsplit("/", 3)[-3:] for folder in live] == [["data", "w1", "1"]]
        assert live_claimed_folders(location, grace_s=120) == live, "the claim was deleted"
    finally:
        claims.close()

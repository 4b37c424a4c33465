"""Two bookkeepers for the same tables never both commit; a paused one wakes up fenced.

Real processes (`icekeeper bookkeeper`), real signals: the first is stopped with SIGSTOP while
a second takes the lease and commits, then resumed with SIGCONT. Monikers keep arriving the
whole time. Afterwards every record is in the table exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from icekeeper.common.catalog import open_catalog
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.fencing import Fenced, Lease, live_lease
from icekeeper.common.storage import file_exists, list_files
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


# The lease on every store the storage door opens (a local folder, S3, Azure Blob): it relies on
# the store's atomic create-if-absent only (common/fencing.py); `store_root` runs each on all.


def test_racing_standbys_on_each_store_leave_one_holder(store_root: str) -> None:
    leases = [Lease(store_root, "g", ttl_s=30) for _ in range(8)]
    start = threading.Barrier(len(leases))
    epochs: list[int | None] = []

    def take(lease: Lease) -> None:
        start.wait()
        try:
            epochs.append(lease.acquire(timeout_s=0))
        except TimeoutError:
            epochs.append(None)

    threads = [threading.Thread(target=take, args=(lease,)) for lease in leases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(epochs, key=lambda e: e or 0) == [None] * 7 + [1]
    # The lease is a file on the store itself, which every node of the group reads.
    assert file_exists(f"{store_root}/g/lease-000000000001.json")
    holder = next(lease for lease in leases if lease.epoch == 1)
    assert live_lease(store_root, "g").owner == holder.owner


def test_a_holder_paused_past_its_ttl_on_each_store_is_fenced(store_root: str) -> None:
    holder = Lease(store_root, "g", ttl_s=2)
    assert holder.acquire(timeout_s=1) == 1
    time.sleep(2.2)  # paused: the lease expired without a renewal
    standby = Lease(store_root, "g", ttl_s=2)
    assert standby.acquire(timeout_s=5) == 2
    assert file_exists(f"{store_root}/g/lease-000000000002.json")
    with pytest.raises(Fenced, match="stale"):
        holder.check()
    with pytest.raises(Fenced):
        holder.renew()
    standby.renew()
    assert standby.epoch == 2


def test_a_late_holder_takes_its_lease_again_before_a_standby_can(store_root: str) -> None:
    """A holder that did not renew within half its TTL (a slow cycle, a GC pause) may already look
    expired to a standby on another node: its next check takes the next epoch itself, so the
    standby's create of that epoch fails and it stands by; two holders never believe they hold
    the lease at once."""
    holder = Lease(store_root, "g", ttl_s=1.0)
    assert holder.acquire(timeout_s=1) == 1
    time.sleep(1.1)  # lease-1 has expired by every clock
    holder.check()
    assert holder.epoch == 2
    standby = Lease(store_root, "g", ttl_s=1.0)
    with pytest.raises(TimeoutError):
        standby.acquire(timeout_s=0)
    assert live_lease(store_root, "g").owner == holder.owner
    holder.renew()
    assert holder.epoch == 2
    holder.release()
    assert standby.acquire(timeout_s=1) == 3  # released: taken at once


def s3_bookkeeper_config(tmp_path: Path, s3_storage, **overrides: str) -> IcekeeperConfig:
    """`shop.items` with every file on the stack's S3 server, as a config on two nodes would have
    it: the warehouse, monikers, dead letters, leases and reports under one prefix; only the
    SQLite catalog is local (a shared catalog is issue 28 item 3)."""
    prefix = s3_storage.uri(f"fencing-{uuid.uuid4().hex[:8]}")
    properties = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"{prefix}/warehouse",
        **s3_storage.pyiceberg_properties(),
    }
    return bookkeeper_config(
        tmp_path,
        catalog__properties=json.dumps(properties),
        group__lease_uri=f"{prefix}/leases",
        transport__uri=f"{prefix}/txlog",
        transport__dead_letter_uri=f"{prefix}/dead-letter",
        bookkeeper__commit_report_path=f"{prefix}/reports/commits.jsonl",
        **overrides,
    )


@pytest.mark.integration
def test_paused_bookkeeper_on_s3_resumes_fenced_without_duplicates_or_loss(
    tmp_path: Path, s3_storage
) -> None:
    """The SIGSTOP/SIGCONT test with no shared folder: two bookkeeper processes of one group whose
    lease, monikers and table files are all on the S3 server."""
    config = s3_bookkeeper_config(
        tmp_path, s3_storage, bookkeeper__lease_ttl="6s", bookkeeper__commit_interval="0.2"
    )
    config_path = tmp_path / "bookkeeper.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")), encoding="utf-8")
    open_catalog(config)  # configures this process's storage door as the bookkeepers' are
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
    wait_until(lambda: transport.pending() == [], 90, "the first bookkeeper to commit")
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = start_bookkeeper(config_path, tmp_path / "second.log")
        publish(5)
        wait_until(
            lambda: transport.pending() == [], 90, "the second bookkeeper to commit", interval_s=0.2
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
    assert table.location().startswith("s3://")
    offsets = sorted(table.scan().to_arrow().column("_kfk_offset").to_pylist())
    assert offsets == list(range(150))
    # Commits carry their bookkeeper's epoch, and no commit of an older epoch came after one of
    # a newer (a slow cycle may take the lease again with the next epoch: see common/fencing.py).
    epochs = [
        int(s.summary.additional_properties["icekeeper.epoch"])
        for s in sorted(table.snapshots(), key=lambda s: s.sequence_number)
    ]
    assert epochs == sorted(epochs) and epochs[0] < epochs[-1]
    # Every epoch's lease is a file on S3, created once: none missing, none beyond the newest.
    lease_folder = f"{config.group.lease_uri}/{config.group.name}"
    leases = sorted(info.base_name for info in list_files(lease_folder))
    assert leases == [f"lease-{epoch:012d}.json" for epoch in range(1, len(leases) + 1)]
    assert len(leases) >= epochs[-1]
    # The commit report is on S3 too: one object per cycle that committed.
    assert list_files(config.bookkeeper.commit_report_path)


def test_a_bookkeeper_that_takes_its_lease_again_commits_with_the_next_epoch(
    tmp_path: Path,
) -> None:
    """A cycle that starts after more than half the lease's TTL (a slow cycle, a pause) takes the
    lease again with the next epoch (`Lease.check`); the bookkeeper goes on committing, under the
    new epoch, rather than failing every cycle while it keeps renewing the lease (no standby could
    take over)."""
    from icekeeper.bookkeeper.service import Bookkeeper

    config = bookkeeper_config(tmp_path, bookkeeper__lease_ttl="1s")
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    assert bookkeeper.take_lease(timeout_s=2) == 1
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    assert bookkeeper.run_cycle().committed_monikers == 1
    time.sleep(0.7)  # not renewed within half the TTL: the next cycle takes epoch 2
    transport.publish(make_moniker(config, 2, 1, (10, 20)))
    assert bookkeeper.run_cycle().committed_monikers == 1
    assert bookkeeper.lease.epoch == 2 and bookkeeper.committer.epoch == 2
    table = open_catalog(config).load_table("shop.items")
    summary = table.current_snapshot().summary.additional_properties
    assert summary["icekeeper.epoch"] == "2"
    assert sorted(table.scan().to_arrow().column("_kfk_offset").to_pylist()) == list(range(20))
    bookkeeper.lease.release()


@pytest.mark.integration
def test_a_lease_created_on_s3_whose_answer_was_lost_is_still_held(s3_storage) -> None:
    """S3 did the conditional PUT of the next epoch's lease but its answer was lost; botocore
    sent it again and got 412 (the file is there: this holder's own). The holder must go on with
    that epoch, not take itself for fenced (nor, acquiring, stand by against itself for a TTL)."""
    from tests.support.object_stores import storage_door
    from tests.support.relay import Relay, containing, lose

    properties = s3_storage.pyiceberg_properties()
    relay = Relay(properties["s3.endpoint"])
    root = s3_storage.uri(f"lost-{uuid.uuid4().hex[:8]}")
    try:
        with storage_door({**properties, "s3.endpoint": relay.address}):
            holder = Lease(root, "g", ttl_s=3.0)
            relay.arm(containing(b"If-None-Match"), lose())
            assert holder.acquire(timeout_s=0) == 1
            assert relay.lost == 1
            time.sleep(1.6)  # not renewed within half its TTL: the next check takes epoch 2
            relay.arm(containing(b"If-None-Match"), lose())
            holder.check()
            assert relay.lost == 2
            assert holder.epoch == 2
            holder.renew()
            assert live_lease(root, "g").owner == holder.owner
            with pytest.raises(TimeoutError):
                Lease(root, "g", ttl_s=3.0).acquire(timeout_s=0)
    finally:
        relay.close()


def test_the_lease_works_on_a_folder_without_hard_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vfat, SMB/Azure Files and many FUSE mounts refuse `link` (EPERM, EOPNOTSUPP); icekeeper's
    leases worked there before the storage door (`O_EXCL`) and must still: taken, renewed, taken
    over after a pause, one winner of a race. (This sandbox cannot mount such a filesystem, so
    `link` answers as theirs does.)"""
    import errno as errnos

    def refused(source: str, target: str) -> None:
        raise PermissionError(errnos.EPERM, "Operation not permitted", source, target)

    monkeypatch.setattr(os, "link", refused)
    root = str(tmp_path / "leases")
    holder = Lease(root, "g", ttl_s=1.0)
    assert holder.acquire(timeout_s=0) == 1
    holder.renew()
    with pytest.raises(TimeoutError):
        Lease(root, "g", ttl_s=1.0).acquire(timeout_s=0)
    time.sleep(1.1)  # paused past its TTL
    standbys = [Lease(root, "g", ttl_s=1.0) for _ in range(6)]
    start = threading.Barrier(len(standbys))
    epochs: list[int | None] = []

    def take(lease: Lease) -> None:
        start.wait()
        try:
            epochs.append(lease.acquire(timeout_s=0))
        except TimeoutError:
            epochs.append(None)

    threads = [threading.Thread(target=take, args=(lease,)) for lease in standbys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(epochs, key=lambda e: e or 0) == [None] * 5 + [2]
    with pytest.raises(Fenced):
        holder.check()


def test_a_dead_holder_whose_clock_ran_ahead_is_taken_over_after_its_ttl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Expiry was judged only by the standby's wall clock against the time the holder wrote: a
    holder on a node an hour ahead that dies left a lease "renewed" an hour into the future, and
    no bookkeeper committed for that hour. A standby that has seen it unrenewed for its TTL takes
    it."""
    from icekeeper.common import fencing

    root = str(tmp_path / "leases")
    ahead = fencing._now_ms
    monkeypatch.setattr(fencing, "_now_ms", lambda: ahead() + 3_600_000)
    holder = Lease(root, "g", ttl_s=1.0)
    assert holder.acquire(timeout_s=0) == 1
    holder.renew()
    monkeypatch.setattr(fencing, "_now_ms", ahead)  # the holder's node dies; this one is on time
    standby = Lease(root, "g", ttl_s=1.0)
    started = time.monotonic()
    assert standby.acquire(timeout_s=5, poll_s=0.1) == 2
    assert 1.0 <= time.monotonic() - started < 5
    with pytest.raises(Fenced):
        holder.check()


def test_a_lease_file_left_empty_is_taken_over_after_its_ttl(tmp_path: Path) -> None:
    """A lease created with `O_EXCL` (a mount without hard links, an older icekeeper) whose node
    died before writing it stays empty: read as "being created", held from now, it kept every
    standby waiting for ever."""
    folder = tmp_path / "leases" / "g"
    folder.mkdir(parents=True)
    (folder / "lease-000000000001.json").write_bytes(b"")
    standby = Lease(str(tmp_path / "leases"), "g", ttl_s=1.0)
    with pytest.raises(TimeoutError):
        Lease(str(tmp_path / "leases"), "g", ttl_s=1.0).acquire(timeout_s=0)
    assert standby.acquire(timeout_s=5, poll_s=0.1) == 2


def test_a_standby_does_not_list_every_lease_file_at_every_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lease files are never deleted, so after thousands of takeovers or retaken epochs a listing
    of the folder grows without end (3,000 files: 0.85 s a listing on s3proxy), and a standby
    listed it every poll (twice a second). It reads the newest and probes for the next instead,
    and still takes the lease on the full listing once it is free."""
    from icekeeper.common import fencing

    root = str(tmp_path / "leases")
    folder = fencing.group_folder(root, "g")
    os.makedirs(folder)
    for epoch in range(1, 301):  # a long history of takeovers
        Path(folder, fencing._name(epoch)).write_bytes(
            fencing._encode(fencing.LeaseRecord(epoch, "gone", 0, 1000))
        )
    holder = Lease(root, "g", ttl_s=2.0)
    assert holder.acquire(timeout_s=0) == 301
    listings: list[str] = []
    real_list_files = fencing.list_files
    monkeypatch.setattr(
        fencing, "list_files", lambda uri, **kw: listings.append(uri) or real_list_files(uri, **kw)
    )
    standby = Lease(root, "g", ttl_s=2.0)
    with pytest.raises(TimeoutError):
        standby.acquire(timeout_s=1.5, poll_s=0.1)
    assert len(listings) <= 2, f"{len(listings)} listings of the lease folder in 1.5 s"
    holder.check()  # past half its TTL: it takes epoch 302 itself
    holder.release()
    assert standby.acquire(timeout_s=2, poll_s=0.1) == holder.epoch + 1 == 303


def test_a_bookkeeper_outlives_an_outage_of_the_lease_store_before_it_holds_the_lease(
    tmp_path: Path,
) -> None:
    """Taking the lease runs before the cycle loop that rides out outages: a store error there
    (S3 answering 503, a mount gone) ended the process, leaving the group without a standby until
    someone restarted it. Here the lease folder cannot be made (a file stands where its parent
    folder goes) until the outage ends; the bookkeeper, started meanwhile, then takes the lease
    and commits what waited."""
    from icekeeper.bookkeeper.service import Bookkeeper

    blocked = tmp_path / "store"
    blocked.write_text("a file where the lease folder's parent should be")
    config = bookkeeper_config(tmp_path, group__lease_uri=str(blocked / "leases"))
    transport = open_transport(config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    bookkeeper = Bookkeeper(config)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            bookkeeper.run()
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            failures.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(3)
    assert thread.is_alive() and not failures, failures
    assert transport.pending() != []  # nothing committed without the lease
    blocked.unlink()  # the store answers again
    try:
        wait_until(lambda: transport.pending() == [], 60, "the moniker committed")
    finally:
        bookkeeper.stop.set()
        thread.join(30)
    assert not failures, failures
    table = open_catalog(config).load_table("shop.items")
    assert table.scan().to_arrow().num_rows == 10


def test_a_lease_store_without_conditional_writes_stops_the_bookkeeper_not_waits(
    tmp_path: Path,
) -> None:
    """Riding out an outage of the lease store must not ride out a store that can never hold a
    lease: `group.lease_uri` on a store without conditional creates (gs://, hdfs://; pyarrow's
    in-memory `mock://` here) stopped the bookkeeper at once with `ConditionalWritesUnsupported`
    before the outage fix; since, it logged "lease store not answering" every 30 s for good, with
    no bookkeeper and its monikers waiting. It must stop, saying why."""
    from icekeeper.bookkeeper.service import Bookkeeper
    from icekeeper.common.storage import ConditionalWritesUnsupported

    config = bookkeeper_config(tmp_path, group__lease_uri="mock:///leases")
    bookkeeper = Bookkeeper(config)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            bookkeeper.run()
        except BaseException as error:  # noqa: BLE001 - reported by the assertions below
            failures.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    stopped = not thread.is_alive()
    bookkeeper.stop.set()
    thread.join(30)
    assert stopped, "the bookkeeper still waits for a lease its store cannot hold"
    assert [type(error) for error in failures] == [ConditionalWritesUnsupported], failures
    assert "no conditional writes here" in str(failures[0])


def test_a_lease_whose_create_landed_though_the_call_failed_is_held(
    tmp_path: Path, monkeypatch
) -> None:
    """A create whose answer is lost after it landed (an SDK that gave up after its retries) fails,
    and the next look finds the epoch's file with this one's owner. Read as another holder's, a
    bookkeeper taking the lease stood by its own lease until it expired (a TTL without a
    bookkeeper; the lease store's outage is waited out since c3dbac8), and a holder re-taking its
    lease at half its TTL fenced itself and stopped. Both hold the epoch they created."""
    from icekeeper.common import fencing

    real_create = fencing.create_if_absent
    answers_lost: list[str] = []

    def create_answer_lost(uri: str, body: bytes) -> bool:
        created = real_create(uri, body)
        if created and uri not in answers_lost:
            answers_lost.append(uri)
            raise OSError("connection reset by peer: the create landed, its answer was lost")
        return created

    monkeypatch.setattr(fencing, "create_if_absent", create_answer_lost)
    lease = Lease(str(tmp_path), "g", ttl_s=2)
    assert lease.acquire(timeout_s=10, poll_s=0.1) == 1  # epoch 1, its own, not 2 after its TTL
    time.sleep(1.1)  # past half its TTL: the next check takes epoch 2 itself
    with pytest.raises(OSError, match="answer was lost"):
        lease.check()
    lease.check()  # epoch 2 is its own: held, not fenced
    assert lease.epoch == 2
    lease.renew()
    holder = live_lease(str(tmp_path), "g")
    assert holder is not None and (holder.epoch, holder.owner) == (2, lease.owner)
    assert len(answers_lost) == 2


def test_a_bookkeeper_waiting_out_a_lease_store_outage_stays_alive(tmp_path: Path) -> None:
    """Each poll of a lease store that does not answer shows life, as a failed cycle does
    (`/healthz`): a liveness probe's restart would meet the same outage. Without it, a standby or
    starting bookkeeper waiting out a long outage was called stuck after `LIVENESS_GRACE_S` and
    restarted in a loop. Not ready meanwhile."""
    from icekeeper.bookkeeper.service import LIVENESS_GRACE_S, Bookkeeper

    blocked = tmp_path / "store"
    blocked.write_text("a file where the lease folder's parent should be")
    bookkeeper = Bookkeeper(bookkeeper_config(tmp_path, group__lease_uri=str(blocked / "leases")))
    thread = threading.Thread(target=bookkeeper.run, daemon=True)
    thread.start()
    try:
        time.sleep(1)
        bookkeeper._alive_at = time.monotonic() - LIVENESS_GRACE_S - 60  # as after a long outage
        wait_until(lambda: bookkeeper.liveness()[0], 30, "a poll of the lease store shows life")
        assert not bookkeeper.readiness()[0]
    finally:
        bookkeeper.stop.set()
        thread.join(30)

"""What an operator's probes, alerts and `kill` see of bookkeepers: an active one and a standby.

Real processes (`icekeeper bookkeeper`) and real signals, as a Kubernetes Deployment of two runs
them: `/healthz` is liveness (a standby waiting for the lease is alive: a liveness probe must not
restart it), `/readyz` is readiness (only the one holding the lease and cycling), the health JSON
says `lease: true` only for that one, `icekeeper_last_cycle_timestamp_seconds` is when the last
cycle finished (0 before the first), and SIGTERM stops a bookkeeper within a second whether it
stands by or waits for its next cycle.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.fencing import Lease, current_lease
from icekeeper.common.transports import open_transport
from tests.bookkeeper.test_fencing import s3_bookkeeper_config
from tests.support.object_stores import storage_door
from tests.support.relay import Relay, containing, stall
from tests.support.shop_items import bookkeeper_config, make_moniker
from tests.support.waiting import wait_until

LAST_CYCLE = "icekeeper_last_cycle_timestamp_seconds"


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:  # not listening yet
        return 0, ""


def probe(port: int, endpoint: str) -> tuple[int, dict]:
    status, body = get(f"http://127.0.0.1:{port}/{endpoint}")
    return status, json.loads(body) if status else {}


def metric(port: int, name: str) -> float:
    status, body = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    [value] = [line.split()[-1] for line in body.splitlines() if line.startswith(name + " ")]
    return float(value)


def free_port() -> int:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return probe_socket.getsockname()[1]


class BookkeeperProcess:
    """`icekeeper bookkeeper --config <path>` with its HTTP endpoints on a port of its own."""

    def __init__(self, config_path: Path, log: Path) -> None:
        self.port = free_port()
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "icekeeper.cli", "bookkeeper", "--config", str(config_path)],
            env={**os.environ, "ICEKEEPER__BOOKKEEPER__HTTP_PORT": str(self.port)},
            stdout=subprocess.DEVNULL,
            stderr=open(log, "w"),
            start_new_session=True,
        )

    def seconds_to_stop(self) -> float:
        """SIGTERM, then the seconds until the process exited (exit status 0 asserted)."""
        sent = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired as still_running:
            self.process.kill()
            raise AssertionError(
                f"still running 30 s after SIGTERM: {self.log.read_text()}"
            ) from still_running
        elapsed = time.monotonic() - sent
        assert status == 0, self.log.read_text()
        return elapsed

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def test_a_standby_is_alive_not_ready_says_so_and_stops_within_a_second(tmp_path: Path) -> None:
    # One cycle every 30 s: the active bookkeeper spends the test waiting for its next cycle
    # (an idle wait, which SIGTERM must cut short), and its last cycle stays put between scrapes.
    config = bookkeeper_config(
        tmp_path, bookkeeper__commit_interval="30", bookkeeper__lease_ttl="120"
    )
    config_path = tmp_path / "bookkeeper.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")), encoding="utf-8")
    open_transport(config).publish(make_moniker(config, 1, None, (0, 10)))
    processes = []
    try:
        active = BookkeeperProcess(config_path, tmp_path / "active.log")
        processes.append(active)
        wait_until(lambda: probe(active.port, "readyz")[0] == 200, 120, "the first to be ready")
        status, health = probe(active.port, "healthz")
        assert status == 200 and health["lease"] is True and health["epoch"] == 1, health
        assert health["state"] == "active"

        standby = BookkeeperProcess(config_path, tmp_path / "standby.log")
        processes.append(standby)
        wait_until(
            lambda: probe(standby.port, "healthz")[1].get("state") == "standby",
            120,
            "the second to stand by",
        )
        # Alive (a liveness probe must leave it be), not ready, and not claiming the lease.
        status, health = probe(standby.port, "healthz")
        assert status == 200 and health["ok"] is True, health
        assert health["lease"] is False and health["epoch"] is None, health
        assert health["holder_epoch"] == 1 and health["holder"], health
        status, readiness = probe(standby.port, "readyz")
        assert status == 503 and readiness["reason"].startswith("standing by: "), readiness
        assert metric(standby.port, LAST_CYCLE) == 0  # it never cycled

        # The active one's last cycle is when it finished, not when it is scraped.
        last_cycle = metric(active.port, LAST_CYCLE)
        assert 0 < last_cycle < time.time()
        time.sleep(1.5)  # time passing between two scrapes is the point
        assert metric(active.port, LAST_CYCLE) == last_cycle

        # SIGTERM: the standby stops within a second, without ever taking the lease.
        assert standby.seconds_to_stop() < 1.0
        assert "lease acquired" not in standby.log.read_text()
        # A third stands by; SIGTERM stops the active one, waiting for its next cycle, within
        # a second, and the third takes over at once (the lease was released) and is ready.
        successor = BookkeeperProcess(config_path, tmp_path / "successor.log")
        processes.append(successor)
        wait_until(
            lambda: probe(successor.port, "healthz")[1].get("state") == "standby",
            120,
            "the third to stand by",
        )
        assert active.seconds_to_stop() < 1.0
        wait_until(lambda: probe(successor.port, "readyz")[0] == 200, 30, "the third to be ready")
        status, health = probe(successor.port, "healthz")
        assert health["lease"] is True and health["epoch"] == 2 and health["state"] == "active"
        assert successor.seconds_to_stop() < 1.0
    finally:
        for process in processes:
            process.kill()


def test_last_cycle_timestamp_is_when_the_cycle_finished(tmp_path: Path) -> None:
    """A staleness alert (`time() - icekeeper_last_cycle_timestamp_seconds > 120`) must be able to
    fire: the value moves only when a cycle finishes, never when Prometheus scrapes."""
    bookkeeper = Bookkeeper(bookkeeper_config(tmp_path))
    port = bookkeeper.serve_http(port=0)
    try:
        assert metric(port, LAST_CYCLE) == 0  # no cycle yet
        before = time.time()
        bookkeeper.run_cycle()
        after = time.time()
        finished = metric(port, LAST_CYCLE)
        assert before <= finished <= after
        time.sleep(1.5)  # a scrape later, with no cycle in between: the point of the test
        assert metric(port, LAST_CYCLE) == finished
    finally:
        bookkeeper.http.stop()


@pytest.mark.integration
@pytest.mark.parametrize("hangs", ["first look", "create", "standby poll", "renewal"])
def test_sigterm_stops_a_bookkeeper_whose_lease_store_hangs(
    tmp_path: Path, s3_storage, hangs: str
) -> None:
    """The lease's store accepts each request and never answers (an S3 server that hangs, a proxy
    holding the request): one call then lasts as long as the client's timeouts and retries
    (pyarrow's: 11 s for a listing here; botocore's, which creates: up to two minutes). A
    bookkeeper taking the lease, standing by or renewing it at the start of a cycle waited that
    long after SIGTERM, and its exit as long again for the call (pyarrow's S3 finalizer). It must
    stop within a second or so in each state, exit 0 as after any SIGTERM, and stay alive
    (`/healthz`) while the store hangs, until the signal. A create that lands after the process
    gave up on it is nobody's lease: it expires after its TTL and the next bookkeeper takes the
    next epoch."""
    relay = Relay(s3_storage.pyiceberg_properties()["s3.endpoint"])
    config = s3_bookkeeper_config(
        tmp_path, s3_storage, bookkeeper__lease_ttl="3s", bookkeeper__commit_interval="0.5"
    )
    settings = config.model_dump(mode="json")
    settings["catalog"]["properties"]["s3.endpoint"] = relay.address  # every S3 call, relayed
    config_path = tmp_path / "bookkeeper.yaml"
    config_path.write_text(yaml.safe_dump(settings), encoding="utf-8")
    group = config.group
    lease_requests = containing(b"leases")  # the lease folder's objects and their listing
    state = {"standby poll": "standby", "renewal": "active"}.get(hangs, "starting")
    bookkeeper = None
    try:
        if hangs == "standby poll":
            with storage_door(s3_storage.pyiceberg_properties()):
                holder = Lease(group.lease_uri, group.name, ttl_s=60)
                assert holder.acquire(timeout_s=10) == 1  # held by another node for the test
        if hangs == "first look":
            relay.arm(lease_requests, stall(), times=1000)
        if hangs == "create":  # the create reaches the store and lands; its answer never comes
            relay.arm(containing(b"If-None-Match"), stall(), times=1000)
        bookkeeper = BookkeeperProcess(config_path, tmp_path / "bookkeeper.log")
        if hangs == "standby poll":
            wait_until(
                lambda: probe(bookkeeper.port, "healthz")[1].get("state") == "standby",
                120,
                "the bookkeeper to stand by",
            )
            relay.arm(lease_requests, stall(), times=1000)
        if hangs == "renewal":
            wait_until(lambda: probe(bookkeeper.port, "readyz")[0] == 200, 120, "it to be ready")
            relay.arm(lease_requests, stall(), times=1000)
        wait_until(lambda: relay.faulted > 0, 120, "a lease request to hang")
        time.sleep(1.0)  # hung for a while: no poll or cycle ends meanwhile
        status, health = probe(bookkeeper.port, "healthz")
        assert status == 200 and health["state"] == state, health
        seconds = bookkeeper.seconds_to_stop()
        log_text = bookkeeper.log.read_text()
        assert seconds < 2.0, f"{seconds:.1f} s after SIGTERM; {log_text[-3000:]}"
        assert "Traceback" not in log_text and "fenced" not in log_text, log_text[-3000:]
        # Only the active one ever held the lease: an abandoned create is nobody's.
        assert ("lease acquired" in log_text) == (hangs == "renewal"), log_text[-3000:]
        if hangs == "create":
            with storage_door(s3_storage.pyiceberg_properties()):
                landed = current_lease(group.lease_uri, group.name)
                assert landed is not None and landed.epoch == 1  # it landed, unanswered
                successor = Lease(group.lease_uri, group.name, ttl_s=3)
                began = time.monotonic()
                assert successor.acquire(timeout_s=30, poll_s=0.2) == 2  # after its TTL
                assert time.monotonic() - began < 30
    finally:
        if bookkeeper is not None:
            bookkeeper.kill()
        relay.close()

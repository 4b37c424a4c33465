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

import yaml

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.transports import open_transport
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

"""What `icekeeper bench soak` reads each interval: the roles' memory and the commits since the last
interval (the soak itself runs for an hour and more: `make soak`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from icekeeper.bench.soak import CommitReports, resident_kinds_mb, role_memory


def test_commit_latencies_are_those_of_snapshots_with_files_written_since_the_last_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "commits.jsonl"
    reports = CommitReports(path)
    assert reports.new_latencies_ms() == []  # before the bookkeeper's first commit

    def line(latency_ms: float, files: int) -> bytes:
        return (json.dumps({"latency_ms": latency_ms, "files": files}) + "\n").encode()

    path.write_bytes(line(10.0, 1) + line(5.0, 0) + line(30.0, 2))  # a heartbeat has no files
    assert reports.new_latencies_ms() == [10.0, 30.0]
    with open(path, "ab") as file:
        file.write(line(40.0, 1) + b'{"latency_ms": 5')  # the bookkeeper is writing a line
    assert reports.new_latencies_ms() == [40.0]
    with open(path, "ab") as file:
        file.write(b'0.0, "files": 1}\n')
    assert reports.new_latencies_ms() == [50.0]
    assert reports.new_latencies_ms() == []


def test_role_memory_counts_each_role_and_the_processes_it_started() -> None:
    # A "role" that starts a child process, as the bookkeeper starts its footer readers.
    role = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            "child = subprocess.Popen([sys.executable, '-c', "
            "'import time; print(1, flush=True); time.sleep(60)'], stdout=subprocess.PIPE); "
            "child.stdout.readline(); "  # the child's interpreter is up, not just forked
            "print(child.pid, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert role.stdout is not None
        child = int(role.stdout.readline())
        memory = role_memory({"bookkeeper": role.pid})
        assert memory["bookkeeper"] and memory["bookkeeper"] > 1  # MB of a running interpreter
        assert memory["bookkeeper_workers"] and memory["bookkeeper_workers"] > 1
        kinds = resident_kinds_mb(role.pid)  # its heaps and the files it mapped, within VmRSS
        assert kinds["anon"] > 1 and kinds["file"] > 1
        assert kinds["anon"] + kinds["file"] + kinds["shmem"] <= memory["bookkeeper"] + 0.5
    finally:
        with contextlib.suppress(NameError, ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        role.kill()
        role.wait()
    assert role_memory({"bookkeeper": role.pid}) == {"bookkeeper": None}  # gone: no figure
    assert resident_kinds_mb(role.pid) == {}

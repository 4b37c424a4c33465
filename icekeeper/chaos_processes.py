"""The processes of a chaos run: each icekeeper component as a child process that chaos may kill
(SIGKILL, the whole process group: the Python driver and its Spark JVM), pause and restart."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Component:
    """One icekeeper process that chaos may kill and restart.

    `name` is its place in the run (`writer-1`, `bookkeeper`), what the report counts kills by;
    `log_name` tells its log files apart when another process takes the same place later (a
    writer of a new layout, `chaos_reassign.py`).
    """

    name: str
    argv: list[str]
    env: dict[str, str]
    logs: Path
    process: subprocess.Popen | None = None
    starts: int = 0
    log_name: str | None = None

    def start(self) -> None:
        self.starts += 1
        log = open(self.logs / f"{self.log_name or self.name}.{self.starts}.log", "wb")
        self.process = subprocess.Popen(
            self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group: the Python driver and its Spark JVM."""
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()

    def terminate(self, timeout_s: float = 60) -> int | None:
        if not self.alive():
            return self.process.returncode if self.process else None
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

"""How much of the machine the stack's stand-in servers take while a bench phase runs.

Issue 28's figures run icekeeper and the servers it talks to (s3proxy for S3, Iceberg's REST
catalog fixture) on the same two cores: every GET s3proxy answers and every metadata file the REST
server rewrites is CPU the bookkeeper does not get. On AWS S3 or a hosted catalog that work is on
someone else's machines. A figure that misses its target is only explained by saying how much of
the cores went to the servers, so the benches read it from `/proc` (Linux) around each phase:

- each server's CPU seconds (its process and the processes it started: user + system time);
- the whole machine's busy CPU seconds (all cores, `/proc/stat`) and the phase's wall seconds, so
  `machine_busy_s / (wall_s * cores)` says whether the phase was bound by the cores.

Elsewhere (no `/proc`, or a server not started by this stack: `foreign` in `stack status`) the
figures are left out, never guessed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from icekeeper.common.config import IcekeeperConfig

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def stack_server_pids(stack_config: IcekeeperConfig, names: Sequence[str]) -> dict[str, int]:
    """The pid of each of the stack services `names` that this stack started and that runs."""
    if not names:
        return {}
    from icekeeper.localstack.stack import LocalStack

    stack = LocalStack(stack_config, only=list(names), with_services=list(names))
    return {
        status.name: status.pid
        for status in stack.status()
        if status.state == "running" and status.pid is not None
    }


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) of `pid` and of the processes it started that still run;
    None once `pid` is gone or where there is no `/proc`."""
    total, queue, seen = 0.0, [pid], set()
    while queue:
        current = queue.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            with open(f"/proc/{current}/stat", encoding="ascii") as stat:
                # The command (field 2) may hold spaces: fields are counted after its ")".
                fields = stat.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        except (OSError, IndexError, ValueError):
            if current == pid:
                return None
            continue  # a child that ended meanwhile
        queue.extend(child_pids(current))
    return total


def child_pids(pid: int) -> list[int]:
    """The processes `pid` started, or none where /proc does not say (a kernel without
    `CONFIG_PROC_CHILDREN`): the process's own CPU is still read."""
    children: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as listed:
                children.extend(int(child) for child in listed.read().split())
    except (OSError, ValueError):
        pass
    return children


def machine_busy_s() -> float | None:
    """CPU seconds all cores spent busy since boot (everything but idle and I/O wait), or None
    where there is no `/proc/stat`."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    # Guest time (fields 9, 10) is already counted in user and nice.
    return (sum(fields[:8]) - idle) / CLOCK_TICKS


@dataclass
class PhaseCpu:
    """What one phase took: wall seconds, the machine's busy CPU seconds, each server's CPU
    seconds (filled when the phase ends)."""

    wall_s: float = 0.0
    machine_busy_s: float | None = None
    servers_s: dict[str, float] = field(default_factory=dict)

    def figures(self, prefix: str) -> dict[str, float | int]:
        """The phase's figures for a bench's JSON, named `<prefix>_...`."""
        out: dict[str, float | int] = {f"{prefix}_wall_s": round(self.wall_s, 3)}
        if self.machine_busy_s is not None:
            out[f"{prefix}_machine_busy_cpu_s"] = round(self.machine_busy_s, 2)
            out["cores"] = os.cpu_count() or 1
        for name, seconds in self.servers_s.items():
            out[f"{prefix}_{name}_server_cpu_s"] = round(seconds, 2)
        return out


class ServerCpu:
    """Reads the CPU of the stack's servers (by service name) around bench phases."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids

    @classmethod
    def of_stack(cls, stack_config: IcekeeperConfig, names: Sequence[str]) -> ServerCpu:
        return cls(stack_server_pids(stack_config, names))

    def servers_s(self) -> dict[str, float]:
        readings = {name: process_cpu_s(pid) for name, pid in self.pids.items()}
        return {name: seconds for name, seconds in readings.items() if seconds is not None}

    @contextmanager
    def phase(self) -> Iterator[PhaseCpu]:
        """The CPU the servers and the machine used while the block ran (`PhaseCpu`, filled when
        the block ends; a server gone meanwhile is left out)."""
        result = PhaseCpu()
        servers_before, busy_before = self.servers_s(), machine_busy_s()
        started = time.monotonic()
        try:
            yield result
        finally:
            result.wall_s = time.monotonic() - started
            busy_after = machine_busy_s()
            if busy_before is not None and busy_after is not None:
                result.machine_busy_s = busy_after - busy_before
            after = self.servers_s()
            result.servers_s = {
                name: after[name] - seconds
                for name, seconds in servers_before.items()
                if name in after
            }

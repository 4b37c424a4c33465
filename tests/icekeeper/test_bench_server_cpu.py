"""The benches' reading of the CPU the stack's servers and the machine spent (`server_cpu.py`):
what explains a figure bound by two cores shared with s3proxy and the REST catalog."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from icekeeper.bench.server_cpu import PhaseCpu, ServerCpu, machine_busy_s, process_cpu_s

BURN_S = 0.6
BURNER = f"""
import time
started = time.process_time()
while time.process_time() - started < {BURN_S}:
    pass
print("burnt", flush=True)
time.sleep(30)
"""

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc (Linux)")


def test_a_servers_cpu_counts_the_processes_it_started_and_the_machine_sees_it(
    tmp_path: Path,
) -> None:
    """A server whose work is done by a process it started (a launcher script running a JVM)
    is charged that process's CPU; the machine's busy time covers it too."""
    script = tmp_path / "burner.py"
    script.write_text(BURNER)
    # The shell stays the parent (two commands: it cannot exec the last one in its place).
    launcher = subprocess.Popen(
        ["sh", "-c", f"{sys.executable} {script}; true"], stdout=subprocess.PIPE, text=True
    )
    try:
        meter = ServerCpu({"burner": launcher.pid})
        with meter.phase() as phase:
            assert launcher.stdout is not None
            assert launcher.stdout.readline().strip() == "burnt"
        # Clock ticks of 10 ms, and the interpreter's start is counted too.
        assert BURN_S - 0.05 <= phase.servers_s["burner"] <= BURN_S + 1.0
        assert phase.machine_busy_s is not None
        assert phase.machine_busy_s >= phase.servers_s["burner"] - 0.05
        assert phase.wall_s >= BURN_S - 0.05
        figures = phase.figures("footers_10")
        assert figures["footers_10_burner_server_cpu_s"] == round(phase.servers_s["burner"], 2)
        assert (
            figures["footers_10_machine_busy_cpu_s"]
            >= figures["footers_10_burner_server_cpu_s"] - 0.05
        )
    finally:
        launcher.kill()
        launcher.wait()
    # Gone: no reading, and a phase leaves it out rather than report a guess.
    time.sleep(0.1)
    subprocess.run(["pkill", "-f", str(script)], check=False)
    for _ in range(50):
        if process_cpu_s(launcher.pid) is None:
            break
        time.sleep(0.1)
    assert process_cpu_s(launcher.pid) is None
    with ServerCpu({"burner": launcher.pid}).phase() as gone:
        pass
    assert gone.servers_s == {} and "footers_burner_server_cpu_s" not in gone.figures("footers")


def test_the_machine_busy_time_grows_with_work_and_not_while_asleep() -> None:
    before = machine_busy_s()
    started = time.process_time()
    while time.process_time() - started < 0.3:
        pass
    after = machine_busy_s()
    assert before is not None and after is not None and after - before >= 0.25
    assert PhaseCpu(wall_s=1.0).figures("x") == {"x_wall_s": 1.0}

"""`icekeeper demo`: the main job end to end on embedded defaults.

Starts the local stack in a state folder the demo owns (`<state_dir>/demo`, reset every run so
the result is always the same), produces seed 000's `tbl_test_1` stream through the registry,
reads it back, and prints it the way the seed article does. The pipeline stages (writer,
bookkeeper, reaper, other engines) are added here as they land.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Callable

from common.config.model import IcekeeperConfig
from icekeeper.localstack.stack import LocalStack
from icekeeper.samples.produce import produce_seed_sample
from icekeeper.samples.readback import read_topic

Progress = Callable[[str], None]


def demo_config(config: IcekeeperConfig) -> IcekeeperConfig:
    """The config with its state folder moved to `<state_dir>/demo`, everything else kept."""
    demo_state = str(Path(config.state_dir) / "demo")
    dumped = config.model_dump(mode="python")
    dumped = _replace_prefix(dumped, config.state_dir, demo_state)
    return IcekeeperConfig.model_validate(dumped)


def _replace_prefix(node: Any, old: str, new: str) -> Any:
    if isinstance(node, str):
        return node.replace(old, new, 1) if old in node else node
    if isinstance(node, dict):
        return {key: _replace_prefix(value, old, new) for key, value in node.items()}
    if isinstance(node, list):
        return [_replace_prefix(value, old, new) for value in node]
    return node


def run_demo(config: IcekeeperConfig, keep_stack: bool = False, progress: Progress = print) -> dict[str, Any]:
    """Run the demo; returns the figures `icekeeper demo --json` prints."""
    started = time.monotonic()
    config = demo_config(config)
    stack = LocalStack(config)
    stack.down(progress=lambda message: None)
    shutil.rmtree(config.state_dir, ignore_errors=True)
    report = stack.up(progress)
    progress(f"local stack up in {report.seconds:.1f}s")
    try:
        source = config.sources[0]
        produced = produce_seed_sample(config, progress=progress)
        records = read_topic(source, produced["topic"])
        print(f"\n# {len(records)} records read back from {produced['topic']} (decoded through the registry)")
        for record in records:
            print(record.listing())
        print()
        return {
            "records_produced": produced["records"],
            "records_read_back": len(records),
            "schema_versions": len(produced["value_schema_ids"]),
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        if not keep_stack:
            stack.down(progress)

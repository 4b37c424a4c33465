"""The arrow engine's task bodies run with Python's cyclic collector paused
(`common/collector.py`), and the collector comes back as it was when the last body in the process
ends."""

from __future__ import annotations

import gc
import threading

import pyarrow as pa
import pytest

from icekeeper.common.collector import gc_paused
from icekeeper.writers.arrow_engine import task as task_module
from icekeeper.writers.arrow_engine.kafka_read import RawRecords
from icekeeper.writers.arrow_engine.task import TaskPlan, run_task
from icekeeper.writers.arrow_engine.task_ranges import TaskRange
from tests.support.seed_config import seed_config


def test_a_task_reads_with_the_collector_paused_and_restores_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = seed_config()
    seen: list[bool] = []

    def read_range(
        source: object, task: object, with_keys: bool = False, consumer: object = None
    ) -> RawRecords:
        seen.append(gc.isenabled())
        empty = pa.array([], pa.int64())
        return RawRecords(pa.array([], pa.binary()), empty, empty, [])

    monkeypatch.setattr(task_module, "read_range", read_range)
    plan = TaskPlan(config.sources[0], [], [], {}, [], config.metadata_columns)
    assert gc.isenabled()
    run_task(plan, TaskRange(0, "orders", 0, 0, 10))
    assert seen == [False]
    assert gc.isenabled()


def test_the_collector_returns_when_the_last_of_several_threads_leaves() -> None:
    first_in, second_left, first_may_leave = threading.Event(), threading.Event(), threading.Event()
    states: dict[str, bool] = {}

    def first() -> None:
        with gc_paused():
            first_in.set()
            first_may_leave.wait(10)
        states["after first"] = gc.isenabled()

    def second() -> None:
        first_in.wait(10)
        with gc_paused():
            pass
        states["after second, first inside"] = gc.isenabled()
        second_left.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    second_left.wait(10)
    first_may_leave.set()
    for thread in threads:
        thread.join(10)
    assert states == {"after second, first inside": False, "after first": True}


def test_a_collector_off_before_stays_off() -> None:
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()

"""After an idle cycle the bookkeeper does not sit out its commit interval: a moniker that
arrives meanwhile is committed at once (freshness), while busy cycles keep the interval."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.catalog import open_catalog
from icekeeper.common.transports import open_transport
from tests.support.shop_items import bookkeeper_config, make_moniker
from tests.support.waiting import wait_until


def test_a_moniker_after_an_idle_cycle_is_committed_before_the_interval_ends(
    tmp_path: Path,
) -> None:
    config = bookkeeper_config(
        tmp_path, bookkeeper__commit_interval="60", bookkeeper__idle_poll_interval="0.05"
    )
    bookkeeper = Bookkeeper(config)
    cycles: list[float] = []
    thread = threading.Thread(
        target=bookkeeper.run, kwargs={"on_cycle": lambda report: cycles.append(time.monotonic())}
    )
    thread.start()
    try:
        wait_until(lambda: cycles, 30, "the first (idle) cycle", interval_s=0.05)
        open_transport(config).publish(make_moniker(config, 1, None, (0, 10)))
        wait_until(lambda: len(cycles) >= 2, 30, "the cycle committing it", interval_s=0.05)
        assert len(cycles) == 2 and cycles[1] - cycles[0] < 10, (
            "committed long before the 60 s interval"
        )
        table = open_catalog(config).load_table("shop.items")
        assert len(table.scan().to_arrow()) == 10
        # That cycle committed: the next one waits for the interval, however much arrives.
        open_transport(config).publish(make_moniker(config, 2, 1, (10, 20)))
        time.sleep(1.5)  # the point: for a while, no cycle runs
        assert len(cycles) == 2
    finally:
        bookkeeper.stop.set()
        thread.join(timeout=30)

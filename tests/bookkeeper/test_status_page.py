"""The group's status page as an operator's browser shows it: a running bookkeeper serves it on its
HTTP port, headless Chromium renders it (a screenshot is kept in the test's folder), and every
number it shows is the one `icekeeper status --json` prints, the last reaper pass is the report
file's last line, and the charts hold the commits this bookkeeper made."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import uuid
from html.parser import HTMLParser
from pathlib import Path

import pytest

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.reaper.service import Reaper
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from icekeeper.writers.job import WriterJob
from tests.support.browser import chromium as run_chromium
from tests.support.browser import find_chromium, screenshot
from tests.support.http_get import free_port, get
from tests.support.pipeline import register_catalog
from tests.support.seed_config import SEED_ENVIRON, seed_config
from tests.support.stack import TEST_STACK_PORTS, stack_environ
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture(scope="module")
def chromium() -> str:
    program, why = find_chromium()
    if program is None:
        pytest.skip(f"no headless Chromium here: {why}")
    return program


class Numbers(HTMLParser):
    """The page's numbers by their `data-status` place, and its charts' point counts."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}
        self.charts: dict[str, int] = {}
        self._open: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if "data-status" in found:
            self._open = found["data-status"]
            self.values[self._open] = ""
        if tag == "svg" and "data-chart" in found:
            self.charts[found["data-chart"] or ""] = int(found["data-points"] or 0)

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self.values[self._open] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._open = None


def seconds(text: str) -> tuple[float, float]:
    """`12.3s`, `4.1m`, `1.2h` as seconds, and half the last digit's worth (its rounding)."""
    number, unit = float(text[:-1]), {"s": 1, "m": 60, "h": 3600}[text[-1]]
    return number * unit, 0.05 * unit


def place(document: dict, path: str):
    for part in path.split("/"):
        document = document[int(part)] if isinstance(document, list) else document[part]
    return document


def test_the_status_page_shows_in_chromium_what_status_json_says(
    chromium: str, local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    port = free_port()
    environ = {
        **stack_environ(tmp_path, TEST_STACK_PORTS),
        "ICEKEEPER__SOURCES__0__TOPICS": f"[{unique_topic}]",
        "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": "600",
        "ICEKEEPER__SOURCES__0__DEAD_LETTER_TOPIC": unique_topic + ".dlq",
        "ICEKEEPER__TABLES__0__TOPICS": f"[{unique_topic}]",
        "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
        "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
        "ICEKEEPER__TABLES__0__MODE": "changelog",
        "ICEKEEPER__CATALOG__NAME": f"cat_{uuid.uuid4().hex[:8]}",
        "ICEKEEPER__SPARK__MASTER": "local[2]",
        "ICEKEEPER__WRITER__TRIGGER_INTERVAL": "0",
        "ICEKEEPER__BOOKKEEPER__HTTP_PORT": str(port),
        # Cycles far apart, none started by a new moniker: what a writer publishes after the
        # first cycles stays pending while the page is looked at.
        "ICEKEEPER__BOOKKEEPER__COMMIT_INTERVAL": "600",
        "ICEKEEPER__BOOKKEEPER__IDLE_POLL_INTERVAL": "0",
    }
    config = seed_config(environ)
    spec = SyntheticSpec(seed=3, keys=50, events=3000, schema_changes=0, poison_ratio=0.01)
    produce_synthetic(config, spec, topic=unique_topic, partitions=3, progress=lambda m: None)
    WriterJob(config, spark=spark).run(max_batches=2)

    bookkeeper = Bookkeeper(config)
    cycles: list = []
    runner = threading.Thread(target=bookkeeper.run, kwargs={"on_cycle": cycles.append})
    runner.start()
    try:
        wait_until(lambda: cycles, 120, "the bookkeeper's first cycle")
        assert sum(result.snapshot_id is not None for result in cycles[0].tables) >= 1
        WriterJob(config, spark=spark).run(max_batches=1)  # pending until the next cycle
        register_catalog(spark, config)
        Reaper(config, spark=spark).run_pass()  # a real pass, reported to reaper.report_path

        url = f"http://127.0.0.1:{port}/"
        shot = screenshot(chromium, url, tmp_path / "status-page.png")
        dom = run_chromium(chromium, url, "--dump-dom")
        status = json.loads(
            subprocess.run(
                [sys.executable, "-m", "icekeeper.cli", "status", "--json"],
                env={**os.environ, **SEED_ENVIRON, **environ},
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            ).stdout
        )
        code, body = get(f"http://127.0.0.1:{port}/status.json")
        assert code == 200
        served = json.loads(body)
    finally:
        bookkeeper.stop.set()
        runner.join(timeout=120)
    assert not runner.is_alive()

    print(f"screenshot: {shot}")  # shown with -s; kept in the test's tmp folder
    assert shot.stat().st_size > 20_000, "a blank screenshot"
    assert "<script" not in dom and not re.search(r"""(src|href)=["']?https?://""", dom)
    page = Numbers()
    page.feed(dom)

    # The state under test: committed rows, a pending moniker, lag, dead letters.
    [table] = status["tables"]
    [writer] = status["writers"]
    assert table["rows"] > 0 and table["pending_monikers"] == 1 and writer["lag"] > 0
    assert status["dead_letters"][f"topic {unique_topic}.dlq"] > 0

    checked = 0
    for path, text in page.values.items():
        if path.startswith("reaper/"):
            continue
        expected = place(status, path)
        if path.endswith("_age_s") or path.endswith("freshness_s"):
            # Ages grow between the page and the command: a minute of slack, and the rounding.
            shown, rounding = seconds(text)
            assert shown == pytest.approx(expected, abs=60 + rounding), path
        elif path.endswith("pending_bytes"):
            assert float(text) == pytest.approx(expected / 1e6, abs=0.05), path
        else:
            assert int(text.replace(",", "")) == expected, path
        checked += 1
    for must in (
        "tables/0/rows",
        "tables/0/pending_monikers",
        "tables/0/freshness_s",
        "writers/0/lag",
        "writers/0/pending_monikers",
        f"dead_letters/topic {unique_topic}.dlq",
        "dead_letters/monikers",
    ):
        assert must in page.values, f"the page does not show {must}"

    # The last reaper pass, as its report file's last line says.
    last = json.loads(Path(config.reaper.report_path).read_text().splitlines()[-1])
    assert not any(table["errors"] for table in last["tables"]), last
    for key in ("files_compacted", "snapshots_expired", "orphans_removed", "files_deleted"):
        assert int(page.values[f"reaper/{key}"].replace(",", "")) == last[key], key
    assert page.values["reaper/seconds"] == str(last["seconds"])

    # The charts: every commit of the first cycle is a point of the latency chart.
    commits = sum(result.snapshot_id is not None for result in cycles[0].tables)
    assert (
        page.charts["commit latency shop.orders"]
        == commits
        == len(served["history"]["shop.orders"])
    )
    assert page.charts["freshness shop.orders"] == commits + 1  # and freshness now
    assert checked >= 10

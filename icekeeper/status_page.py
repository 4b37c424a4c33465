"""The group's status page, served on the bookkeeper's HTTP port (`/` and `/status`).

One self-contained HTML page (inline CSS and SVG, no script, nothing fetched from elsewhere, so
it works on a closed network and behind a port-forward): per table freshness and commit latency
over the last hour as charts, rows, pending monikers, writers' lag, dead letters and the last
reaper pass. `/status.json` is the same document as JSON.

The numbers are `icekeeper status`'s (`icekeeper.status.collect_status`, read where they live:
snapshot summaries, the transport, writer checkpoints, Kafka); the charts are the commits this
bookkeeper made in the last hour (`BookkeeperMetrics.recent_commits`: a restarted or newly active
bookkeeper starts empty charts); the reaper pass is the last line of `reaper.report_path` (a
reaper on another host writes its own file: the page then says none was found).

It lives beside `icekeeper status` rather than in `bookkeeper/`: it is the group's page (it reads
the writers' and the reaper's state, as the command does); the bookkeeper only serves it.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from icekeeper.bookkeeper.observability import HISTORY_S, BookkeeperMetrics, CommitPoint
from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.common.http_endpoints import Page
from icekeeper.status import collect_status, format_age

REFRESH_S = 30
"""The page reloads itself this often (a meta refresh: no script)."""


class StatusPage:
    """Builds the page per request; `pages()` are the routes the HTTP server adds."""

    def __init__(
        self,
        config: IcekeeperConfig,
        metrics: BookkeeperMetrics,
        bookkeeper: Callable[[], dict[str, Any]],
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.bookkeeper = bookkeeper
        """This bookkeeper's health details (state, lease, epoch), as `/healthz` shows them."""

    def pages(self) -> dict[str, Page]:
        def page() -> tuple[bytes, str]:
            return render_page(self.document()).encode(), "text/html; charset=utf-8"

        def document() -> tuple[bytes, str]:
            return json.dumps(self.document()).encode(), "application/json"

        return {"/": page, "/status": page, "/status.json": document}

    def document(self) -> dict[str, Any]:
        """`icekeeper status --json`'s object, with `bookkeeper`, `history` and `reaper` added."""
        status = collect_status(self.config).to_json()
        now = status["taken_ms"] / 1000
        return {
            **status,
            "group": self.config.group.name,
            "bookkeeper": self.bookkeeper(),
            "history": {
                row["table"]: [_point(p) for p in self.metrics.recent_commits(row["table"], now)]
                for row in status["tables"]
            },
            "reaper": last_line(Path(self.config.reaper.report_path)),
        }


def _point(point: CommitPoint) -> dict[str, float | None]:
    return {"at": point.at, "latency_s": point.latency_s, "freshness_s": point.freshness_s}


def last_line(path: Path, chunk: int = 65536) -> dict[str, Any] | None:
    """The last complete JSON line of a JSON-lines file that only grows, read from its end (the
    reaper's report keeps every pass); None when there is none yet."""
    try:
        with open(path, "rb") as handle:
            end = handle.seek(0, 2)
            tail = b""
            position = end
            while position > 0:
                position = max(0, position - chunk)
                handle.seek(position)
                tail = handle.read(end - position)
                lines = tail.rstrip(b"\n").split(b"\n")
                if len(lines) > 1 or position == 0:
                    break
    except FileNotFoundError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            return json.loads(line)
        except ValueError:  # a line cut short by a killed reaper: the one before
            continue
    return None


def _cell(value: Any, path: str, kind: str = "count") -> str:
    """A table cell; `data-status` names the value's place in `/status.json` (slash-separated),
    so a reader (or a test) can match what it shows with `icekeeper status --json`."""
    if value is None:
        text = "?"
    elif kind == "age":
        text = format_age(value)
    elif kind == "mb":
        text = f"{value / 1e6:.1f}"
    else:
        text = f"{value:,}" if isinstance(value, int) else str(value)
    return f'<td class="num" data-status="{html.escape(path)}">{html.escape(text)}</td>'


def chart(points: list[tuple[float, float]], now: float, unit: str, label: str) -> str:
    """An inline SVG line chart of `points` (time, value) over the hour before `now`."""
    width, height, left, bottom = 370, 110, 54, 18
    top = max((value for _, value in points), default=0.0) or 1.0
    inner_w, inner_h = width - left - 6, height - bottom - 8

    def x(at: float) -> float:
        return left + inner_w * (1 - (now - at) / HISTORY_S)

    def y(value: float) -> float:
        return 8 + inner_h * (1 - value / top)

    coordinates = " ".join(f"{x(at):.1f},{y(value):.1f}" for at, value in points)
    dots = "".join(
        f'<circle cx="{x(at):.1f}" cy="{y(value):.1f}" r="2"/>' for at, value in points[-200:]
    )
    empty = (
        f'<text x="{left + inner_w / 2}" y="{height / 2}" text-anchor="middle" class="muted">'
        "no commits in the last hour</text>"
        if not points
        else ""
    )
    return (
        f'<svg class="chart" width="{width}" height="{height}" role="img" '
        f'data-chart="{html.escape(label)}" data-points="{len(points)}" '
        f'aria-label="{html.escape(label)}">'
        f"<title>{html.escape(label)}</title>"
        f'<line x1="{left}" y1="{8 + inner_h}" x2="{width - 6}" y2="{8 + inner_h}" class="axis"/>'
        f'<line x1="{left}" y1="8" x2="{left}" y2="{8 + inner_h}" class="axis"/>'
        f'<text x="{left - 4}" y="14" text-anchor="end">{_top_label(top, unit)}</text>'
        f'<text x="{left - 4}" y="{8 + inner_h}" text-anchor="end">0</text>'
        f'<text x="{left}" y="{height - 4}">-60m</text>'
        f'<text x="{left + inner_w / 2}" y="{height - 4}" text-anchor="middle">-30m</text>'
        f'<text x="{width - 6}" y="{height - 4}" text-anchor="end">now</text>'
        f'<polyline points="{coordinates}"/>{dots}{empty}</svg>'
    )


def _top_label(value: float, unit: str) -> str:
    if unit == "s":
        return format_age(value)  # freshness may be hours or days: 7920.9h, not 28515240s
    return f"{value:.0f}{unit}" if value >= 10 else f"{value:.2g}{unit}"


STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#1d2330;background:#fbfbfd}
h1{font-size:20px;margin:0 0 .2em}h2{font-size:16px;margin:1.6em 0 .5em}
table{border-collapse:collapse;margin-bottom:.5em}
th,td{padding:.25em .7em;border-bottom:1px solid #e2e4ea;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#7a8090;fill:#7a8090}.bad{color:#b3261e}.good{color:#1e7b34}
.charts{display:flex;flex-wrap:wrap;gap:1em}.card{background:#fff;border:1px solid #e2e4ea;
border-radius:6px;padding:.6em .8em}
svg.chart text{font-size:10px;fill:#555}svg.chart .axis{stroke:#bbb}
svg.chart polyline{fill:none;stroke:#2f6fdb;stroke-width:1.5}svg.chart circle{fill:#2f6fdb}
"""


def render_page(document: dict[str, Any]) -> str:
    """The whole page, from `StatusPage.document()`."""
    now = document["taken_ms"] / 1000
    taken = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(now))
    keeper = document["bookkeeper"]
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f'<meta http-equiv="refresh" content="{REFRESH_S}">',
        f"<title>icekeeper: {html.escape(document['group'])}</title><style>{STYLE}</style>",
        "</head><body>",
        f"<h1>icekeeper group {html.escape(document['group'])}</h1>",
        f'<p class="muted">at {taken}Z; this bookkeeper: {html.escape(str(keeper.get("state")))}'
        f", epoch {html.escape(str(keeper.get('epoch')))}; reloads every {REFRESH_S}s</p>",
        "<h2>Tables</h2><table><tr><th>table</th><th>rows</th><th>snapshots</th>"
        "<th>last commit</th><th>freshness</th><th>pending monikers</th><th>pending MB</th>"
        "<th>quarantined</th></tr>",
    ]
    for index, row in enumerate(document["tables"]):
        at = f"tables/{index}/"
        parts.append(f"<tr><td>{html.escape(row['table'])}</td>")
        if not row.get("exists"):
            parts.append('<td colspan=4 class="muted">not created yet</td>')
        else:
            parts += [
                _cell(row["rows"], at + "rows"),
                _cell(row["snapshots"], at + "snapshots"),
                _cell(row["last_commit_age_s"], at + "last_commit_age_s", "age"),
                _cell(row["freshness_s"], at + "freshness_s", "age"),
            ]
        parts += [
            _cell(row["pending_monikers"], at + "pending_monikers"),
            _cell(row["pending_bytes"], at + "pending_bytes", "mb"),
            _cell(row.get("quarantined_records"), at + "quarantined_records")
            if row.get("exists")
            else "<td></td>",
            "</tr>",
        ]
    parts.append("</table><h2>Last hour</h2><div class=charts>")
    for row in document["tables"]:
        history = document["history"].get(row["table"], [])
        freshness = [(p["at"], p["freshness_s"]) for p in history if p["freshness_s"] is not None]
        if row.get("freshness_s") is not None:
            freshness.append((now, row["freshness_s"]))  # it grows until the next commit
        latency = [(p["at"], p["latency_s"] * 1000) for p in history]
        name = html.escape(row["table"])
        parts += [
            f"<div class=card><b>{name}</b>: freshness (s)<br>",
            chart(freshness, now, "s", f"freshness {row['table']}"),
            f"</div><div class=card><b>{name}</b>: commit latency (ms), {len(history)} commits<br>",
            chart(latency, now, "ms", f"commit latency {row['table']}"),
            "</div>",
        ]
    parts.append("</div>")
    parts += _writers(document["writers"])
    parts.append("<h2>Dead letters</h2><table>")
    for place, count in document["dead_letters"].items():
        parts.append(
            f"<tr><td>{html.escape(place)}</td>{_cell(count, 'dead_letters/' + place)}</tr>"
        )
    parts.append("</table>")
    parts += _reaper(document["reaper"])
    if document["problems"]:
        parts.append("<h2 class=bad>Problems</h2><ul>")
        parts += [f"<li>{html.escape(problem)}</li>" for problem in document["problems"]]
        parts.append("</ul>")
    parts.append("</body></html>")
    return "".join(parts)


def _writers(writers: list[dict[str, Any]]) -> list[str]:
    parts = ["<h2>Writers</h2>"]
    if not writers:
        return [*parts, '<p class="muted">no writer has run yet</p>']
    parts.append(
        "<table><tr><th>writer</th><th>last batch</th><th>last moniker</th>"
        "<th>pending monikers</th><th>lag (records)</th><th>partitions</th></tr>"
    )
    for index, writer in enumerate(writers):
        at = f"writers/{index}/"
        last = writer["last_moniker"]
        partitions = ", ".join(
            f"{p['topic']}[{p['partition']}]: {'?' if p['lag'] is None else p['lag']}"
            for p in writer["partitions"]
        )
        parts += [
            f"<tr><td>{html.escape(writer['writer'])}</td>",
            _cell(writer["last_batch_age_s"], at + "last_batch_age_s", "age"),
            f"<td>seq {html.escape(str(last['seq']))} ({html.escape(last['state'])})</td>",
            _cell(writer["pending_monikers"], at + "pending_monikers"),
            _cell(writer["lag"], at + "lag"),
            f'<td class="muted">{html.escape(partitions)}</td></tr>',
        ]
    parts.append("</table>")
    return parts


def _reaper(last: dict[str, Any] | None) -> list[str]:
    parts = ["<h2>Last reaper pass</h2>"]
    if last is None:
        return [*parts, '<p class="muted">no reaper pass reported (reaper.report_path)</p>']
    errors = [
        f"{table['table']}: {error}"
        for table in last.get("tables", [])
        for error in table.get("errors", [])
    ]
    parts.append(
        f"<p>started {html.escape(str(last.get('started_at')))}"
        f"{' (dry run)' if last.get('dry_run') else ''}</p><table>"
    )
    for key in (
        "seconds",
        "files_compacted",
        "snapshots_expired",
        "orphans_removed",
        "files_deleted",
        "retention_rows_deleted",
    ):
        if key in last:
            parts.append(f"<tr><td>{key.replace('_', ' ')}</td>{_cell(last[key], 'reaper/' + key)}")
    parts.append(f"<tr><td>failed steps</td>{_cell(len(errors), 'reaper/errors')}</table>")
    parts += [f'<p class="bad">{html.escape(error)}</p>' for error in errors]
    parts += [f'<p class="muted">{html.escape(reason)}</p>' for reason in last.get("skipped", [])]
    return parts

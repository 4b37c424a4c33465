"""The chaos run's reassignment: Kafka partitions change writer while monikers wait, and writers
restart over a backlog larger than one commit.

Writers share the topic by `writer.instance_count` / `instance_index`, each under its own
`writer_id`. Like a scaled StatefulSet, the writer in slot s is `w<s+1>` in every layout, and a
reassignment changes the count (2, then 3, then 1, then 2 again, ...): most partitions change
writer, writers that stay restart under their own id with another share of the topic, and a
scale-up brings a writer id the tables have never seen. It happens at the worst moment:

1. The bookkeeper is killed and stays down (it lags), while the writers publish on.
2. Once `w1` alone has more files pending for each table than one commit takes
   (`bookkeeper.max_files_per_commit`) and every writer has a moniker pending, the writers are
   killed, pending monikers and all.
3. The writers of the new layout start. Those that stay come back with their backlog pending; on
   the Azure queue each sends its journal copies again (`writers/job.py` resume) while the first
   messages still wait in the queue, and `w1` is the writer whose monikers all travel as pointers
   to their journal copy (`transport.max_inline_bytes: 0`). Nothing is committed meanwhile, so a
   writer given a partition starts it where the tables' committed offsets are, over ranges the
   previous writer's pending monikers cover: both monikers of a partition are pending at once.
4. Once every writer of the new layout has published, and one of them a moniker that reaches past
   what its partition's previous writer has pending, the bookkeeper comes back to all of it at
   once: in one receive both copies of the restarted writers' monikers, more files than one
   commit takes, and two writers' monikers over the same offsets. One of the two is refused (the
   bookkeeper takes writers' chains in id order), and the records past the other must then come
   from the refused writer if it stays, which has gone on from where its refused moniker ended.

Records trickle in throughout (`chaos_pacing.RecordGate.trickling`): writers publish only what
arrives, and what arrives once the old writers are gone lies past their pending monikers. The
tables must still end exact (`chaos_verify.py`). The moments come from the run's seed, as the
kills do; the layouts follow one another in a fixed order. A step that does not happen within
`WAIT_S` is noted in the event's record (`backlog_reached`, `new_writers_published`,
`reaching_past`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from icekeeper.chaos_pacing import RecordGate
from icekeeper.chaos_processes import Component
from icekeeper.common.moniker import Moniker
from icekeeper.common.transports.base import MonikerTransport

Progress = Callable[[str], None]
WRITER_COUNTS = (2, 3, 1)
"""The `writer.instance_count` of each layout in turn, from the run's first; 2 -> 3 and 1 -> 2 give
a partition of `w1` to a writer with a higher id (the overlap refused after the old one commits),
3 -> 1 takes every writer but `w1` away with its monikers pending."""
WAIT_S = 600.0
"""Longest wait for one step of the event; a step that times out is noted in the event's record,
and the run goes on (and fails at its end). A writer's Spark start takes a minute on a busy host,
and its batches of a few trickled records tens of seconds each at a load of 30 on 2 cores, where
240 s saw a writer publish 4 of the 5 monikers the backlog step waits for."""
TRICKLE_PER_S = 2.0
"""Records a second while the event waits for writers to publish: a few in each batch, so that a
writer publishes a moniker per batch, whatever the rate planned for the run."""
POINTER_WRITER = "w1"
"""On the Azure queue, the writer whose monikers all travel as pointers (in every layout)."""


@dataclass(frozen=True)
class WriterLayout:
    """Which writers share the topic: `count` writers (`writer.instance_count`), the one in slot s
    (`instance_index`) reading the partitions p with p % count == s, as `w<s+1>`."""

    generation: int
    count: int
    pointers: bool = False
    """Azure queue: `POINTER_WRITER` sends every moniker as a pointer to its journal copy."""

    @staticmethod
    def writer_id(slot: int) -> str:
        return f"w{slot + 1}"

    @property
    def writer_ids(self) -> list[str]:
        return [self.writer_id(slot) for slot in range(self.count)]

    def owner(self, partition: int) -> str:
        return self.writer_id(partition % self.count)

    def environ(self, slot: int) -> dict[str, str]:
        """Settings of the writer in `slot`, on top of the run's."""
        settings = {
            "ICEKEEPER__WRITER__INSTANCE_INDEX": str(slot),
            "ICEKEEPER__WRITER__INSTANCE_COUNT": str(self.count),
        }
        if self.pointers and self.writer_id(slot) == POINTER_WRITER:
            settings["ICEKEEPER__TRANSPORT__MAX_INLINE_BYTES"] = "0"
        return settings

    def describe(self, partitions: int) -> dict[str, Any]:
        return {
            "instance_count": self.count,
            "partitions": {
                writer: [p for p in range(partitions) if self.owner(p) == writer]
                for writer in self.writer_ids
            },
            "pointer_writer": POINTER_WRITER if self.pointers else None,
        }


def first_layout(pointers: bool) -> WriterLayout:
    """The layout a run starts with."""
    return WriterLayout(0, WRITER_COUNTS[0], pointers)


def next_layout(current: WriterLayout) -> WriterLayout:
    """The layout after `current` (`WRITER_COUNTS` in turn)."""
    generation = current.generation + 1
    count = WRITER_COUNTS[generation % len(WRITER_COUNTS)]
    return WriterLayout(generation, count, current.pointers)


def moved_partitions(old: WriterLayout, new: WriterLayout, partitions: int) -> dict[str, list[str]]:
    """The partitions that change writer: partition -> [writer before, writer after]."""
    return {
        str(p): [old.owner(p), new.owner(p)]
        for p in range(partitions)
        if old.owner(p) != new.owner(p)
    }


def writer_components(
    layout: WriterLayout, command: list[str], environ: dict[str, str], logs: Path
) -> dict[str, Component]:
    """The layout's writers as chaos components, `writer-1`, `writer-2`, ... by slot."""
    return {
        f"writer-{slot + 1}": Component(
            f"writer-{slot + 1}",
            [*command, "writer", "--writer-id", layout.writer_id(slot)],
            {**environ, **layout.environ(slot)},
            logs,
            log_name=f"writer-{slot + 1}.layout-{layout.generation}",
        )
        for slot in range(layout.count)
    }


def pending_files(pending: list[Moniker], writer_ids: list[str] | None = None) -> dict[str, int]:
    """Data files of the pending monikers (of `writer_ids`, or all), per table (what
    `bookkeeper.max_files_per_commit` counts)."""
    files: dict[str, int] = {}
    for moniker in pending:
        if writer_ids is None or moniker.writer_id in writer_ids:
            files[moniker.table] = files.get(moniker.table, 0) + len(moniker.files)
    return files


def pending_monikers(pending: list[Moniker], writer_id: str) -> dict[str, int]:
    """How many monikers of `writer_id` are pending, per table."""
    counts: dict[str, int] = {}
    for moniker in pending:
        if moniker.writer_id == writer_id:
            counts[moniker.table] = counts.get(moniker.table, 0) + 1
    return counts


def last_seqs(pending: list[Moniker]) -> dict[str, int]:
    """Each writer's highest pending seq."""
    seqs: dict[str, int] = {}
    for moniker in pending:
        seqs[moniker.writer_id] = max(seqs.get(moniker.writer_id, -1), moniker.seq)
    return seqs


def pending_ends(pending: list[Moniker]) -> dict[tuple[str, str, int], int]:
    """(writer, table, partition) -> the end of what the writer's pending monikers cover there."""
    ends: dict[tuple[str, str, int], int] = {}
    for moniker in pending:
        for offsets in moniker.offsets:
            key = (moniker.writer_id, moniker.table, offsets.partition)
            ends[key] = max(ends.get(key, 0), offsets.until_offset)
    return ends


def reaching_past(
    pending: list[Moniker],
    old_ends: dict[tuple[str, str, int], int],
    old: WriterLayout,
    new: WriterLayout,
    old_seqs: dict[str, int],
) -> list[str]:
    """The new layout's monikers that overlap what the partition's previous writer has pending and
    reach past it: committing both would add the overlap twice, refusing one must not lose the
    rest. Described in words."""
    found = []
    for moniker in pending:
        if moniker.seq <= old_seqs.get(moniker.writer_id, -1):
            continue  # published before the switch
        for offsets in moniker.offsets:
            previous = old.owner(offsets.partition)
            if previous == new.owner(offsets.partition):
                continue
            end = old_ends.get((previous, moniker.table, offsets.partition))
            if end is not None and offsets.from_offset < end < offsets.until_offset:
                found.append(
                    f"{moniker.table}[{offsets.partition}]: {moniker.writer_id} seq {moniker.seq} "
                    f"{offsets.from_offset}..{offsets.until_offset} over {previous}'s pending "
                    f"..{end}"
                )
    return found


@dataclass
class Reassignment:
    """What the event needs of the run; `run` performs one reassignment."""

    command: list[str]
    environ: dict[str, str]
    logs: Path
    transport: MonikerTransport
    tables: list[str]
    max_files_per_commit: int
    partitions: int
    progress: Progress
    records: RecordGate
    """The producer's gate: records flow while a step waits for writers to publish."""

    def run(
        self, components: dict[str, Component], layout: WriterLayout
    ) -> tuple[WriterLayout, dict[str, Any]]:
        """Steps 1-4 of the module docstring on the run's `components` (its writers are replaced
        by the new layout's); returns the new layout and the event's record for the report."""
        new = next_layout(layout)
        started = time.monotonic()
        old_ids = layout.writer_ids
        staying = [writer for writer in new.writer_ids if writer in old_ids]
        record: dict[str, Any] = {
            "from": layout.describe(self.partitions),
            "to": new.describe(self.partitions),
            "moved": moved_partitions(layout, new, self.partitions),
            "restarted_over_backlog": staying,
            "writer_kills": layout.count,
        }
        bookkeeper = components["bookkeeper"]
        bookkeeper.kill()
        # Records trickle in all along: writers publish a moniker per batch only while records
        # arrive, and what arrives once the old writers are gone lies past their pending monikers.
        with self.records.trickling(TRICKLE_PER_S):
            seqs, ends = self._switch(components, layout, new, record)
        pending = self.transport.pending()
        record["reaching_past_examples"] = reaching_past(pending, ends, layout, new, seqs)[:3]
        record["pending_at_return"] = {
            w: pending_monikers(pending, w) for w in sorted({m.writer_id for m in pending})
        }
        record["files_at_return"] = pending_files(pending)
        bookkeeper.start()
        record["bookkeeper_down_s"] = round(time.monotonic() - started, 1)
        self.progress(
            f"bookkeeper back after {record['bookkeeper_down_s']} s to "
            f"{sum(record['files_at_return'].values())} files pending"
        )
        return new, record

    def _switch(
        self,
        components: dict[str, Component],
        layout: WriterLayout,
        new: WriterLayout,
        record: dict[str, Any],
    ) -> tuple[dict[str, int], dict[tuple[str, str, int], int]]:
        """Steps 2 and 3 of the module docstring, while the bookkeeper is down; returns each old
        writer's last pending seq and the ends of what they had pending (`pending_ends`) at the
        switch."""
        old_ids = layout.writer_ids
        self.progress(
            f"reassignment {layout.count} -> {new.count} writers: bookkeeper down until "
            f"{POINTER_WRITER} has more than {self.max_files_per_commit} files pending per table"
        )
        record["backlog_reached"] = self._wait(
            lambda pending: (
                all(
                    pending_files(pending, [POINTER_WRITER]).get(table, 0)
                    > self.max_files_per_commit
                    for table in self.tables
                )
                and all(
                    pending_monikers(pending, writer).get(table)
                    for writer in old_ids
                    for table in self.tables
                )
            )
        )
        for name in [name for name in components if name.startswith("writer-")]:
            components.pop(name).kill()
        pending = self.transport.pending()
        before, ends = last_seqs(pending), pending_ends(pending)
        record["pending_at_switch"] = {w: pending_monikers(pending, w) for w in old_ids}
        record["files_at_switch"] = pending_files(pending)
        writers = writer_components(new, self.command, self.environ, self.logs)
        components.update(writers)
        for writer in writers.values():
            writer.start()
        self.progress(
            f"writers {', '.join(old_ids)} killed with "
            f"{sum(record['files_at_switch'].values())} files pending; "
            f"{', '.join(new.writer_ids)} started (moved: {record['moved']})"
        )
        record["new_writers_published"] = self._wait(
            lambda pending: all(
                last_seqs(pending).get(writer, -1) > before.get(writer, -1)
                for writer in new.writer_ids
            )
        )
        record["reaching_past"] = self._wait(
            lambda pending: bool(reaching_past(pending, ends, layout, new, before))
        )
        return before, ends

    def _wait(self, condition: Callable[[list[Moniker]], bool]) -> bool:
        """Until `condition` holds on the pending monikers (True) or `WAIT_S` passed (False)."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if condition(self.transport.pending()):
                return True
            time.sleep(1)
        return False

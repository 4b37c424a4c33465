"""The exactly-once rules over a table's committed state: pure functions, no I/O.

Which monikers are ready follows from the table's committed state (see `common/moniker.py`):
a writer's moniker is committed when its `prev_seq` is the writer's last committed seq; one
with a seq already committed is a duplicate; one whose offsets start below what the table
committed for a partition (a writer restarted under a new id, two writers given the same
partitions) is refused: committing it would add those records twice. `select_ready` decides
that for one attempt, on the state the commit path read (`commit_path.py`: again in every
attempt, on the refreshed table), and `advanced_state` is the state the commit then writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from icekeeper.common.committed_state import QUARANTINED_MONIKERS_KEPT, CommittedState, Refusal
from icekeeper.common.moniker import Moniker, OffsetRange
from icekeeper.common.transports.base import Delivery


@dataclass
class Selection:
    """One attempt's verdict on a table's deliveries (`select_ready`)."""

    ready: list[Delivery]
    duplicates: list[Delivery]
    """Deliveries of monikers the table has already settled (committed, quarantined or refused)."""
    waiting: list[Delivery]
    refused: list[tuple[Delivery, str]] = field(default_factory=list)
    copies: list[Delivery] = field(default_factory=list)
    """Second deliveries of a moniker delivered once more in the same receive (a writer re-sent
    its journal while the first message still waited): only the copy's delivery may go, the
    moniker itself is still pending through the first."""


def select_ready(
    deliveries: list[Delivery], state: CommittedState, max_files: int, max_bytes: int
) -> Selection:
    """Ready monikers in commit order, duplicates, copies, those waiting for a predecessor, and
    those refused.

    A moniker is refused when an offset range starts below what is committed (or what a moniker
    before it in this commit covers) for its partition: the records below are in the table
    already, and a moniker cannot be trimmed (its files hold the rows). A refusal does not move
    its writer's chain: it is recorded in the state (`Refusal`), and the writer's later monikers
    planned on top of the refused one (their `prev_seq` is a refused seq) are refused too, since
    they assume its ranges were committed. The writer reads the refusal back and re-plans from the
    committed offsets, chaining its next moniker on its last committed one (`writers/progress.py`):
    so records past the committed offset come again, from the writer that read them.

    A moniker the table quarantined (its id in `state.quarantined_monikers`) that comes again is a
    replay: ready whatever its writer's seq has become, once (the commit takes its id off the list).
    """
    by_writer: dict[str, list[Delivery]] = {}
    duplicates: list[Delivery] = []
    copies: list[Delivery] = []
    replays: list[Delivery] = []
    seen: set[tuple[str, int]] = set()
    for delivery in deliveries:
        moniker = delivery.moniker
        assert moniker is not None
        # By seq too: an id is made of the writer, table and offsets only, and a writer that
        # reads a range again after a refusal publishes it under a new seq.
        if (moniker.id, moniker.seq) in seen:
            copies.append(delivery)
            continue
        seen.add((moniker.id, moniker.seq))
        if moniker.id in state.quarantined_monikers:
            replays.append(delivery)
            continue
        committed_seq = state.writer_seqs.get(moniker.writer_id)
        refusal = state.refusals.get(moniker.writer_id)
        if (committed_seq is not None and moniker.seq <= committed_seq) or (
            refusal is not None and moniker.seq <= refusal.seq
        ):
            duplicates.append(delivery)
            continue
        by_writer.setdefault(moniker.writer_id, []).append(delivery)
    ready: list[Delivery] = []
    waiting: list[Delivery] = []
    refused: list[tuple[Delivery, str]] = []
    covered = dict(state.offsets)
    files = size = 0
    for writer_id, chain in sorted(by_writer.items()):
        chain.sort(key=lambda d: d.moniker.seq)
        expected = state.writer_seqs.get(writer_id)
        refusal = state.refusals.get(writer_id)
        refused_through = refusal.seq if refusal is not None else None
        for delivery in chain:
            moniker = delivery.moniker
            if (
                refused_through is not None
                and moniker.prev_seq is not None
                and (expected is None or moniker.prev_seq > expected)
                and moniker.prev_seq <= refused_through
            ):
                # Chained on a seq past the last committed one and not above the highest refused:
                # only a refused moniker has such a seq (the writer's re-planned monikers chain
                # on its last committed one, and their seqs are above every refused seq).
                refused.append(
                    (
                        delivery,
                        f"planned on writer {writer_id}'s refused seq {moniker.prev_seq}: "
                        "the writer reads its offsets again",
                    )
                )
                refused_through = moniker.seq
                continue
            over_budget = ready and (
                files + len(moniker.files) > max_files or size + moniker.bytes > max_bytes
            )
            if moniker.prev_seq != expected or over_budget:
                waiting.append(delivery)
                continue
            overlap = overlapping_offsets(moniker, covered)
            if overlap is not None:
                refused.append((delivery, overlap))
                if moniker.rereads_refused:
                    refused_through = max(refused_through or moniker.seq, moniker.seq)
                else:
                    # A writer of an earlier version never reads a refusal back: its chain moves
                    # on as before, or its later monikers would all be refused.
                    expected = moniker.seq
                continue
            expected = moniker.seq
            ready.append(delivery)
            files += len(moniker.files)
            size += moniker.bytes
            for offset_range in moniker.offsets:
                key = (offset_range.topic, offset_range.partition)
                covered[key] = next_committed_offset(covered, offset_range)
    for delivery in replays:
        moniker = delivery.moniker
        if ready and (files + len(moniker.files) > max_files or size + moniker.bytes > max_bytes):
            waiting.append(delivery)
            continue
        ready.append(delivery)
        files += len(moniker.files)
        size += moniker.bytes
    return Selection(ready, duplicates, waiting, refused, copies)


def overlapping_offsets(
    moniker: Moniker, committed_offsets: dict[tuple[str, int], int]
) -> str | None:
    """Why `moniker` would add records the table holds already, or None: a non-empty offset range
    that starts below the next offset committed for its topic-partition."""
    for offset_range in moniker.offsets:
        committed = committed_offsets.get((offset_range.topic, offset_range.partition))
        if (
            offset_range.count
            and committed is not None
            and offset_range.from_offset < committed
            and not offset_range.topic_reset  # a recreated topic starts below the old offsets
        ):
            return (
                f"offsets overlap the committed ones: writer {moniker.writer_id} seq {moniker.seq} "
                f"covers {offset_range.topic}[{offset_range.partition}] "
                f"{offset_range.from_offset}..{offset_range.until_offset}, the table has "
                f"everything below {committed} (records "
                f"{offset_range.from_offset}..{min(committed, offset_range.until_offset)} would be "
                "added twice)"
            )
    return None


def next_committed_offset(
    committed_offsets: dict[tuple[str, int], int], offset_range: OffsetRange
) -> int:
    """The partition's committed offset once `offset_range` is committed: the later of the two,
    or, for a range that starts a recreated topic (`OffsetRange.topic_reset`), its end: the old
    topic's offsets mean nothing for the new one."""
    key = (offset_range.topic, offset_range.partition)
    if offset_range.topic_reset:
        return offset_range.until_offset
    return max(committed_offsets.get(key, 0), offset_range.until_offset)


def advanced_state(
    state: CommittedState,
    committed: list[Moniker],
    quarantined: list[Moniker],
    refused: list[Moniker],
) -> CommittedState:
    """The state after a commit of `committed` monikers (in commit order), with `quarantined` and
    `refused` ones settled: seqs, offsets, event time, watermark. The commit id and epoch are the
    commit path's to set.

    Quarantined monikers advance their writer's seq and offsets too: their records are
    accounted for in the dead-letter place, and later monikers of the writer must not wait.
    Refused ones (offsets overlapping the committed ones, or planned on such a one) advance
    neither: they are recorded as the writer's `Refusal`, which its writer reads to re-plan, and
    which goes once a later moniker of the writer is committed (the writer chained past it).
    Quarantined ones join `quarantined_monikers`, and a replayed one leaves it (its records leave
    the count).
    """
    writer_seqs = dict(state.writer_seqs)
    offsets = dict(state.offsets)
    event_ms = dict(state.partition_event_ms)
    records = state.quarantined_records
    for moniker in sorted(committed + quarantined, key=lambda m: (m.writer_id, m.seq)):
        writer_seqs[moniker.writer_id] = max(
            writer_seqs.get(moniker.writer_id, moniker.seq), moniker.seq
        )
        for offset_range in moniker.offsets:
            key = (offset_range.topic, offset_range.partition)
            offsets[key] = next_committed_offset(offsets, offset_range)
            if moniker.max_event_time_ms is not None:
                event_ms[key] = max(event_ms.get(key, 0), moniker.max_event_time_ms)
    refusals = dict(state.refusals)
    for moniker in refused:
        if not moniker.rereads_refused:  # an earlier version's writer: its chain moves on
            writer_seqs[moniker.writer_id] = max(
                writer_seqs.get(moniker.writer_id, moniker.seq), moniker.seq
            )
            continue
        earlier = refusals.get(moniker.writer_id)
        from_offsets = dict(earlier.from_offsets) if earlier is not None else {}
        for offset_range in moniker.offsets:
            if offset_range.count:
                key = (offset_range.topic, offset_range.partition)
                from_offsets[key] = min(
                    from_offsets.get(key, offset_range.from_offset), offset_range.from_offset
                )
        refusals[moniker.writer_id] = Refusal(
            max(moniker.seq, earlier.seq if earlier is not None else moniker.seq), from_offsets
        )
    refusals = {
        writer: refusal
        for writer, refusal in refusals.items()
        if writer_seqs.get(writer, -1) < refusal.seq
    }
    listed = list(state.quarantined_monikers)
    for moniker in committed:
        if moniker.id in listed:  # a replay
            listed.remove(moniker.id)
            records -= moniker.records
    for moniker in quarantined:
        if moniker.id not in listed:
            listed.append(moniker.id)
            records += moniker.records
    watermark = min(event_ms.values()) if event_ms else state.watermark_ms
    return CommittedState(
        writer_seqs,
        offsets,
        event_ms,
        watermark,
        state.epoch,
        state.commit_id,
        max(0, records),
        state.event_files,
        tuple(listed[-QUARANTINED_MONIKERS_KEPT:]),
        refusals,
    )

"""Every record a batch read is accounted for once, before anything of the batch is published.

A record read ends in one of three places: a dead letter, a skipped tombstone
(`sources[].tombstones: skip`), or it is *accepted*: decoded and routed without error. An
accepted record's route feeds one or more tables (fan-out: `Routes.fed_by`), and each of them
takes it in, unless it lies before that table's own start (`BatchPlan.table_starts`: the table
has it already). So for every table T, whose route is r:

    records read = taken by T + before T's start + accepted for routes other than r
                   + dead letters + skipped tombstones

which holds for every table exactly when three equalities hold, the ones `discrepancies` checks:

1. records read = accepted (all routes) + failed: each record classified once, by the pass that
   wrote the files;
2. failed = dead letters + skipped tombstones, per reason where the writing pass counted reasons
   (the arrow engine's tasks do; `spark-sql` counts the total): the dead-letter pass, which
   classifies the records again (with `spark-sql`, whichever engine wrote), finds what the
   writing pass failed;
3. for every route r with accepted records and each table T it feeds:
   taken(T) + before_start(T) = accepted(r), and a table takes nothing of a route without
   accepted records.

"Taken" counts records, not rows: an upsert table keeps one row per key of what it took in.
Records routed to no table are not accepted: they fail as `unroutable`. The counts are plain
values, so the rule is tested without services (`tests/writers/test_reconciliation.py`); a batch
that does not reconcile is not published (`writers/source_batch.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

TOMBSTONE = "tombstone"


@dataclass(frozen=True)
class TableIntake:
    """What one table's write took in from a batch."""

    route: str
    """The route whose records the table gets (`Routes.route_of`)."""
    taken: int
    """Records the write took in (an upsert table's before it kept each key's last change)."""
    before_start: int = 0
    """Accepted records of the route before the table's own start: the table has them already."""


@dataclass(frozen=True)
class BatchIntake:
    """What the pass that wrote a batch's files counted, for `discrepancies`."""

    records: int
    """Records read (fewer than the offsets span on a source with `offset_gaps`)."""
    failed: int
    """Records that cannot become rows, skipped tombstones included."""
    tombstones: int
    """Tombstones among `failed`."""
    accepted: Mapping[str, int] = field(default_factory=dict)
    """Route -> records decoded and routed without error. `spark-sql` counts the routes it
    wrote tables for; records of any other route are then missing from the sum (check 1)."""
    tables: Mapping[str, TableIntake] = field(default_factory=dict)
    """Table identifier -> what its write took in."""
    fed_by: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Route -> the tables that get its records (`Routes.fed_by`), for each accepted route."""
    failed_by_reason: Mapping[str, int] | None = None
    """`failed` by reason, where the writing pass counts reasons (None: only the total)."""


def skipped_tombstones(intake: BatchIntake, skip_tombstones: bool) -> int:
    return intake.tombstones if skip_tombstones else 0


def discrepancies(
    intake: BatchIntake, dead_letters: Mapping[str, int], skip_tombstones: bool
) -> list[str]:
    """Why the batch does not reconcile, one sentence per broken equality; empty when it does.

    Args:
        intake: what the writing pass counted.
        dead_letters: reason -> records the dead-letter pass is about to send.
        skip_tombstones: tombstones are skipped (counted, not dead-lettered).
    """
    problems = []
    accepted = sum(intake.accepted.values())
    unaccounted = intake.records - accepted - intake.failed
    if unaccounted:
        problems.append(
            f"{intake.records} records read, but {accepted} accepted by a route a table was "
            f"written for and {intake.failed} failed: "
            + (
                f"{unaccounted} records in neither"
                if unaccounted > 0
                else f"{-unaccounted} counted twice"
            )
        )
    skipped = skipped_tombstones(intake, skip_tombstones)
    letters = sum(dead_letters.values())
    if intake.failed_by_reason is not None:
        expected = {
            reason: count - (skipped if reason == TOMBSTONE else 0)
            for reason, count in intake.failed_by_reason.items()
        }
        for reason in sorted(set(expected) | set(dead_letters)):
            counted, found = expected.get(reason, 0), dead_letters.get(reason, 0)
            if counted != found:
                problems.append(
                    f"{counted} records failed as {reason} while writing, but the dead-letter "
                    f"pass found {found}"
                )
    elif intake.failed - skipped != letters:
        problems.append(
            f"{intake.failed - skipped} records failed while writing, but the dead-letter pass "
            f"found {letters} (skipped tombstones aside: {skipped})"
        )
    for route, count in sorted(intake.accepted.items()):
        for identifier in intake.fed_by.get(route, (route,)):
            table = intake.tables.get(identifier)
            if table is None:
                if count:
                    problems.append(
                        f"{count} records accepted for route {route}, but table {identifier} "
                        "was not written"
                    )
                continue
            if table.taken + table.before_start != count:
                problems.append(
                    f"table {identifier} took {table.taken} records and has {table.before_start} "
                    f"before its start, but route {route} accepted {count}"
                )
    for identifier, table in sorted(intake.tables.items()):
        if table.route not in intake.accepted and table.taken + table.before_start:
            problems.append(
                f"table {identifier} took {table.taken} records of route {table.route}, which "
                "accepted none"
            )
    return problems


def ledger(
    intake: BatchIntake, dead_letters: Mapping[str, int], skip_tombstones: bool
) -> dict[str, object]:
    """The counts behind `discrepancies`, for the log line of a batch that does not reconcile."""
    return {
        "records_read": intake.records,
        "accepted": dict(intake.accepted),
        "failed": intake.failed,
        "failed_by_reason": None
        if intake.failed_by_reason is None
        else dict(intake.failed_by_reason),
        "dead_letters": dict(dead_letters),
        "skipped_tombstones": skipped_tombstones(intake, skip_tombstones),
        "tables": {
            identifier: {
                "route": table.route,
                "taken": table.taken,
                "before_start": table.before_start,
                "route_accepted": intake.accepted.get(table.route, 0),
            }
            for identifier, table in sorted(intake.tables.items())
        },
    }


class BatchUnreconciled(RuntimeError):
    """A batch's counts do not add up (`discrepancies`): it was not published, and its files
    are discarded, rather than lose or repeat records."""

    def __init__(self, problems: list[str], counts: dict[str, object]) -> None:
        super().__init__("batch does not reconcile: " + "; ".join(problems))
        self.problems = problems
        self.counts = counts

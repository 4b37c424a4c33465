"""The exit codes of every icekeeper command, one table for all of them.

A supervisor, a cron job or a script decides from the code alone whether to retry, alert or
give up, so a code means the same whatever the command: `docs/operations.md` ("Exit codes")
lists these, and tests/icekeeper/test_cli.py checks that the two agree.
"""

from __future__ import annotations

OK = 0
"""Done: what was asked for happened (a service stopped by SIGTERM also ends with 0)."""

FAILED = 1
"""The work failed and says what failed: a check or a verification (`chaos`, `config check
--connect` finding a table it cannot load), a one-off reaper pass with a failed step, an
unexpected error (with its traceback)."""

USAGE = 2
"""Nothing was done: a bad argument (a duration such as `10x`), a config error (every one is
listed), an unknown name (`dead-letters replay --name`, `stack --only`), an extra that is not
installed (`pip install 'icekeeper[spark]'`), or a writer facing a recreated topic that the
config does not say what to do about (`sources[].on_topic_reset`)."""

FENCED = 3
"""The bookkeeper stopped because a newer one took the group's lease: expected during a
hand-over, not to be restarted blindly."""

UNAVAILABLE = 4
"""A service the command needs did not answer: a Kafka broker (`status`), the catalog or the
storage (`config check --connect`). Retry once it is back."""

INTERRUPTED = 130
"""Interrupted by Ctrl-C (SIGINT), as shells report it."""

EXIT_CODES: dict[int, str] = {
    OK: "ok",
    FAILED: "failed",
    USAGE: "usage or config error",
    FENCED: "fenced",
    UNAVAILABLE: "a service is unavailable",
    INTERRUPTED: "interrupted",
}
"""Each code and its short name, in the order of the documentation's table."""


class UsageError(Exception):
    """What a command was asked for cannot be done as asked (an unknown name): its message is the
    whole story, printed on one line, and the command exits with `USAGE` having changed nothing."""

"""The one retry loop: an action called again after an error or a result that a later attempt may
change, with a wait between attempts, a log line per retry and a limit.

Its users: the committer's commit attempts (a lost compare-and-swap is planned again on the
refreshed table), its read-back of a table after a commit of unknown outcome and its re-reads of
files storage could not serve; the reaper's maintenance commits; npm installs. tenacity
(installed with pyiceberg) has the same loop, but each of these needs the attempt number inside
the action and a log line with our fields, so it would be wrapped like this anyway.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

log = logging.getLogger(__name__)

Outcome = TypeVar("Outcome")


def retry(
    action: Callable[[int], Outcome],
    *,
    attempts: int,
    what: str,
    retry_on: Callable[[Exception], bool] = lambda error: False,
    retry_while: Callable[[Outcome], bool] = lambda outcome: False,
    wait_s: Sequence[float] | Callable[[int], float] = (),
    log_extra: Mapping[str, object] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """Call `action(attempt)`, attempt 1, 2, ... at most `attempts` times, while it raises an
    error `retry_on` accepts or returns an outcome `retry_while` accepts; the last attempt's
    outcome stands (its error raised, its result returned), as does any other error at once.

    Before each retry: a log line at INFO (`what`, the attempt that failed, the wait and the
    error, plus `log_extra`), then a wait of `wait_s(attempt)` seconds, or `wait_s[attempt - 1]`
    (its last value once past its end; none given: no wait).
    """
    for attempt in range(1, attempts + 1):
        error: Exception | None = None
        try:
            outcome = action(attempt)
        except Exception as failure:
            if attempt == attempts or not retry_on(failure):
                raise
            error = failure
        else:
            if attempt == attempts or not retry_while(outcome):
                return outcome
        delay = _delay(wait_s, attempt)
        extra: dict[str, object] = {**(log_extra or {}), "attempt": attempt, "retry_in_s": delay}
        if error is not None:
            extra["error"] = str(error) or repr(error)
        log.info(what, extra=extra)
        if delay > 0:
            sleep(delay)
    raise ValueError(f"retry needs at least one attempt, not {attempts}")


def _delay(wait_s: Sequence[float] | Callable[[int], float], attempt: int) -> float:
    if callable(wait_s):
        return wait_s(attempt)
    if not wait_s:
        return 0.0
    return wait_s[min(attempt, len(wait_s)) - 1]

"""Waiting in tests for something to happen, instead of sleeping a fixed time and hoping it has.

A fixed sleep is either too short on a loaded machine (a flaky test) or longer than needed on
every other run (a slow one); a wait on the condition is neither, and says what never happened.
Sleeps that are the point of a test (time passing a timeout, pacing, checking that nothing
happens for a while) stay sleeps, with a comment saying so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.1
) -> T:
    """Call `condition` until it returns something true, and return that.

    Args:
        condition: checked at once, then every `interval_s` seconds.
        timeout_s: how long to keep trying before failing.
        what: what is waited for, for the failure message ("the stream's first batch").

    Raises:
        AssertionError: `condition` was still false after `timeout_s` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        outcome = condition()
        if outcome:
            return outcome
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout_s:g} s for {what}, in vain")
        time.sleep(interval_s)


def returns_within(call: Callable[[], T], timeout_s: float, what: str) -> T:
    """`call()`'s result (or what it raises), which must come within `timeout_s` seconds.

    The call runs in a daemon thread, so that one that never returns (a client waiting for an
    answer that never comes) fails the test instead of hanging the session.

    Raises:
        AssertionError: `call` was still running after `timeout_s` seconds.
    """
    import threading

    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True, name=f"returns-within: {what}")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise AssertionError(f"{what} still running after {timeout_s:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]

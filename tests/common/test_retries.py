"""The one retry loop (common/retries.py): what is retried, how long it waits, what it logs, and
that the last attempt's outcome stands."""

from __future__ import annotations

import logging

import pytest

from icekeeper.common.retries import retry


class Flaky(Exception):
    pass


def failing(times: int, calls: list[int]):
    def action(attempt: int) -> str:
        calls.append(attempt)
        if attempt <= times:
            raise Flaky(f"attempt {attempt}")
        return f"done at {attempt}"

    return action


def test_errors_it_accepts_are_retried_with_waits_and_a_log_line_each(caplog) -> None:
    calls, slept = [], []
    caplog.set_level(logging.INFO, logger="icekeeper.common.retries")
    outcome = retry(
        failing(2, calls),
        attempts=5,
        what="flaky, again",
        retry_on=lambda error: isinstance(error, Flaky),
        wait_s=(0.2, 0.5),
        log_extra={"table": "t"},
        sleep=slept.append,
    )
    assert outcome == "done at 3" and calls == [1, 2, 3] and slept == [0.2, 0.5]
    lines = [r for r in caplog.records if r.getMessage() == "flaky, again"]
    assert [(r.attempt, r.retry_in_s, r.error, r.table) for r in lines] == [
        (1, 0.2, "attempt 1", "t"),
        (2, 0.5, "attempt 2", "t"),
    ]


def test_the_last_wait_repeats_and_a_function_gets_the_attempt() -> None:
    slept = []
    retry(failing(3, []), attempts=4, what="w", retry_on=bool, wait_s=(1.0,), sleep=slept.append)
    assert slept == [1.0, 1.0, 1.0]
    slept.clear()
    retry(
        failing(2, []),
        attempts=3,
        what="w",
        retry_on=bool,
        wait_s=lambda n: n / 10,
        sleep=slept.append,
    )
    assert slept == [0.1, 0.2]


def test_the_last_attempt_s_error_is_raised_and_others_at_once() -> None:
    calls = []
    with pytest.raises(Flaky, match="attempt 3"):
        retry(failing(9, calls), attempts=3, what="w", retry_on=bool, sleep=lambda _: None)
    assert calls == [1, 2, 3]
    calls.clear()
    with pytest.raises(Flaky, match="attempt 1"):
        retry(failing(9, calls), attempts=3, what="w", retry_on=lambda e: False)
    assert calls == [1]


def test_results_it_rejects_are_retried_and_the_last_one_returned() -> None:
    calls, slept = [], []

    def remaining(attempt: int) -> list[str]:
        calls.append(attempt)
        return ["file"] * (3 - attempt)

    assert retry(remaining, attempts=5, what="w", retry_while=bool, sleep=slept.append) == []
    assert calls == [1, 2, 3] and slept == []  # no waits given: none
    calls.clear()
    assert retry(remaining, attempts=2, what="w", retry_while=bool) == ["file"]
    assert calls == [1, 2]

"""A writer says once per source and kind of reason that a batch runs on `spark-sql` instead of
the configured engine (issue 27, F7).

The refusal's text names counts, columns and ids: keyed by it, the upsert fallback (`upsert keys
in two Kafka partitions of a batch: {table: count}`) was logged for nearly every batch, and the
set of what was logged was shared by every writer in the process, so a second writer of a test
or a benchmark logged nothing. The metric counts every batch; the log says it once.
"""

from __future__ import annotations

import logging

import pytest

from icekeeper.common.config.model import KafkaSource
from icekeeper.writers.source_batch import FallbackLog

MESSAGE = "writer.engine arrow does not take this batch; it runs on spark-sql"
TWO_PARTITIONS = "upsert-key-in-two-partitions"
UNSUPPORTED = "unsupported-source"


def _reason(keys: int) -> str:
    """The arrow engine's refusal of an upsert batch (`arrow_batch.py`), for `keys` keys."""
    return f"upsert keys in two Kafka partitions of a batch: {{'shop.orders': {keys}}}"


def _two_partitions(log: FallbackLog, source: KafkaSource, keys: int) -> None:
    log.fell_back(source, TWO_PARTITIONS, MESSAGE, reason=_reason(keys))


def test_a_fallback_is_logged_once_per_writer_source_and_kind_whatever_its_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    orders, customers = KafkaSource(name="orders"), KafkaSource(name="customers")
    writer, other_writer = FallbackLog(), FallbackLog()  # two writers in one process
    with caplog.at_level(logging.WARNING, logger="icekeeper.writers.source_batch"):
        for keys in (2, 3, 7):  # batch after batch, other counts
            _two_partitions(writer, orders, keys)
        writer.fell_back(orders, UNSUPPORTED, MESSAGE, reason="column tags: map<string,int>")
        _two_partitions(writer, customers, 4)
        _two_partitions(other_writer, orders, 5)
        writer.fell_back(orders, UNSUPPORTED, MESSAGE, reason="column ids: array<long>")

    assert [(r.source, r.kind, r.reason) for r in caplog.records] == [
        ("orders", TWO_PARTITIONS, _reason(2)),
        ("orders", UNSUPPORTED, "column tags: map<string,int>"),
        ("customers", TWO_PARTITIONS, _reason(4)),
        ("orders", TWO_PARTITIONS, _reason(5)),  # the other writer's first
    ]
    assert {r.levelname for r in caplog.records} == {"WARNING"}


def test_every_unreconciled_batch_is_logged_with_its_own_offsets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An engine whose counts do not reconcile lost or miscounted records: each batch is a case
    for the bug report (another batch may show another problem), so none is left out."""
    from icekeeper.writers.source_batch import UNRECONCILED

    orders, log = KafkaSource(name="orders"), FallbackLog()
    with caplog.at_level(logging.WARNING, logger="icekeeper.writers.source_batch"):
        log.fell_back(orders, UNRECONCILED, MESSAGE, offsets="0:0-100", problems=["took 99"])
        log.fell_back(orders, UNRECONCILED, MESSAGE, offsets="0:100-200", problems=["took 101"])
    assert [(r.kind, r.offsets) for r in caplog.records] == [
        (UNRECONCILED, "0:0-100"),
        (UNRECONCILED, "0:100-200"),
    ]

"""The consumer group's offsets after a batch: `sources[].commit_timeout` bounds the wait."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from icekeeper.common.config.model import KafkaSource
from icekeeper.writers.kafka_admin import SourceAdmin
from icekeeper.writers.offsets import BatchPlan


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """A port that accepts connections and never answers: a broker stuck under load."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.parametrize("commit_timeout", [1.0, 3.0])
def test_a_group_offset_commit_waits_commit_timeout_then_the_writer_goes_on(
    silent_broker: str, commit_timeout: float, caplog: pytest.LogCaptureFixture
) -> None:
    source = KafkaSource(
        bootstrap_servers=silent_broker, topics=["orders"], commit_timeout=commit_timeout
    )
    plan = BatchPlan(read_ranges={("orders", 0): (0, 10)}, table_starts={})
    admin = SourceAdmin(source)
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="icekeeper.writers.kafka_admin"):
        admin.commit_group_offsets(plan)
    waited = time.monotonic() - started
    assert commit_timeout - 0.2 <= waited < commit_timeout + 2.0
    assert "could not commit consumer group offsets" in caplog.text

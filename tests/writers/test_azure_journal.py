"""A writer killed between the Azure queue's two publishing steps (journal
copy written, message not sent) stalls nothing: a restarted writer sends its
journal copies again and the bookkeeper commits every record once. Against
Azurite's real queue, as the writer and the bookkeeper run in production."""

from __future__ import annotations

import collections
import uuid
from pathlib import Path

import pytest

from common.config.model import AzureQueueTransport
from common.transports.azure_queue import AzureQueueMonikerTransport
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from tests.support.moniker_values import big_moniker
from tests.support.pipeline import commit_all, pipeline_config
from tests.support.waiting import wait_until
from writers.job import WriterJob

pytestmark = [pytest.mark.integration]


class Died(Exception):
    """Stands in for SIGKILL after the journal write,
    before the queue send (the only injected failure)."""


@pytest.mark.spark
def test_a_writer_killed_before_the_queue_send_resends_its_journal_copy(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    queue = f"monikers-{uuid.uuid4().hex[:8]}"
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
            "ICEKEEPER__TRANSPORT__KIND": "azure-queue",
            "ICEKEEPER__TRANSPORT__QUEUE_NAME": queue,
            "ICEKEEPER__TRANSPORT__CONNECTION_STRING": local_stack.service(
                "azurite-queue"
            ).connection_string(),
            "ICEKEEPER__SOURCES__0__MAX_OFFSETS_PER_TRIGGER": "1000",
        },
    )
    produce_synthetic(
        config,
        SyntheticSpec(seed=61, keys=100, events=2500, schema_changes=0),
        topic=unique_topic,
        progress=lambda m: None,
    )

    doomed = WriterJob(config, spark=spark)
    doomed.transport.send = lambda *args, **kwargs: (_ for _ in ()).throw(Died())
    with pytest.raises(Died):
        doomed.run_batch()
    assert len(doomed.transport.pending()) == 1  # the journal copy
    assert (
        doomed.transport.queue.get_queue_properties().approximate_message_count == 0
    )  # and no message

    WriterJob(config, spark=spark).run(until_idle=True)
    bookkeeper = commit_all(config)
    rows = bookkeeper.catalog.load_table("shop.orders").scan().to_arrow()
    positions = collections.Counter(
        zip(rows.column("_kfk_partition").to_pylist(), rows.column("_kfk_offset").to_pylist())
    )
    assert len(positions) == rows.num_rows == 2500
    assert bookkeeper.transport.pending() == []
    assert bookkeeper.transport.queue.get_queue_properties().approximate_message_count == 0


def test_a_second_message_of_a_large_moniker_already_committed_is_ignored(
    azure_settings: AzureQueueTransport,
) -> None:
    """A moniker too large for a message travels as a pointer to its journal copy, which goes once
    the moniker is acknowledged: the copy sent again at writer start then points nowhere, and is a
    duplicate to drop, not an unreadable moniker to dead-letter."""
    transport = AzureQueueMonikerTransport(azure_settings, visibility_timeout_s=1)
    moniker = big_moniker(files=400)
    transport.publish(moniker)
    assert transport.resend_journal(moniker.writer_id) == 1
    both = transport.receive()
    assert [d.moniker for d in both] == [moniker, moniker]
    transport.acknowledge(both[0])  # committed: its journal copy goes
    [again] = wait_until(transport.receive, 30, "the other message visible again")
    assert again.ignorable and again.error is None

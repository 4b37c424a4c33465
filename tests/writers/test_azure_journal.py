"""A writer killed between the Azure queue's two publishing steps (journal
copy written, message not sent) stalls nothing: a restarted writer sends its
journal copies again and the bookkeeper commits every record once. Against
Azurite's real queue, as the writer and the bookkeeper run in production."""

from __future__ import annotations

import collections
import uuid
from pathlib import Path

import pytest

from icekeeper.common.config.model import AzureQueueTransport
from icekeeper.common.transports.azure_queue import AzureQueueMonikerTransport
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from icekeeper.writers.job import WriterJob
from tests.support.moniker_values import big_moniker
from tests.support.pipeline import commit_all, pipeline_config
from tests.support.waiting import wait_until

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


def test_a_resent_copy_of_a_waiting_moniker_leaves_its_journal_copy(
    local_stack, tmp_path: Path
) -> None:
    """Issue 26, item 1. A restarted writer sends its journal copies again while their first
    messages still wait: one receive gets both messages of M2, which cannot commit yet (a backlog
    over `max_files_per_commit`). Dropping the second message must not delete the journal copy
    both share: M2 travels as a pointer to it, and must still commit."""
    from icekeeper.bookkeeper.service import Bookkeeper
    from tests.support.shop_items import azure_queue_settings, bookkeeper_config, make_moniker

    config = bookkeeper_config(
        tmp_path, **azure_queue_settings(local_stack), bookkeeper__max_files_per_commit="1"
    )
    transport = AzureQueueMonikerTransport(config.transport, visibility_timeout_s=1)
    first = make_moniker(config, 1, None, (0, 10))
    large = make_moniker(config, 2, 1, (10, 410), files=400)  # over 48 KiB: sent as a pointer
    transport.publish(first)
    transport.publish(large)
    assert transport.resend_journal("w1") == 2  # a writer restarting: every copy again

    bookkeeper = Bookkeeper(config)
    bookkeeper.transport = AzureQueueMonikerTransport(config.transport, visibility_timeout_s=1)
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 1 and report.pending == 1  # the large one waits
    assert [m.seq for m in transport.pending()] == [2]  # and still has its journal copy

    def committed() -> bool:
        bookkeeper.run_cycle()
        return not transport.pending()

    wait_until(committed, 30, "the large moniker committed")
    rows = bookkeeper.catalog.load_table("shop.items").scan().to_arrow()
    assert sorted(rows.column("_kfk_offset").to_pylist()) == list(range(410))
    assert bookkeeper.transport.dead_letter_count() == 0


def test_a_backlog_over_the_commit_budget_commits_a_budget_every_cycle(
    local_stack, tmp_path: Path
) -> None:
    """Monikers left waiting for the budget (`max_files_per_commit`) are made visible again at
    once: with the queue's default visibility timeout (60 s) each would otherwise come back a
    minute later, one budget a minute, and a steady stream over the budget never catches up."""
    from icekeeper.bookkeeper.service import Bookkeeper
    from tests.support.shop_items import azure_queue_settings, bookkeeper_config, make_moniker

    config = bookkeeper_config(
        tmp_path, **azure_queue_settings(local_stack), bookkeeper__max_files_per_commit="1"
    )
    assert config.transport.visibility_timeout == 60
    transport = AzureQueueMonikerTransport(config.transport)
    for seq in range(1, 5):
        transport.publish(make_moniker(config, seq, seq - 1 or None, (seq * 10, seq * 10 + 10)))
    bookkeeper = Bookkeeper(config)
    committed = [bookkeeper.run_cycle().committed_monikers for _ in range(4)]
    assert committed == [1, 1, 1, 1]
    assert transport.pending() == []


def test_a_message_whose_delete_fails_after_its_journal_copy_went_is_settled_next_cycle(
    local_stack, tmp_path: Path
) -> None:
    """The journal copy goes before the message: a queue that fails the message's delete leaves
    the message, which the bookkeeper's next cycle receives, finds committed and acknowledges
    (the other way round the copy stayed, pending for the writers until one restarted)."""
    from icekeeper.bookkeeper.service import Bookkeeper
    from tests.support.shop_items import azure_queue_settings, bookkeeper_config, make_moniker

    config = bookkeeper_config(tmp_path, **azure_queue_settings(local_stack))
    writer_side = AzureQueueMonikerTransport(config.transport, visibility_timeout_s=1)
    writer_side.publish(make_moniker(config, 1, None, (0, 400), files=400))  # a pointer message
    bookkeeper = Bookkeeper(config)
    bookkeeper.transport = AzureQueueMonikerTransport(config.transport, visibility_timeout_s=1)
    delete_message = bookkeeper.transport.queue.delete_message

    def refused(*args, **kwargs):
        from azure.core.exceptions import ServiceRequestError

        raise ServiceRequestError("the queue does not answer")

    bookkeeper.transport.queue.delete_message = refused
    with pytest.raises(Exception, match="does not answer"):
        bookkeeper.run_cycle()
    assert writer_side.pending() == []  # no journal copy left for the writers
    bookkeeper.transport.queue.delete_message = delete_message

    def settled() -> bool:
        bookkeeper.run_cycle()
        return writer_side.queue.get_queue_properties().approximate_message_count == 0

    wait_until(settled, 30, "both messages acknowledged")
    rows = bookkeeper.catalog.load_table("shop.items").scan().to_arrow()
    assert sorted(rows.column("_kfk_offset").to_pylist()) == list(range(400))
    assert bookkeeper.transport.dead_letter_count() == 0

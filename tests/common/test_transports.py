"""Moniker transports: the transaction-log folder (local disk) and the Azure queue (Azurite)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from icekeeper.common.config.model import AzureQueueTransport, TxLogTransport
from icekeeper.common.moniker import Moniker
from icekeeper.common.transports.azure_queue import MAX_INLINE_BYTES, AzureQueueMonikerTransport
from icekeeper.common.transports.base import MonikerTransport
from icekeeper.common.transports.txlog import TxLogMonikerTransport
from tests.support.fsyncs import record_fsyncs
from tests.support.moniker_values import big_moniker, sample_moniker


def exercise_transport(transport: MonikerTransport) -> None:
    """What every transport must do, as the writer and the bookkeeper use it."""
    first, second, other = (
        sample_moniker(seq=1, prev_seq=None),
        sample_moniker(seq=2, prev_seq=1, until=160),
        sample_moniker(seq=1, prev_seq=None, writer="w2"),
    )
    for moniker in (second, first, other):
        transport.publish(moniker)
    assert {m.id for m in transport.pending()} == {first.id, second.id, other.id}
    assert [m.seq for m in transport.pending(table="db.t", writer_id="w1")] == [1, 2]

    deliveries = transport.receive()
    assert {d.moniker.id for d in deliveries} == {first.id, second.id, other.id}
    assert all(d.error is None for d in deliveries)
    # Acknowledged monikers are gone for good; the others stay pending.
    for delivery in deliveries:
        if delivery.moniker.writer_id == "w1":
            transport.acknowledge(delivery)
    assert [m.id for m in transport.pending()] == [other.id]


def test_txlog_folder_transport(tmp_path: Path) -> None:
    transport = TxLogMonikerTransport(
        TxLogTransport(uri=str(tmp_path / "txlog"), dead_letter_uri=str(tmp_path / "dlq"))
    )
    exercise_transport(transport)
    # No temporary files are left behind, and a file's name orders a writer's monikers.
    names = [p.name for p in (tmp_path / "txlog").rglob("*") if p.is_file()]
    assert names and all(not name.startswith(".") and name.endswith(".json") for name in names)


def test_txlog_corrupt_moniker_is_delivered_with_its_reason_and_can_be_dead_lettered(
    tmp_path: Path,
) -> None:
    transport = TxLogMonikerTransport(
        TxLogTransport(uri=str(tmp_path / "txlog"), dead_letter_uri=str(tmp_path / "dlq"))
    )
    transport.publish(sample_moniker(seq=1, prev_seq=None))
    corrupt = tmp_path / "txlog" / "db.t" / "w1" / "000000000002-broken.json"
    corrupt.write_bytes(b'{"format_version": 1, "id": ')
    deliveries = {d.source: d for d in transport.receive()}
    bad = deliveries[str(corrupt)]
    assert bad.moniker is None and "not JSON" in bad.error
    transport.dead_letter(bad, bad.error)
    assert not corrupt.exists()
    reasons = list((tmp_path / "dlq").glob("*.reason"))
    assert len(reasons) == 1 and "not JSON" in json.loads(reasons[0].read_text())["reason"]
    assert (
        tmp_path / "dlq" / reasons[0].name.removesuffix(".reason")
    ).read_bytes() == b'{"format_version": 1, "id": '
    assert len(transport.pending()) == 1


@pytest.mark.integration
def test_azure_queue_transport(azure_settings: AzureQueueTransport) -> None:
    exercise_transport(AzureQueueMonikerTransport(azure_settings, visibility_timeout_s=30))


@pytest.mark.integration
def test_azure_queue_sends_a_pointer_for_a_moniker_too_large_for_a_message(
    azure_settings: AzureQueueTransport,
) -> None:
    transport = AzureQueueMonikerTransport(azure_settings)
    moniker = big_moniker(files=2000)
    transport.publish(moniker)
    message = transport.queue.peek_messages(max_messages=1)[0]
    assert (
        len(message.content) < MAX_INLINE_BYTES and "icekeeper_moniker_pointer" in message.content
    )
    [delivery] = transport.receive()
    assert delivery.moniker == moniker
    transport.acknowledge(delivery)
    assert (
        transport.pending() == []
        and transport.queue.get_queue_properties().approximate_message_count == 0
    )


@pytest.mark.integration
def test_azure_queue_settings_send_small_monikers_as_pointers_and_bring_waiting_ones_back(
    azure_settings: AzureQueueTransport,
) -> None:
    """`transport.max_inline_bytes: 0` sends even a small moniker as a pointer to its journal copy
    (`icekeeper chaos` runs one writer so); `transport.visibility_timeout` is how soon a received
    moniker that was not acknowledged (it waits) is received again."""
    settings = azure_settings.model_copy(update={"max_inline_bytes": 0, "visibility_timeout": 2})
    transport = AzureQueueMonikerTransport(settings)
    moniker = sample_moniker(seq=1, prev_seq=None)
    transport.publish(moniker)
    message = transport.queue.peek_messages(max_messages=1)[0]
    assert "icekeeper_moniker_pointer" in message.content
    [delivery] = transport.receive()
    assert delivery.moniker == moniker and transport.receive() == []
    time.sleep(2.5)
    [again] = transport.receive()
    assert again.moniker == moniker
    transport.acknowledge(again)
    assert transport.pending() == []
    # The default keeps it inline.
    inline = AzureQueueMonikerTransport(azure_settings)
    inline.publish(moniker)
    assert "icekeeper_moniker_pointer" not in inline.queue.peek_messages(max_messages=1)[0].content


@pytest.mark.integration
def test_azure_queue_unreadable_message_goes_to_the_dead_letter_queue(
    azure_settings: AzureQueueTransport,
) -> None:
    transport = AzureQueueMonikerTransport(azure_settings)
    transport.queue.send_message("this is not a moniker")
    [delivery] = transport.receive()
    assert delivery.moniker is None and "not JSON" in delivery.error
    transport.dead_letter(delivery, delivery.error)
    [dead] = transport.dead_letter_queue.receive_messages()
    assert json.loads(dead.content)["content"] == "this is not a moniker"
    assert transport.queue.get_queue_properties().approximate_message_count == 0


def exercise_dead_letters(transport: MonikerTransport, moniker: Moniker) -> None:
    """A dead-lettered moniker is kept whole with its reason, leaves `pending`, and a replay
    publishes it again and takes it out of the dead-letter place."""
    transport.publish(moniker)
    [delivery] = transport.receive()
    transport.dead_letter(delivery, "a file is not Parquet")
    assert transport.pending() == [] and transport.dead_letter_count() == 1
    [item] = transport.quarantined()
    assert (
        item.moniker == moniker
        and item.reason == "a file is not Parquet"
        and item.quarantined_ms is not None
    )
    transport.replay(item)
    assert transport.quarantined() == [] and transport.dead_letter_count() == 0
    assert [m.id for m in transport.pending()] == [moniker.id]
    [again] = transport.receive()
    assert again.moniker == moniker


def test_txlog_dead_letters_and_replay(tmp_path: Path) -> None:
    transport = TxLogMonikerTransport(
        TxLogTransport(uri=str(tmp_path / "txlog"), dead_letter_uri=str(tmp_path / "dlq"))
    )
    exercise_dead_letters(transport, sample_moniker(seq=1, prev_seq=None))


@pytest.mark.integration
def test_azure_queue_keeps_a_dead_lettered_moniker_whole_even_one_sent_as_a_pointer(
    azure_settings: AzureQueueTransport,
) -> None:
    transport = AzureQueueMonikerTransport(azure_settings, visibility_timeout_s=30)
    exercise_dead_letters(
        transport, big_moniker(files=2000)
    )  # its message only points to the journal copy, which goes
    assert (
        json.loads(transport.dead_letter_queue.receive_messages().next().content)["reason"]
        == "a file is not Parquet"
    )


def test_pending_filters_by_writer_alone(tmp_path: Path) -> None:
    transport = TxLogMonikerTransport(
        TxLogTransport(uri=str(tmp_path / "txlog"), dead_letter_uri=str(tmp_path / "dlq"))
    )
    transport.publish(sample_moniker(seq=1, prev_seq=None, writer="w1"))
    transport.publish(sample_moniker(seq=1, prev_seq=None, writer="w2", table="db.u"))
    assert [m.writer_id for m in transport.pending(writer_id="w2")] == ["w2"]


def test_a_local_moniker_is_durable_before_it_is_published(tmp_path: Path, monkeypatch) -> None:
    """A rename is atomic but not durable: after a power cut a moniker renamed into place
    unsynced can come back empty, be dead-lettered as unreadable, and its records never be
    committed (its writer moved on). The file's bytes are synced before the rename, the folder
    (the new name) after it, both before `publish` returns; the same for a lease's whole write."""
    import os

    from icekeeper.common.storage import write_file

    synced = record_fsyncs(monkeypatch)
    transport = TxLogMonikerTransport(
        TxLogTransport(uri=str(tmp_path / "log"), dead_letter_uri=str(tmp_path / "dlq"))
    )
    moniker = sample_moniker()
    transport.publish(moniker)
    [path] = transport.folder.list_paths()
    name, folder = os.path.basename(path), os.path.dirname(path)
    # The temporary file (a hidden name beside the moniker's), then the folder, in that order.
    assert [os.path.basename(p).startswith(f".{name}.") for p in synced] == [True, False]
    assert synced[1] == folder
    synced.clear()
    write_file(str(tmp_path / "lease" / "holder.json"), b"{}")
    assert synced[-1] == str(tmp_path / "lease") and len(synced) == 2


@pytest.mark.integration
def test_azure_queue_never_reads_or_deletes_outside_its_journal(
    azure_settings: AzureQueueTransport, tmp_path: Path
) -> None:
    """A pointer message is bad input unless it names a journal file: one naming any other file
    (a forged or mangled message) is unreadable, and dead-lettering it leaves that file alone."""
    transport = AzureQueueMonikerTransport(azure_settings)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(b"not the journal's")
    for path in (str(elsewhere), f"{transport.journal.root}/../elsewhere.json"):
        transport.queue.send_message(json.dumps({"icekeeper_moniker_pointer": path, "id": "x"}))
    deliveries = transport.receive()
    assert len(deliveries) == 2
    for delivery in deliveries:
        assert delivery.moniker is None and "bad pointer" in delivery.error
        assert delivery.attempts == 1
        transport.dead_letter(delivery, delivery.error)
    assert elsewhere.read_bytes() == b"not the journal's"
    assert transport.queue.get_queue_properties().approximate_message_count == 0

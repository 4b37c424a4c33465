"""How a bookkeeper on the Azure queue transport reads monikers sent as pointers to their journal
copy (every moniker here: `transport.max_inline_bytes: 0`), with the journal on Azure Blob
(Azurite): an outage reading one copy costs only that one, which comes back soon and is not
counted as bad input; only reads that found a copy unreadable count toward dead-lettering."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.catalog import load_table_or_none, open_catalog
from icekeeper.common.committed_state import committed_state
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.storage import write_whole
from icekeeper.common.transports import open_transport
from icekeeper.localstack.services import AZURITE_ACCOUNT, AZURITE_KEY
from tests.support.object_stores import azure_uri, azurite_blob_properties, new_container
from tests.support.relay import Fault, Relay, containing, lose, refuse
from tests.support.shop_items import azure_queue_settings, bookkeeper_config, make_moniker

pytestmark = pytest.mark.integration


def journal_on_azurite(
    tmp_path: Path, local_stack, blob_endpoint: str | None = None, **overrides: str
) -> IcekeeperConfig:
    """A queue transport on Azurite whose journal is on Azurite blob (reached at
    `blob_endpoint`, e.g. a relay's), every moniker sent as a pointer to its journal copy; this
    process's storage door configured as the bookkeeper's."""
    blob = local_stack.service("azurite-blob")
    container = new_container(azurite_blob_properties(blob))
    storage = {
        "adls.account-name": AZURITE_ACCOUNT,
        "adls.connection-string": (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={blob_endpoint or blob.address()};"
        ),
    }
    properties = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"file://{tmp_path}/warehouse",
        **storage,
    }
    config = bookkeeper_config(
        tmp_path,
        catalog__properties=json.dumps(properties),
        transport__journal_uri=azure_uri(container, "journal"),
        transport__max_inline_bytes="0",
        **azure_queue_settings(local_stack),
        **overrides,
    )
    open_catalog(config)  # configures this process's storage door, as the bookkeeper's
    return config


def committed_seqs(bookkeeper: Bookkeeper) -> dict[str, int]:
    table = load_table_or_none(bookkeeper.catalog, "shop.items")
    return {} if table is None else committed_state(table).writer_seqs


def unreadable_count(bookkeeper: Bookkeeper) -> float:
    return (
        bookkeeper.metrics.registry.get_sample_value(
            "icekeeper_errors_total", {"kind": "unreadable-moniker"}
        )
        or 0
    )


def test_an_outage_reading_one_journal_copy_costs_only_that_moniker(
    tmp_path: Path, local_stack
) -> None:
    """Blob storage fails every read of `b`'s journal copy for a while: `a`'s moniker, received
    in the same call, commits in that cycle; `b`'s is neither dead-lettered nor counted as
    unreadable, and commits within seconds once storage answers again, not after the 10-minute
    visibility timeout."""
    relay = Relay(local_stack.service("azurite-blob").address())
    try:
        config = journal_on_azurite(
            tmp_path, local_stack, relay.address, transport__visibility_timeout="600s"
        )
        transport = open_transport(config)
        a1 = make_moniker(config, 1, None, (0, 10), "a", 0)
        b1 = make_moniker(config, 1, None, (0, 10), "b", 1)
        transport.publish(a1)
        transport.publish(b1)
        bookkeeper = Bookkeeper(config)
        relay.arm(containing(b1.id.encode()), refuse(503), times=10_000)
        report = bookkeeper.run_cycle()
        assert report.committed_monikers == 1 and report.dead_lettered == []
        assert committed_seqs(bookkeeper) == {"a": 1}
        assert unreadable_count(bookkeeper) == 0
        outage_faults = relay.faulted
        assert outage_faults > 0
        relay.arm(lambda sent: False, lose())  # storage answers again
        deadline = time.monotonic() + 60
        while "b" not in committed_seqs(bookkeeper) and time.monotonic() < deadline:
            assert bookkeeper.run_cycle().dead_lettered == []
            time.sleep(0.5)
        assert committed_seqs(bookkeeper) == {"a": 1, "b": 1}
        assert unreadable_count(bookkeeper) == 0 and transport.dead_letter_count() == 0
        assert transport.pending() == []
    finally:
        relay.close()


def test_a_moniker_that_waited_is_not_dead_lettered_on_its_first_bad_read(
    tmp_path: Path, local_stack
) -> None:
    """`b`'s seq 2 waits for seq 1 for six cycles (released and received again each time: six
    receives, over `max_attempts` of 3); then its journal copy reads as garbage once. That read
    counts one, not seven: it is not dead-lettered, and once the copy is whole again and seq 1
    arrives, both commit."""
    config = journal_on_azurite(
        tmp_path,
        local_stack,
        transport__visibility_timeout="2s",
        bookkeeper__max_attempts="3",
    )
    transport = open_transport(config)
    b2 = make_moniker(config, 2, 1, (10, 20), "b", 1)
    transport.publish(b2)
    bookkeeper = Bookkeeper(config)
    for _ in range(6):
        report = bookkeeper.run_cycle()
        assert report.committed_monikers == 0 and report.pending == 1
        time.sleep(0.3)
    path = transport.journal.path_for(b2)
    good = transport.journal.read_bytes(path)
    write_whole(transport.journal.filesystem, path, b'{"format_version": 1, "id": ')
    report = bookkeeper.run_cycle()
    assert report.dead_lettered == [] and unreadable_count(bookkeeper) == 1
    write_whole(transport.journal.filesystem, path, good)
    transport.publish(make_moniker(config, 1, None, (0, 10), "b", 1))
    deadline = time.monotonic() + 30
    while committed_seqs(bookkeeper).get("b") != 2 and time.monotonic() < deadline:
        assert bookkeeper.run_cycle().dead_lettered == []
        time.sleep(0.3)
    assert committed_seqs(bookkeeper) == {"b": 2} and transport.dead_letter_count() == 0


def test_an_unreadable_journal_copy_is_dead_lettered_after_max_attempts_reads_across_restarts(
    tmp_path: Path, local_stack
) -> None:
    """A journal copy that is garbage for good: its unreadable reads are counted in the queue
    message, so a restarted bookkeeper goes on counting and dead-letters it at the third
    (`max_attempts`) read, the garbage kept in the dead-letter place with the reason, its journal
    copy gone (no writer sends it again)."""
    config = journal_on_azurite(
        tmp_path,
        local_stack,
        transport__visibility_timeout="1s",
        bookkeeper__max_attempts="3",
    )
    transport = open_transport(config)
    c1 = make_moniker(config, 1, None, (0, 10), "c", 0)
    transport.publish(c1)
    garbage = b'{"format_version": 1, "id": '
    write_whole(transport.journal.filesystem, transport.journal.path_for(c1), garbage)
    first = Bookkeeper(config)
    assert first.run_cycle().dead_lettered == [] and unreadable_count(first) == 1
    first.committer.close(save_key_indexes=False)
    restarted = Bookkeeper(config)
    dead: list = []
    deadline = time.monotonic() + 30
    while not dead and time.monotonic() < deadline:
        time.sleep(0.5)
        dead = restarted.run_cycle().dead_lettered
    assert len(dead) == 1 and unreadable_count(restarted) == 2
    [item] = transport.quarantined()
    assert item.raw == garbage and item.reason == dead[0][1] and item.reason
    assert transport.pending() == [] and transport.journal.list_paths() == []
    time.sleep(1.5)
    assert restarted.run_cycle().dead_lettered == []
    assert transport.queue.get_queue_properties().approximate_message_count == 0


def test_a_receive_ends_while_two_journal_copies_cannot_be_read(
    tmp_path: Path, local_stack
) -> None:
    """Blob storage fails every read of `b`'s and `c`'s journal copies, slowly (a gateway that
    answers 503 after 3 s): each read fails only after seconds, longer than the short delay
    after which a copy that could not be read is received again. Each is
    made visible again soon, so a receive that read every message it got took `b` again while
    `c` failed, and `c` again while `b` did: the receive, and the cycle with it, never ended while
    the outage lasted (no commit of `a`, no lease renewal, no stop on SIGTERM). The cycle ends
    with `a` committed (a copy that fails that slowly waits for the visibility timeout, the
    others are not read in that receive), and `b` and `c` commit once storage answers, neither
    counted as unreadable nor dead-lettered."""
    import threading

    relay = Relay(local_stack.service("azurite-blob").address())
    try:
        config = journal_on_azurite(
            tmp_path, local_stack, relay.address, transport__visibility_timeout="20s"
        )
        transport = open_transport(config)
        a1 = make_moniker(config, 1, None, (0, 10), "a", 0)
        b1 = make_moniker(config, 1, None, (0, 10), "b", 1)
        c1 = make_moniker(config, 1, None, (0, 10), "c", 2)
        for moniker in (a1, b1, c1):
            transport.publish(moniker)
        bookkeeper = Bookkeeper(config)
        failing = (b1.id.encode().lower(), c1.id.encode().lower())
        slow_refusal = Fault(forward=False, answer=503, before_forward=lambda: time.sleep(3))
        relay.arm(lambda sent: any(m in sent.lower() for m in failing), slow_refusal, times=10**6)
        reports: list = []
        cycle = threading.Thread(target=lambda: reports.append(bookkeeper.run_cycle()), daemon=True)
        began = time.monotonic()
        cycle.start()
        cycle.join(120)
        seconds = time.monotonic() - began
        ended = not cycle.is_alive()
        relay.arm(lambda sent: False, lose())  # storage answers again (a hung cycle ends too)
        cycle.join(120)
        assert ended, f"the cycle still receiving {seconds:.0f} s into the outage"
        [report] = reports
        assert report.committed_monikers == 1 and report.dead_lettered == []
        assert committed_seqs(bookkeeper) == {"a": 1}
        deadline = time.monotonic() + 90
        while len(committed_seqs(bookkeeper)) < 3 and time.monotonic() < deadline:
            assert bookkeeper.run_cycle().dead_lettered == []
            time.sleep(0.5)
        assert committed_seqs(bookkeeper) == {"a": 1, "b": 1, "c": 1}
        assert unreadable_count(bookkeeper) == 0 and transport.dead_letter_count() == 0
    finally:
        relay.close()


def test_a_deeply_nested_message_is_bad_input_not_a_stalled_group(
    tmp_path: Path, local_stack
) -> None:
    """A message of nested JSON arrays (`[[[[...`, 60,000 deep: within the queue's 64 KiB) makes
    Python's JSON parser raise RecursionError, not ValueError. Raised out of the receive, it failed
    every cycle: no moniker of any table committed while it sat in the queue. It is bad input like
    any other unreadable message: the good moniker beside it commits in that cycle, and it is
    dead-lettered at `max_attempts`."""
    config = journal_on_azurite(
        tmp_path, local_stack, transport__visibility_timeout="1s", bookkeeper__max_attempts="2"
    )
    transport = open_transport(config)
    transport.queue.send_message("[" * 60_000)
    transport.publish(make_moniker(config, 1, None, (0, 10), "a", 0))
    bookkeeper = Bookkeeper(config)
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 1 and committed_seqs(bookkeeper) == {"a": 1}
    dead: list = []
    deadline = time.monotonic() + 30
    while not dead and time.monotonic() < deadline:
        time.sleep(1.2)
        dead = bookkeeper.run_cycle().dead_lettered
    assert len(dead) == 1 and "not JSON" in dead[0][1]
    [item] = transport.quarantined()
    assert item.raw == b"[" * 60_000

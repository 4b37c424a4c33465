"""A transaction-log folder on S3, as the production layouts keep it (docs/deployment.md): a cycle
reads its monikers several at a time and, once their commit is durable, deletes them a thousand
a request (S3's DeleteObjects); one after another, 1,000 monikers were 5,000 requests a cycle
(a read: HEAD and GET; a delete: HEAD, DELETE and a PUT of a folder marker). What the store
cannot do now (a read or the deletes refused) leaves those monikers for the next cycle, which
commits nothing twice."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import pytest

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.catalog import open_catalog
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.transports import open_transport
from tests.support.object_stores import storage_door
from tests.support.relay import Fault, Relay, refuse
from tests.support.shop_items import bookkeeper_config, make_moniker

pytestmark = pytest.mark.integration
MONIKERS = 40
ROUND_TRIP_S = 0.1
MONIKER_READ = re.compile(rb"GET /\S*/w1/0000")


@pytest.fixture
def relay(s3_storage):
    relay = Relay(s3_storage.pyiceberg_properties()["s3.endpoint"])
    # The door as the catalog's properties set it (the writer's side publishes before any
    # bookkeeper opens the catalog).
    with storage_door({**s3_storage.pyiceberg_properties(), "s3.endpoint": relay.address}):
        yield relay
    relay.close()


def txlog_on_s3(tmp_path: Path, s3_storage, relay: Relay) -> IcekeeperConfig:
    """The test's own SQLite catalog and local warehouse; the txlog on S3, through the relay."""
    root = s3_storage.uri(f"txlog-{uuid.uuid4().hex[:8]}")
    properties = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"file://{tmp_path}/warehouse",
        **s3_storage.pyiceberg_properties(),
        "s3.endpoint": relay.address,
    }
    return bookkeeper_config(
        tmp_path,
        catalog__properties=json.dumps(properties),
        transport__uri=f"{root}/txlog",
        transport__dead_letter_uri=f"{root}/dead-letter",
    )


def hold_back_moniker_reads(relay: Relay) -> None:
    """Every read of a moniker file held back `ROUND_TRIP_S` (a far store's round trip), then
    forwarded, the server's answer passed on."""
    relay.arm(
        lambda sent: MONIKER_READ.search(sent) is not None,
        Fault(answer="pass", before_forward=lambda: time.sleep(ROUND_TRIP_S)),
        times=10**6,
    )


def offsets_in_table(config: IcekeeperConfig) -> list[int]:
    table = open_catalog(config).load_table("shop.items")
    return sorted(table.scan().to_arrow()["_kfk_offset"].to_pylist())


def publish(config: IcekeeperConfig, count: int) -> None:
    transport = open_transport(config)
    for seq in range(1, count + 1):
        transport.publish(make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 2, seq * 2)))


def moniker_file(seq: int) -> bytes:
    """What a request for writer w1's moniker `seq` holds (its file name's start)."""
    return f"/w1/{seq:012d}-".encode()


def test_a_cycle_reads_and_deletes_its_monikers_on_s3_several_at_a_time(
    tmp_path: Path, s3_storage, relay: Relay
) -> None:
    """Each moniker file's read held back 0.1 s (a far store's round trip): one after another
    the reads alone would take 4 s. Their deletes go in one request."""
    config = txlog_on_s3(tmp_path, s3_storage, relay)
    publish(config, MONIKERS)
    bookkeeper = Bookkeeper(config)
    hold_back_moniker_reads(relay)
    before = len(relay.requests)
    started = time.monotonic()
    report = bookkeeper.run_cycle()
    took_s = time.monotonic() - started
    assert report.committed_monikers == MONIKERS
    assert relay.faulted >= MONIKERS  # every read was held back
    assert took_s < MONIKERS * ROUND_TRIP_S / 2, took_s
    assert offsets_in_table(config) == list(range(2 * MONIKERS))
    assert open_transport(config).pending() == []
    sent = relay.requests[before:]
    assert [line for line in sent if line.startswith("DELETE ")] == []
    assert len([line for line in sent if line.startswith("POST ") and "?delete" in line]) == 1


def test_a_refused_read_or_delete_waits_for_the_next_cycle_and_nothing_is_committed_twice(
    tmp_path: Path, s3_storage, relay: Relay
) -> None:
    config = txlog_on_s3(tmp_path, s3_storage, relay)
    publish(config, MONIKERS)
    bookkeeper = Bookkeeper(config)
    # Moniker 20's file cannot be read this cycle (every retry refused): 1-19 commit, 20-40 wait
    # (each names the one before it).
    relay.arm(
        lambda sent: re.search(rb"GET /\S*" + re.escape(moniker_file(20)), sent) is not None,
        refuse(503),
        times=10**6,
    )
    assert bookkeeper.run_cycle().committed_monikers == 19
    assert offsets_in_table(config) == list(range(38))
    relay.arm(lambda sent: False, refuse(503))
    assert [m.seq for m in open_transport(config).pending()] == list(range(20, MONIKERS + 1))
    # Readable again; now the deletes are refused once the commit is durable.
    relay.arm(
        lambda sent: re.search(rb"POST /\S*\?delete", sent) is not None,
        refuse(503),
        times=10**6,
    )
    # The commit is durable and reported; the cycle then fails on the deletes, as a cycle that
    # cannot finish its work does (its loop retries; readiness goes after repeated ones).
    with pytest.raises(OSError):
        bookkeeper.run_cycle()
    failed = bookkeeper.metrics.registry.get_sample_value(
        "icekeeper_errors_total", {"kind": "acknowledge-failed"}
    )
    assert failed == 1
    relay.arm(lambda sent: False, refuse(503))
    assert offsets_in_table(config) == list(range(2 * MONIKERS))
    assert [m.seq for m in open_transport(config).pending()] == list(range(20, MONIKERS + 1))
    # The next cycle finds them committed: acknowledged as duplicates, nothing added twice.
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 0
    assert len(report.tables[0].duplicates) == MONIKERS - 19
    assert offsets_in_table(config) == list(range(2 * MONIKERS))
    assert open_transport(config).pending() == []


def test_a_store_that_takes_no_multi_object_delete_gets_the_deletes_one_at_a_time(
    tmp_path: Path, s3_storage, relay: Relay
) -> None:
    """S3-compatible stores that refuse DeleteObjects (older MinIO and Ceph without a
    Content-MD5, GCS's S3 interface): the acknowledgements fall back to one delete a file, and
    later cycles do not ask again."""
    config = txlog_on_s3(tmp_path, s3_storage, relay)
    publish(config, 10)
    bookkeeper = Bookkeeper(config)
    relay.arm(
        lambda sent: re.search(rb"POST /\S*\?delete", sent) is not None, refuse(501), times=10**6
    )
    before = len(relay.requests)
    assert bookkeeper.run_cycle().committed_monikers == 10
    assert open_transport(config).pending() == []
    sent = relay.requests[before:]
    assert len([line for line in sent if "?delete" in line]) == 1
    assert len([line for line in sent if line.startswith("DELETE ")]) == 10
    publish_more = open_transport(config)
    for seq in range(11, 14):
        publish_more.publish(make_moniker(config, seq, seq - 1, ((seq - 1) * 2, seq * 2)))
    before = len(relay.requests)
    assert bookkeeper.run_cycle().committed_monikers == 3
    assert open_transport(config).pending() == []
    sent = relay.requests[before:]
    assert [line for line in sent if "?delete" in line] == []
    assert offsets_in_table(config) == list(range(26))


def test_a_cycle_whose_deletes_are_refused_still_sets_its_bad_monikers_aside(
    tmp_path: Path, s3_storage, relay: Relay
) -> None:
    """The acknowledgements come last: the deletes refused, the commit's quarantined moniker is
    in the dead letters all the same (before, the failure skipped them)."""
    config = txlog_on_s3(tmp_path, s3_storage, relay)
    publish(config, 3)
    bad = make_moniker(config, 1, None, (100, 102), writer_id="w2", partition=1)
    Path(bad.files[0].path.removeprefix("file://")).write_bytes(b"not a parquet file")
    open_transport(config).publish(bad)
    bookkeeper = Bookkeeper(config)
    relay.arm(
        lambda sent: re.search(rb"POST /\S*\?delete", sent) is not None, refuse(503), times=10**6
    )
    with pytest.raises(OSError):
        bookkeeper.run_cycle()
    relay.arm(lambda sent: False, refuse(503))
    [quarantined] = open_transport(config).quarantined()
    assert quarantined.moniker == bad and quarantined.reason
    assert offsets_in_table(config) == list(range(6))
    assert [m.seq for m in open_transport(config).pending()] == [1, 2, 3]
    assert bookkeeper.run_cycle().committed_monikers == 0
    assert open_transport(config).pending() == []


def test_what_writers_list_as_pending_is_read_several_at_a_time(
    tmp_path: Path, s3_storage, relay: Relay
) -> None:
    """A writer lists the pending monikers before every batch: with a backlog on a far store,
    one read after another held every batch up (here 4 s)."""
    config = txlog_on_s3(tmp_path, s3_storage, relay)
    publish(config, MONIKERS)
    transport = open_transport(config)
    hold_back_moniker_reads(relay)
    started = time.monotonic()
    pending = transport.pending(writer_id="w1")
    took_s = time.monotonic() - started
    assert [m.seq for m in pending] == list(range(1, MONIKERS + 1))
    assert took_s < MONIKERS * ROUND_TRIP_S / 2, took_s
    # A file the store cannot serve now is an outage for the writer's batch, not "no moniker".
    relay.arm(
        lambda sent: re.search(rb"GET /\S*" + re.escape(moniker_file(7)), sent) is not None,
        refuse(503),
        times=10**6,
    )
    with pytest.raises(OSError):
        transport.pending()

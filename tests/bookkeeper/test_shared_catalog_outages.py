"""Commits of unknown outcome on the shared catalogs, through a real fault: the connection to
PostgreSQL or to the Hive Metastore is cut by a relay in front of the real server right after it
forwarded the commit (`CommitPath._settled` reads the table back), or before (the commit never
landed). Through the bookkeeper's own cycles, every moniker is committed exactly once and
acknowledged only once its commit is in the table. A Hive commit cut mid-way that is found in the
table leaves no lock that stops the next one; one not found leaves its lock to the metastore's
timeout, since its `alter_table` may still land (`bookkeeper/hive_locks.py`). A catalog that stops
answering (the relay leaves the connection open and relays nothing more, or another session holds
the table's catalog row) fails the call after `catalog.request_timeout`, settled the same way,
and never holds a cycle forever (review finding H2)."""

from __future__ import annotations

import time

import pytest
from hive_metastore.ttypes import LockComponent, LockLevel, LockRequest, LockType
from pyiceberg.catalog.hive import HiveCatalog

from icekeeper.bookkeeper.commit_path import MAX_ATTEMPTS
from icekeeper.bookkeeper.service import Bookkeeper, CycleReport
from icekeeper.common.catalog import open_catalog
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.internals import hive_metastore_client
from icekeeper.common.transports import open_transport
from icekeeper.localstack.hive_metastore import LOCK_TIMEOUT_S
from tests.support.hms_pg_layouts import catalog_layout_for, table_locks
from tests.support.relay import Fault, Relay, late, lose, refuse, stall
from tests.support.shop_items import make_moniker
from tests.support.waiting import returns_within

pytestmark = pytest.mark.integration


def relayed_config(service, tmp_path, relay: Relay, **overrides: str) -> IcekeeperConfig:
    """A bookkeeper config whose catalog is reached through `relay` (in front of `service`)."""
    layout = catalog_layout_for(service)
    config = layout.bookkeeper_config(tmp_path)  # drops an earlier test's table, directly
    relayed = relay.address
    assert relayed != service.pyiceberg_properties()["uri"]
    return layout.bookkeeper_config(
        tmp_path,
        catalog__name=config.catalog.name,
        catalog__properties=_json(layout.properties(uri=relayed)),
        **overrides,
    )


def _json(properties: dict[str, str]) -> str:
    import json

    return json.dumps(properties)


def offsets_in_table(config: IcekeeperConfig) -> list[int]:
    table = open_catalog(config).load_table("shop.items")
    return sorted(table.scan().to_arrow()["_kfk_offset"].to_pylist())


def acknowledged_only_when_committed(bookkeeper: Bookkeeper, config: IcekeeperConfig) -> list:
    """Checks, as each delivery is acknowledged, that its records are in the table (read through
    a catalog of its own, not the bookkeeper's); returns the acknowledged monikers' ids."""
    acknowledged = []
    acknowledge = bookkeeper.transport.acknowledge

    def checked(delivery) -> None:
        offsets = set(offsets_in_table(config))
        for span in delivery.moniker.offsets:
            assert set(range(span.from_offset, span.until_offset)) <= offsets, span
        acknowledged.append(delivery.moniker.id)
        acknowledge(delivery)

    def checked_each(deliveries) -> None:
        for delivery in deliveries:
            checked(delivery)

    bookkeeper.transport.acknowledge = checked
    bookkeeper.transport.acknowledge_all = checked_each
    return acknowledged


def run_through_a_cut(
    config: IcekeeperConfig,
    relay: Relay,
    at,
    fault: Fault,
    cycles_for_s: float = 0.0,
    cycle_within_s: float | None = None,
) -> None:
    """`fault`: what the relay does to the commit `at` matches (`lose`: it landed, `refuse`: it
    did not, `stall`: either, the connection left open). `cycles_for_s`: how long the
    bookkeeper's cycles may take to commit what the cut one did not (a Hive lock left to the
    metastore's timeout); three cycles when 0. `cycle_within_s`: how long each cycle may take."""
    transport, bookkeeper = open_transport(config), Bookkeeper(config)
    acknowledged = acknowledged_only_when_committed(bookkeeper, config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    assert bookkeeper.run_cycle().committed_monikers == 1  # the table exists
    transport.publish(make_moniker(config, 2, 1, (10, 20)))
    transport.publish(make_moniker(config, 3, 2, (20, 30)))
    relay.arm(at, fault)
    committed, cycles, started = 0, 0, time.monotonic()
    while cycles < 3 or time.monotonic() - started < cycles_for_s:
        # The bookkeeper's next cycles, as its loop runs them (a failed table waits).
        if cycle_within_s is None:
            committed += bookkeeper.run_cycle().committed_monikers
        else:
            committed += cycle_within(bookkeeper, cycle_within_s).committed_monikers
        cycles += 1
        if not transport.pending():
            break
    # The cut happened as armed: the server answered a landed commit, which the client never heard.
    assert relay.faulted == 1 and relay.lost == (1 if fault.forward else 0)
    assert committed == 2 and transport.pending() == []
    # A commit after the cut goes through at once (no lock left behind, no connection broken).
    transport.publish(make_moniker(config, 4, 3, (30, 40)))
    assert bookkeeper.run_cycle().committed_monikers == 1
    assert offsets_in_table(config) == list(range(40))  # each record once
    assert len(acknowledged) == 4 and len(set(acknowledged)) == 4
    catalog = open_catalog(config)
    if isinstance(catalog, HiveCatalog):
        assert table_locks(catalog, "shop.items") == []


def postgres_commit(sent: bytes) -> bool:
    """The `COMMIT` of a transaction that updated a table's metadata location."""
    update = sent.find(b"UPDATE iceberg_tables")
    return update >= 0 and b"COMMIT" in sent[update:]


def metastore_alter_table(sent: bytes) -> bool:
    return b"alter_table_with_environment_context" in sent


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "lost"])
def test_a_postgres_connection_cut_at_commit(pg_catalog, tmp_path, landed: bool) -> None:
    relay = Relay(pg_catalog.pyiceberg_properties()["uri"])
    try:
        config = relayed_config(pg_catalog, tmp_path, relay)
        run_through_a_cut(config, relay, postgres_commit, lose() if landed else refuse())
    finally:
        relay.close()


@pytest.mark.parametrize(
    "landed",
    [True, pytest.param(False, marks=pytest.mark.heavy)],  # waits for the lock's timeout
    ids=["landed", "lost"],
)
def test_a_metastore_connection_cut_at_alter_table(hive_metastore, tmp_path, landed: bool) -> None:
    relay = Relay(hive_metastore.pyiceberg_properties()["uri"])
    try:
        config = relayed_config(hive_metastore, tmp_path, relay)
        run_through_a_cut(
            config,
            relay,
            metastore_alter_table,
            lose() if landed else refuse(),
            cycles_for_s=6 * LOCK_TIMEOUT_S,
        )
    finally:
        relay.close()


TIMEOUT_S = 3.0
"""`catalog.request_timeout` of the tests where the catalog stops answering."""
WITHIN_S = TIMEOUT_S + 30
"""How long a cycle through a catalog that stopped answering may take: the timeout, then reading
the table back and committing again, on a machine shared with other runs."""


def cycle_within(bookkeeper: Bookkeeper, seconds: float) -> CycleReport:
    """`bookkeeper.run_cycle()`, which must return within `seconds`: a catalog that stopped
    answering held the cycle forever (review finding H2), while the lease lapsed."""
    started = time.monotonic()
    report = returns_within(bookkeeper.run_cycle, seconds, "the cycle (waiting for the catalog)")
    print(f"cycle: {time.monotonic() - started:.1f}s")
    return report


@pytest.mark.parametrize(
    "landed",
    # Not landed, the commit's lock is left to the metastore's timeout (bookkeeper/hive_locks.py).
    [True, pytest.param(False, marks=pytest.mark.heavy)],
    ids=["answer-lost", "request-lost"],
)
def test_a_metastore_that_stops_answering_at_alter_table(
    hive_metastore, tmp_path, landed: bool
) -> None:
    """The metastore takes the commit's `alter_table` (or never gets it) and never answers, the
    connection left open. pyiceberg sets no socket timeout: the bookkeeper waited forever. Now
    the call times out after `catalog.request_timeout`, the outcome is settled by reading the
    table back, and every moniker is committed once."""
    relay = Relay(hive_metastore.pyiceberg_properties()["uri"])
    try:
        config = relayed_config(
            hive_metastore, tmp_path, relay, catalog__request_timeout=str(TIMEOUT_S)
        )
        run_through_a_cut(
            config,
            relay,
            metastore_alter_table,
            stall(forward=landed),
            cycles_for_s=6 * LOCK_TIMEOUT_S,
            # Not landed, the cycle's next attempts wait for the lock, about two minutes.
            cycle_within_s=WITHIN_S if landed else WITHIN_S + 3 * LOCK_TIMEOUT_S,
        )
    finally:
        relay.close()


def postgres_update(sent: bytes) -> bool:
    """The `UPDATE` of a table's metadata location (a commit's compare-and-swap)."""
    return b"UPDATE iceberg_tables" in sent


@pytest.mark.parametrize(
    ("at", "landed"),
    [(postgres_update, False), (postgres_commit, False), (postgres_commit, True)],
    ids=["update-lost", "commit-lost", "commit-answer-lost"],
)
def test_a_postgres_connection_that_stops_answering(pg_catalog, tmp_path, at, landed) -> None:
    """The connection stops at the commit's `UPDATE` or `COMMIT`, open: the statement never
    reaches PostgreSQL, or it does (the `COMMIT` lands) and the answer never comes back. libpq
    waits forever for an answer; now the server ends the session once it has been idle (in its
    transaction or not) for `catalog.request_timeout`, the relay closes the client's side as a
    proxy does, and the outcome is settled by reading the table back."""
    relay = Relay(pg_catalog.pyiceberg_properties()["uri"])
    try:
        config = relayed_config(
            pg_catalog, tmp_path, relay, catalog__request_timeout=str(TIMEOUT_S)
        )
        run_through_a_cut(config, relay, at, stall(forward=landed), cycle_within_s=WITHIN_S)
    finally:
        relay.close()


def test_a_postgres_commit_waiting_for_the_catalog_row_times_out(pg_catalog, tmp_path) -> None:
    """Another session holds the table's row in the catalog (another engine's transaction left
    open, a client stuck mid-commit): the bookkeeper's `UPDATE` waits for it, and waited forever.
    Now PostgreSQL cancels it after `catalog.request_timeout` (`statement_timeout`): the cycle
    gives up on the table (each attempt timed out, none landed), and once the row is free the
    next cycle commits every moniker once."""
    import psycopg

    config = catalog_layout_for(pg_catalog).bookkeeper_config(
        tmp_path, catalog__request_timeout=str(TIMEOUT_S)
    )
    transport, bookkeeper = open_transport(config), Bookkeeper(config)
    acknowledged = acknowledged_only_when_committed(bookkeeper, config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    assert bookkeeper.run_cycle().committed_monikers == 1  # the table exists
    transport.publish(make_moniker(config, 2, 1, (10, 20)))
    direct = pg_catalog.pyiceberg_properties()["uri"].replace("postgresql+psycopg:", "postgresql:")
    with psycopg.connect(direct) as other:
        held = other.execute(
            "SELECT 1 FROM iceberg_tables WHERE catalog_name = %s AND table_namespace = 'shop' "
            "AND table_name = 'items' FOR UPDATE",
            (config.catalog.name,),
        ).fetchall()
        assert held == [(1,)]
        # Every attempt of the cycle (MAX_ATTEMPTS) times out; none lands.
        report = cycle_within(bookkeeper, MAX_ATTEMPTS * (TIMEOUT_S + 5))
        assert report.committed_monikers == 0 and len(transport.pending()) == 1
        other.rollback()
    assert bookkeeper.run_cycle().committed_monikers == 1
    assert transport.pending() == []
    assert offsets_in_table(config) == list(range(20))  # each record once
    assert len(acknowledged) == 2 and len(set(acknowledged)) == 2


DELAY_S = 4.0
"""How long after the client gave up a delayed `alter_table` reaches the metastore."""


@pytest.mark.heavy  # waits for the metastore's lock timeout
def test_an_alter_table_landing_after_the_read_back_loses_no_acknowledged_commit(
    hive_metastore, tmp_path
) -> None:
    """The cut commit's `alter_table` reaches the metastore seconds after the bookkeeper read the
    table back and found it not landed. With its lock released at once (as the first version of
    `hive_locks.py` did), the next commits went through and were acknowledged, then the late
    `alter_table` set the metadata pointer back over them (found by a review: seq 3 acknowledged
    and gone, the writer's next moniker waiting for ever). With the lock left to the metastore's
    timeout, the next commit waits, and then finds the late one in the table."""
    relay = Relay(hive_metastore.pyiceberg_properties()["uri"])
    try:
        config = relayed_config(hive_metastore, tmp_path, relay)
        transport, bookkeeper = open_transport(config), Bookkeeper(config)
        acknowledged = acknowledged_only_when_committed(bookkeeper, config)
        transport.publish(make_moniker(config, 1, None, (0, 10)))
        assert bookkeeper.run_cycle().committed_monikers == 1  # the table exists
        transport.publish(make_moniker(config, 2, 1, (10, 20)))
        relay.arm(metastore_alter_table, late(DELAY_S))
        started = time.monotonic()
        while transport.pending() and time.monotonic() - started < 6 * LOCK_TIMEOUT_S:
            bookkeeper.run_cycle()
        assert relay.faulted == 1 and transport.pending() == []
        transport.publish(make_moniker(config, 3, 2, (20, 30)))
        while transport.pending() and time.monotonic() - started < 6 * LOCK_TIMEOUT_S:
            bookkeeper.run_cycle()
        time.sleep(DELAY_S + 3)  # whatever was in flight has landed by now
        assert relay.lost == 1  # the late alter_table reached the metastore, which answered
        assert offsets_in_table(config) == list(range(30))
        transport.publish(make_moniker(config, 4, 3, (30, 40)))
        assert bookkeeper.run_cycle().committed_monikers == 1  # the chain goes on
        assert offsets_in_table(config) == list(range(40))
        assert len(acknowledged) == 4 and len(set(acknowledged)) == 4
    finally:
        relay.close()


@pytest.mark.heavy  # waits for the metastore's lock timeout (a minute) and a failed cycle
def test_a_lock_left_by_a_killed_commit_is_released_by_the_metastore(
    hive_metastore, tmp_path
) -> None:
    """A bookkeeper killed while committing leaves its lock, which no process can release: the
    metastore's housekeeper does, past `metastore.txn.timeout` (the stack runs it; see
    docs/operations.md), and the next bookkeeper's cycles then commit."""
    config = catalog_layout_for(hive_metastore).bookkeeper_config(tmp_path)
    transport, bookkeeper = open_transport(config), Bookkeeper(config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    assert bookkeeper.run_cycle().committed_monikers == 1
    catalog = open_catalog(config)
    with hive_metastore_client(catalog) as client:  # what a commit takes first, then is killed
        component = LockComponent(
            type=LockType.EXCLUSIVE, level=LockLevel.TABLE, dbname="shop", tablename="items"
        )
        client.lock(LockRequest(component=[component], user="killed", hostname="gone"))
    assert table_locks(catalog, "shop.items")
    transport.publish(make_moniker(config, 2, 1, (10, 20)))
    started = time.monotonic()
    while transport.pending() and time.monotonic() - started < 6 * LOCK_TIMEOUT_S:
        bookkeeper.run_cycle()
    assert transport.pending() == [], f"still locked after {time.monotonic() - started:.0f} s"
    assert offsets_in_table(config) == list(range(20))

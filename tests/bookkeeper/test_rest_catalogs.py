"""The bookkeeper on Iceberg REST catalogs (the REST fixture server and Nessie), the warehouse on
the stack's S3 server: its cycles commit changelog and upsert tables exactly once, purges
included, and settle commits whose answer was lost, replaced by a 5xx, or never came, through a
real socket relay in front of the real server (`tests/support/relay.py`)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog

from icekeeper.bookkeeper.commit_path import StaleEpoch
from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.catalog import open_catalog
from icekeeper.common.committed_state import committed_state
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.door_fileio import SinglePutFileIO
from icekeeper.common.internals import add_rest_response_hook
from icekeeper.common.transports import open_transport
from icekeeper.localstack.catalog_service import CatalogService
from tests.support.catalog_layouts import S3Writer, commit_request_line, layout_config, table_of
from tests.support.relay import Relay, containing, forward_after, lose, refuse, replace, stall
from tests.support.shop_items import applied

pytestmark = pytest.mark.integration

REST_CATALOGS = ("rest_catalog", "nessie_catalog")


@pytest.fixture(params=REST_CATALOGS)
def rest_service(request) -> CatalogService:
    return request.getfixturevalue(request.param)


def rows_of(bookkeeper: Bookkeeper, identifier: str) -> list[tuple[int, int, int]]:
    """(id, amount, offset) of every row, sorted."""
    arrow = bookkeeper.catalog.load_table(identifier).scan().to_arrow()
    return sorted(
        zip(
            arrow.column("id").to_pylist(),
            arrow.column("amount").to_pylist(),
            arrow.column("_kfk_offset").to_pylist(),
            strict=True,
        )
    )


def committed_offsets(bookkeeper: Bookkeeper, identifier: str) -> list[int]:
    """The `_kfk_offset` of every row, sorted: a moniker committed twice shows its offsets twice.
    (Rows, not snapshot summaries: Nessie's tables keep only their current snapshot, their
    history is Nessie's own commit log.)"""
    return sorted(row[2] for row in rows_of(bookkeeper, identifier))


def test_the_catalog_s_answers_come_uncompressed_unless_the_config_asks_for_gzip(
    tmp_path: Path, rest_catalog
) -> None:
    """Iceberg's REST fixture gzips what a client accepts gzipped (`requests` asks by default);
    every commit's answer is the table's whole metadata, so the bookkeeper asks for it plain."""

    def encodings(config: IcekeeperConfig) -> set[str | None]:
        seen: set[str | None] = set()
        catalog = open_catalog(config)
        add_rest_response_hook(
            catalog, lambda answer: seen.add(answer.headers.get("Content-Encoding"))
        )
        catalog.list_namespaces()
        catalog.create_namespace_if_not_exists("ns_encoding")
        return seen

    assert encodings(layout_config(tmp_path / "plain", rest_catalog)) == {None}
    asked = layout_config(tmp_path / "gzip", rest_catalog)
    properties = {**asked.catalog.properties, "header.accept-encoding": "gzip"}
    asked = asked.model_copy(
        update={"catalog": asked.catalog.model_copy(update={"properties": properties})}
    )
    assert "gzip" in encodings(asked)


def test_changelog_cycles_commit_each_moniker_once(tmp_path: Path, rest_service) -> None:
    config = layout_config(tmp_path, rest_service)
    identifier = table_of(config)
    transport, writer = open_transport(config), S3Writer(config)
    bookkeeper = Bookkeeper(config)
    expected = []
    for batch in range(4):
        changes = [(key, batch * 100 + key) for key in range(10)]
        transport.publish(writer.batch(changes))
        expected += [(k, a, batch * 10 + i) for i, (k, a) in enumerate(changes)]
        report = bookkeeper.run_cycle()
        assert report.committed_monikers == 1, report
    assert transport.pending() == []
    assert rows_of(bookkeeper, identifier) == sorted(expected)
    table = bookkeeper.catalog.load_table(identifier)
    assert table.location().startswith("s3://")
    assert committed_state(table).offsets == {("items", 0): 40}
    # pyiceberg's own IO with the server's settings, writing small files in one PUT.
    assert isinstance(table.io, SinglePutFileIO)


def churn(rng: random.Random, keys: int) -> list[tuple[int, int | None]]:
    changes: list[tuple[int, int | None]] = [
        (key, rng.randrange(10**6)) for key in rng.sample(range(keys), int(0.86 * keys))
    ]
    changes += [(key, None) for key in rng.sample(range(keys), keys // 20)]
    rng.shuffle(changes)
    return changes


def test_upsert_cycles_and_purges_keep_one_row_per_key(tmp_path: Path, rest_service) -> None:
    config = layout_config(tmp_path, rest_service, mode="upsert")
    identifier = table_of(config)
    transport, writer = open_transport(config), S3Writer(config)
    bookkeeper = Bookkeeper(config)
    rng, reference, keys = random.Random(7), {}, 200
    for changes in [[(k, k) for k in range(keys)]] + [churn(rng, keys) for _ in range(4)]:
        transport.publish(writer.batch(changes))
        report = bookkeeper.run_cycle()
        assert report.committed_monikers == 1, report
        applied(reference, changes)
        arrow = bookkeeper.catalog.load_table(identifier).scan().to_arrow()
        live = arrow.column("id").to_pylist()
        assert len(live) == len(set(live)), "a key has two live rows"
        assert dict(zip(live, arrow.column("amount").to_pylist(), strict=True)) == reference
    table = bookkeeper.catalog.load_table(identifier)
    operations = [s.summary.operation.value for s in table.snapshots() if s.summary]
    assert "replace" in operations, operations  # the purges' snapshots
    state = committed_state(table)
    assert state.offsets == {("items", 0): writer.offset} and state.writer_seqs == {"w1": 5}


FAULTS = {
    # The server applied the commit; the client hears no answer, a 503, a 504, or nothing at all
    # until its request times out.
    "lose": lose(),
    "503": replace(503),
    "504": replace(504),
    "stall": stall(),
    # The server never saw the commit; the client hears a 503, or the connection closes.
    "refuse-503": refuse(503),
    "refuse-lose": refuse(),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_commit_of_unknown_outcome_is_settled_and_each_moniker_committed_once(
    tmp_path: Path, rest_service, fault: str
) -> None:
    """A real socket relay between the bookkeeper and the real catalog server faults one commit
    request; the bookkeeper's own next cycles must leave every moniker committed exactly once,
    and acknowledge none before its commit is durable."""
    relay = Relay(rest_service.pyiceberg_properties()["uri"])
    try:
        config = layout_config(
            tmp_path, rest_service, uri=relay.address, catalog__request_timeout="4"
        )
        identifier = table_of(config)
        transport, writer = open_transport(config), S3Writer(config)
        bookkeeper = Bookkeeper(config)
        published: dict[str, range] = {}

        def cycle() -> None:
            bookkeeper.run_cycle()
            pending = {moniker.id for moniker in transport.pending()}
            offsets = committed_offsets(bookkeeper, identifier)
            assert len(offsets) == len(set(offsets)), f"committed twice: {offsets}"
            # Acknowledged (no longer pending) only once committed.
            for moniker_id, covered in published.items():
                if moniker_id not in pending:
                    assert set(covered) <= set(offsets), (moniker_id, offsets)

        def publish(batch: int) -> None:
            moniker = writer.batch([(key, batch * 100 + key) for key in range(10)])
            transport.publish(moniker)
            published[moniker.id] = range(batch * 10, batch * 10 + 10)

        publish(0)
        cycle()
        relay.arm(containing(commit_request_line(rest_service, identifier)), FAULTS[fault])
        publish(1)
        started = time.monotonic()
        cycle()
        print(f"{fault}: the faulted cycle took {time.monotonic() - started:.1f}s")
        # The fault happened as armed: the server answered a forwarded commit, unheard.
        assert relay.faulted == 1 and relay.lost == (1 if FAULTS[fault].forward else 0)
        publish(2)
        for _ in range(3):
            cycle()
            if not transport.pending():
                break
        assert transport.pending() == []
        assert committed_offsets(bookkeeper, identifier) == list(range(30))
    finally:
        relay.close()


def test_a_commit_that_loses_its_compare_and_swap_is_planned_again_not_dead_lettered(
    tmp_path: Path, rest_service
) -> None:
    """Another client commits to the table just before the bookkeeper's commit reaches the real
    server: the server refuses the bookkeeper's (its base snapshot is no longer current), pyiceberg
    raises `CommitFailedException`, and the bookkeeper plans again on the refreshed table."""
    relay = Relay(rest_service.pyiceberg_properties()["uri"])
    try:
        config = layout_config(tmp_path, rest_service, uri=relay.address)
        identifier = table_of(config)
        transport, writer = open_transport(config), S3Writer(config)
        bookkeeper = Bookkeeper(config)
        transport.publish(writer.batch([(key, key) for key in range(10)]))
        assert bookkeeper.run_cycle().committed_monikers == 1
        other = load_catalog("other", **rest_service.pyiceberg_properties())

        def another_commit() -> None:
            table = other.load_table(identifier)
            table.append(
                pa.Table.from_pylist(
                    [{"id": 999, "amount": 1, "_kfk_partition": 1, "_kfk_offset": 1000}],
                    schema=table.schema().as_arrow(),
                )
            )

        relay.arm(
            containing(commit_request_line(rest_service, identifier)), forward_after(another_commit)
        )
        transport.publish(writer.batch([(key, 100 + key) for key in range(10)]))
        report = bookkeeper.run_cycle()
        assert relay.faulted == 1 and relay.lost == 0
        assert report.committed_monikers == 1 and report.tables[0].attempts == 2, report
        assert transport.pending() == [] and transport.dead_letter_count() == 0
        assert committed_offsets(bookkeeper, identifier) == [*range(20), 1000]
    finally:
        relay.close()


@pytest.mark.parametrize("mode", ["changelog", "upsert"])
def test_a_cycle_commits_in_one_request_per_snapshot_without_loading_the_table(
    tmp_path: Path, rest_service, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A REST catalog answers a commit with the new metadata: the bookkeeper plans its next
    commit on it instead of loading the table again (a request whose answer grows with the
    history kept), and leaves the removal of old metadata files to the server (pyiceberg's own
    attempt failed, and was logged, on every commit)."""
    relay = Relay(rest_service.pyiceberg_properties()["uri"])
    try:
        config = layout_config(tmp_path, rest_service, mode=mode, uri=relay.address)
        identifier = table_of(config)
        transport, writer = open_transport(config), S3Writer(config)
        bookkeeper = Bookkeeper(config)
        table_path = commit_request_line(rest_service, identifier).decode().split(" ")[1]
        per_cycle = []
        # Past `write.metadata.previous-versions-max` (10): old metadata files are removed.
        for batch in range(13):
            transport.publish(writer.batch([(key, batch * 100 + key) for key in range(20)]))
            relay.requests.clear()
            assert bookkeeper.run_cycle().committed_monikers == 1
            per_cycle.append([line for line in relay.requests if table_path in line])
        # The first cycle creates and loads the table; later ones only commit (an upsert
        # table's purge is a second snapshot: a second request).
        for requests in per_cycle[2:]:
            assert requests and all(line.startswith("POST ") for line in requests), per_cycle
        assert not [r for r in caplog.records if "Failed to delete" in r.getMessage()]
        kept = range(260) if mode == "changelog" else range(240, 260)  # upsert: the last batch
        assert sorted(row[2] for row in rows_of(bookkeeper, identifier)) == list(kept)
    finally:
        relay.close()


def test_a_deposed_bookkeeper_planning_on_its_last_commit_stops_and_commits_nothing(
    tmp_path: Path, rest_service
) -> None:
    """A bookkeeper plans its next commit on the table its last commit left: when a newer one
    committed since, that table is stale, its swap fails, and the fresh read shows the newer
    epoch: it stops (`StaleEpoch`) without committing, and the newer one commits what is left."""
    config = layout_config(tmp_path, rest_service)
    identifier = table_of(config)
    transport, writer = open_transport(config), S3Writer(config)
    first = Bookkeeper(config, epoch=1)
    transport.publish(writer.batch([(key, key) for key in range(10)]))
    assert first.run_cycle().committed_monikers == 1
    second = Bookkeeper(config, epoch=2)
    transport.publish(writer.batch([(key, 100 + key) for key in range(10)]))
    assert second.run_cycle().committed_monikers == 1
    transport.publish(writer.batch([(key, 200 + key) for key in range(10)]))
    with pytest.raises(StaleEpoch):
        first.run_cycle()
    assert committed_offsets(second, identifier) == list(range(20))
    assert second.run_cycle().committed_monikers == 1
    assert committed_offsets(second, identifier) == list(range(30))
    assert committed_state(second.catalog.load_table(identifier)).epoch == 2


def test_commits_with_expiry_give_the_table_pyiceberg_loads_reusing_snapshots(
    tmp_path: Path, rest_catalog
) -> None:
    """The bookkeeper parses the REST server's answers reusing the snapshots it already built
    (`SnapshotReuse`): through its own commits, with expiry, its table is the one a plain
    pyiceberg catalog loads, and loading it again reuses every snapshot object."""
    config = layout_config(tmp_path, rest_catalog, bookkeeper__keep_snapshots="3")
    identifier = table_of(config)
    transport, writer = open_transport(config), S3Writer(config)
    bookkeeper = Bookkeeper(config)
    plain = load_catalog("plain", **rest_catalog.pyiceberg_properties())
    expected = []
    for batch in range(8):
        if batch == 5:  # two hours on: snapshots beyond the 3 kept expire as it commits
            bookkeeper.committer.commit_path.now_ms = lambda: (
                int(time.time() * 1000) + 2 * 3_600_000
            )
        changes = [(key, batch * 100 + key) for key in range(5)]
        transport.publish(writer.batch(changes))
        expected += [(k, a, batch * 5 + i) for i, (k, a) in enumerate(changes)]
        assert bookkeeper.run_cycle().committed_monikers == 1
        ours = bookkeeper.catalog.load_table(identifier)
        assert ours.metadata == plain.load_table(identifier).metadata
    assert len(ours.snapshots()) == 3
    again = bookkeeper.catalog.load_table(identifier)
    assert [a is b for a, b in zip(again.snapshots(), ours.snapshots(), strict=True)] == [True] * 3
    assert rows_of(bookkeeper, identifier) == sorted(expected)

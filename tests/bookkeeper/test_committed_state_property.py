"""The committed state lives once per metadata file, in a table property; snapshots only name their
commit (issue 28: every kept snapshot is rewritten with every commit, 3,600 of them in an hour).

Each test drives the bookkeeper (and the writer's progress) through their own code: a snapshot's
summary stays the same size whatever the partitions; a restarted bookkeeper, another engine's
snapshot on top, a rollback and a table committed before the change all recover exactly (or, for
a rollback, refuse loudly rather than guess).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.catalog import default_table_location, open_catalog
from icekeeper.common.committed_state import (
    KEY_COMMIT_ID,
    KEY_STATE,
    PREFIX,
    SUMMARY_KEYS,
    CommittedState,
    StateNotInLineage,
    committed_state,
)
from icekeeper.common.config import IcekeeperConfig
from icekeeper.common.transports import open_transport
from icekeeper.status import collect_status
from icekeeper.writers.progress import TableProgress, refresh_progress
from tests.support.shop_items import (
    SCHEMA,
    bookkeeper_config,
    committed_chain,
    make_moniker,
    whole_topic_moniker,
)


def icekeeper_summary(config: IcekeeperConfig) -> dict[str, str]:
    table = open_catalog(config).load_table("shop.items")
    summary = table.current_snapshot().summary.additional_properties
    return {key: value for key, value in summary.items() if key.startswith(PREFIX)}


def test_a_snapshot_names_its_commit_and_does_not_grow_with_the_partitions(
    tmp_path: Path,
) -> None:
    summaries, states = {}, {}
    for partitions in (1, 64):
        config = bookkeeper_config(tmp_path / str(partitions))
        transport = open_transport(config)
        bookkeeper = Bookkeeper(config)
        for seq in (1, 2):
            transport.publish(whole_topic_moniker(config, seq, seq - 1 or None, partitions))
            assert bookkeeper.run_cycle().committed_monikers == 1
        summaries[partitions] = icekeeper_summary(config)
        states[partitions] = committed_state(open_catalog(config).load_table("shop.items"))
    for partitions, summary in summaries.items():
        # Only what identifies the commit: no offsets, event times, seqs or refusals.
        assert set(summary) <= set(SUMMARY_KEYS), partitions
        assert KEY_COMMIT_ID in summary
    sizes = {p: len(json.dumps(s, separators=(",", ":"))) for p, s in summaries.items()}
    assert sizes[64] == sizes[1], sizes
    assert sizes[64] < 300, sizes
    # The state is whole, in the table property.
    assert states[64].offsets == {("items", p): 1_000_000_020 for p in range(64)}
    assert len(states[64].partition_event_ms) == 64
    assert states[64].writer_seqs == {"w1": 2}


def test_a_restarted_bookkeeper_carries_on_from_the_property_exactly(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    first = Bookkeeper(config)
    for seq in (1, 2):
        transport.publish(make_moniker(config, seq, seq - 1 or None, ((seq - 1) * 10, seq * 10)))
        assert first.run_cycle().committed_monikers == 1
    # A restart: a new bookkeeper, seq 2 delivered again (its acknowledgement was lost), and seq 3.
    transport.publish(make_moniker(config, 2, 1, (10, 20)))
    transport.publish(make_moniker(config, 3, 2, (20, 30)))
    report = Bookkeeper(config).run_cycle()
    assert report.committed_monikers == 1
    table = open_catalog(config).load_table("shop.items")
    offsets = sorted(table.scan().to_arrow().column("_kfk_offset").to_pylist())
    assert offsets == list(range(30))
    state = committed_state(table)
    assert state.writer_seqs == {"w1": 3} and state.offsets == {("items", 0): 30}
    assert state.snapshot_id == table.current_snapshot().snapshot_id


def another_engines_append(config: IcekeeperConfig) -> None:
    """A snapshot made by something other than the bookkeeper (no icekeeper keys, no property
    change), as a user's or another engine's write is."""
    table = open_catalog(config).load_table("shop.items")
    rows = table.scan(limit=1).to_arrow()
    table.append(rows.select([f.name for f in table.schema().fields]))


def test_snapshots_of_other_engines_on_top_are_walked_past(tmp_path: Path) -> None:
    config = bookkeeper_config(tmp_path)
    transport, bookkeeper = committed_chain(config, 1)
    another_engines_append(config)
    another_engines_append(config)
    table = open_catalog(config).load_table("shop.items")
    assert PREFIX + "commit-id" not in table.current_snapshot().summary.additional_properties
    assert committed_state(table).offsets == {("items", 0): 10}
    transport.publish(make_moniker(config, 2, 1, (10, 20)))
    assert bookkeeper.run_cycle().committed_monikers == 1
    state = committed_state(open_catalog(config).load_table("shop.items"))
    assert state.writer_seqs == {"w1": 2} and state.offsets == {("items", 0): 20}


def test_a_rollback_is_refused_loudly_until_the_table_is_moved_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A user rolls the table back to an earlier icekeeper commit: the property holds the state of
    the newest commit, not of the snapshot the table is at. Neither the bookkeeper nor a writer
    plans on it; once the table is moved back, both carry on exactly."""
    config = bookkeeper_config(tmp_path)
    transport, bookkeeper = committed_chain(config, 2)
    table = open_catalog(config).load_table("shop.items")
    newest = table.current_snapshot().snapshot_id
    first = table.current_snapshot().parent_snapshot_id
    table.manage_snapshots().rollback_to_snapshot(first).commit()

    transport.publish(make_moniker(config, 3, 2, (20, 30)))
    with caplog.at_level(logging.ERROR):
        report = bookkeeper.run_cycle()
    assert report.committed_monikers == 0
    errors = " ".join(str(getattr(record, "error", "")) for record in caplog.records)
    assert "StateNotInLineage" in errors and "rolled back" in errors and str(newest) in errors
    table = open_catalog(config).load_table("shop.items")
    assert table.current_snapshot().snapshot_id == first and len(table.snapshots()) == 2
    assert len(transport.pending()) == 1  # nothing acknowledged
    with pytest.raises(StateNotInLineage, match="rolled back"):
        refresh_progress({}, transport.pending(), open_catalog(config), ["shop.items"], "w1")
    status = collect_status(config, kafka_timeout_s=0.5)
    assert any("rolled back" in problem for problem in status.problems), status.problems
    # Another engine's write on top of the rolled-back snapshot changes nothing: the walk back
    # from it still finds the first commit, not the one the property belongs to.
    another_engines_append(config)
    assert bookkeeper.run_cycle().committed_monikers == 0
    with pytest.raises(StateNotInLineage, match="rolled back"):
        committed_state(open_catalog(config).load_table("shop.items"))

    table = open_catalog(config).load_table("shop.items")
    table.manage_snapshots().set_current_snapshot(newest).commit()
    progress: dict[str, TableProgress] = {}
    refresh_progress(progress, [], open_catalog(config), ["shop.items"], "w1")
    assert progress["shop.items"].positions == {("items", 0): 20}
    assert bookkeeper.run_cycle().committed_monikers == 1
    table = open_catalog(config).load_table("shop.items")
    offsets = sorted(table.scan().to_arrow().column("_kfk_offset").to_pylist())
    assert offsets == list(range(30))
    assert committed_state(table).offsets == {("items", 0): 30}


def test_rolling_back_another_engines_snapshot_keeps_the_state(tmp_path: Path) -> None:
    """Rolled back to the newest icekeeper commit (undoing another engine's write): the property is
    that commit's state, and the bookkeeper carries on."""
    config = bookkeeper_config(tmp_path)
    transport, bookkeeper = committed_chain(config, 1)
    table = open_catalog(config).load_table("shop.items")
    committed = table.current_snapshot().snapshot_id
    another_engines_append(config)
    table = open_catalog(config).load_table("shop.items")
    table.manage_snapshots().rollback_to_snapshot(committed).commit()
    transport.publish(make_moniker(config, 2, 1, (10, 20)))
    assert bookkeeper.run_cycle().committed_monikers == 1
    table = open_catalog(config).load_table("shop.items")
    assert sorted(table.scan().to_arrow().column("_kfk_offset").to_pylist()) == list(range(20))


def legacy_commit(config: IcekeeperConfig, state: CommittedState, rows: list[int]) -> None:
    """A snapshot as icekeeper committed it before the state moved to the property: the whole
    state in its summary (`full_keys`, the keys and JSON values summaries then carried)."""
    table = open_catalog(config).load_table("shop.items")
    arrow = pa.Table.from_pylist(
        [{"id": o, "amount": o, "_kfk_partition": 0, "_kfk_offset": o} for o in rows],
        schema=table.schema().as_arrow(),
    )
    table.append(arrow, snapshot_properties=state.full_keys())


def test_a_table_committed_before_the_change_keeps_working(tmp_path: Path) -> None:
    """Old snapshots carry the whole state in their summary and the table has no property: the
    bookkeeper reads it from there, commits on it exactly, and from then on keeps the property;
    a rollback to such a snapshot is exact too (its summary is its state)."""
    config = bookkeeper_config(tmp_path)
    catalog = open_catalog(config)
    catalog.create_namespace("shop")
    catalog.create_table(
        "shop.items", schema=SCHEMA, location=default_table_location(config, "shop.items")
    )
    for seq in (1, 2):
        legacy_commit(
            config,
            CommittedState(
                writer_seqs={"w1": seq},
                offsets={("items", 0): seq * 10},
                partition_event_ms={("items", 0): 1_700_000_000_000 + seq * 10},
                commit_id=f"old-commit-{seq}",
                epoch=0,
            ),
            list(range((seq - 1) * 10, seq * 10)),
        )
    table = open_catalog(config).load_table("shop.items")
    assert KEY_STATE not in table.properties
    legacy = table.current_snapshot().snapshot_id
    transport = open_transport(config)
    bookkeeper = Bookkeeper(config)
    transport.publish(make_moniker(config, 2, 1, (10, 20)))  # delivered again: a duplicate
    transport.publish(make_moniker(config, 3, 2, (20, 30)))
    assert bookkeeper.run_cycle().committed_monikers == 1
    table = open_catalog(config).load_table("shop.items")
    assert sorted(table.scan().to_arrow().column("_kfk_offset").to_pylist()) == list(range(30))
    assert KEY_STATE in table.properties
    assert committed_state(table).writer_seqs == {"w1": 3}
    assert transport.pending() == []

    # Rolled back to the legacy snapshot: its own summary is its state, whatever the property.
    table.manage_snapshots().rollback_to_snapshot(legacy).commit()
    table = open_catalog(config).load_table("shop.items")
    assert committed_state(table).offsets == {("items", 0): 20}
    transport.publish(make_moniker(config, 4, 2, (20, 30)))
    assert bookkeeper.run_cycle().committed_monikers == 1
    table = open_catalog(config).load_table("shop.items")
    assert sorted(table.scan().to_arrow().column("_kfk_offset").to_pylist()) == list(range(30))


def test_a_rollback_to_before_icekeeper_is_refused_too(tmp_path: Path) -> None:
    """The table held rows of another engine before icekeeper's first commit; a user rolls it back
    to that snapshot. No icekeeper commit is among its ancestors, and the table's newest one (the
    property's) came after it: that state is not the table's, and planning on it would take
    every record icekeeper committed as still in the table. Refused, until moved back."""
    config = bookkeeper_config(tmp_path)
    catalog = open_catalog(config)
    catalog.create_namespace("shop")
    table = catalog.create_table(
        "shop.items", schema=SCHEMA, location=default_table_location(config, "shop.items")
    )
    table.append(
        pa.Table.from_pylist(
            [{"id": -1, "amount": -1, "_kfk_partition": 0, "_kfk_offset": -1}],
            schema=table.schema().as_arrow(),
        )
    )
    before = open_catalog(config).load_table("shop.items").current_snapshot().snapshot_id
    transport, bookkeeper = committed_chain(config, 2)
    table = open_catalog(config).load_table("shop.items")
    newest = table.current_snapshot().snapshot_id
    table.manage_snapshots().rollback_to_snapshot(before).commit()

    transport.publish(make_moniker(config, 3, 2, (20, 30)))
    assert bookkeeper.run_cycle().committed_monikers == 0
    with pytest.raises(StateNotInLineage, match="rolled back"):
        committed_state(open_catalog(config).load_table("shop.items"))
    with pytest.raises(StateNotInLineage):
        refresh_progress({}, transport.pending(), open_catalog(config), ["shop.items"], "w1")

    open_catalog(config).load_table("shop.items").manage_snapshots().set_current_snapshot(
        newest
    ).commit()
    assert bookkeeper.run_cycle().committed_monikers == 1
    table = open_catalog(config).load_table("shop.items")
    offsets = sorted(table.scan().to_arrow().column("_kfk_offset").to_pylist())
    assert offsets == [-1, *range(30)]


def previous_release_committed_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`committed_state` of the release before the state moved to the table property (main at
    e14c0b0), as that release's bookkeeper, writers and status call it."""
    try:
        source = subprocess.run(
            ["git", "show", "e14c0b0:common/committed_state.py"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"the previous release's source is not in this checkout: {error}")
    path = tmp_path / "previous_committed_state.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("previous_committed_state", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module.committed_state


def test_a_release_from_before_the_property_refuses_the_table_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Downgraded after this change, icekeeper reads the newest icekeeper summary as the whole
    state: one that only names its commit would read as nothing committed (every writer's chain
    unknown, no offsets: monikers delivered again committed twice, writers planning from their own
    checkpoints). Its reader fails instead, naming the property, so it commits nothing."""
    config = bookkeeper_config(tmp_path)
    transport, bookkeeper = committed_chain(config, 2)
    previous = previous_release_committed_state(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match=KEY_STATE):
        previous(open_catalog(config).load_table("shop.items"))


def test_a_missing_property_is_refused_and_named_not_read_as_nothing_committed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A user unsets the property (or a tool drops it): the bookkeeper commits nothing and says
    the property is missing, which the operator restores (not a rollback to undo)."""
    config = bookkeeper_config(tmp_path)
    transport, bookkeeper = committed_chain(config, 1)
    table = open_catalog(config).load_table("shop.items")
    kept = table.properties[KEY_STATE]
    with table.transaction() as transaction:
        transaction.remove_properties(KEY_STATE)
    transport.publish(make_moniker(config, 1, None, (0, 10)))  # delivered again
    with caplog.at_level(logging.ERROR):
        assert bookkeeper.run_cycle().committed_monikers == 0
    errors = " ".join(str(getattr(record, "error", "")) for record in caplog.records)
    assert f"{KEY_STATE} is missing" in errors, errors
    status = collect_status(config, kafka_timeout_s=0.5)
    assert any("is missing" in problem for problem in status.problems), status.problems

    table = open_catalog(config).load_table("shop.items")
    with table.transaction() as transaction:
        transaction.set_properties({KEY_STATE: kept})
    bookkeeper.run_cycle()
    table = open_catalog(config).load_table("shop.items")
    assert sorted(table.scan().to_arrow().column("_kfk_offset").to_pylist()) == list(range(10))
    assert transport.pending() == []

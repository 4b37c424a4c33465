"""The bookkeeper never lets an id the table gave out name a second column (issue 26 item 3), on a
real SQLite catalog and real Parquet files: a column dropped while another writer still wrote it
comes back as itself, and a schema change another engine committed meanwhile is checked again."""

from __future__ import annotations

from pathlib import Path

from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.transports import open_transport
from tests.support.shop_items import SCHEMA, bookkeeper_config, make_moniker

NOTE = NestedField(5, "note", StringType(), required=False)
LABEL = NestedField(6, "label", StringType(), required=False)


def schema(*fields: NestedField) -> Schema:
    return Schema(*SCHEMA.fields, *fields, identifier_field_ids=[1])


def notes(bookkeeper: Bookkeeper) -> dict[tuple[int, int], str | None]:
    rows = bookkeeper.catalog.load_table("shop.items").scan().to_arrow().to_pylist()
    return {(row["_kfk_partition"], row["_kfk_offset"]): row.get("note") for row in rows}


def test_a_column_dropped_while_another_writer_still_wrote_it_comes_back_as_itself(
    tmp_path: Path,
) -> None:
    """w2 read the table's schema while `note` (id 5, not the highest) was in it; w1's next batch,
    from after the source's DROP, made the bookkeeper drop it before w2's moniker arrived. w2's
    files hold `note` under id 5: the same column, taken back, not quarantined as stale."""
    config = bookkeeper_config(tmp_path, bookkeeper__allow_drop_columns="true")
    transport = open_transport(config)
    transport.publish(make_moniker(config, 1, None, (0, 10), schema=schema(NOTE, LABEL)))
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    late = make_moniker(
        config, 1, None, (0, 10), writer_id="w2", partition=1, schema=schema(NOTE, LABEL)
    )
    transport.publish(make_moniker(config, 2, 1, (10, 20), schema=schema(LABEL)))
    bookkeeper.run_cycle()
    table = bookkeeper.catalog.load_table("shop.items")
    assert "note" not in table.schema().column_names and table.metadata.last_column_id == 6

    transport.publish(late)
    report = bookkeeper.run_cycle()

    assert report.tables[0].quarantined == [] and report.committed_monikers == 1
    table = bookkeeper.catalog.load_table("shop.items")
    assert table.schema().find_field("note").field_id == 5 and table.metadata.last_column_id == 6
    assert notes(bookkeeper) == {
        **{(0, offset): f"n{offset}" for offset in range(10)},
        **{(0, offset): None for offset in range(10, 20)},  # written while it was dropped
        **{(1, offset): f"n{offset}" for offset in range(10)},
    }


def test_an_id_another_engine_gave_out_meanwhile_is_not_taken_for_a_new_column(
    tmp_path: Path,
) -> None:
    """Between the bookkeeper's plan and its commit another engine adds a column and drops it: the
    current schema id is as before (an equal schema's id is reused), the last-column-id is not,
    and the writer's new column has the id that engine gave out. The commit must not land so."""
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    Bookkeeper(config).run_cycle()
    transport.publish(make_moniker(config, 2, 1, (10, 20), schema=schema(NOTE)))
    ours, engine = Bookkeeper(config), Bookkeeper(config)
    original = ours.committer.commit_path.compare_and_swap
    raced: list[int] = []

    def after_another_engines_change(changes):
        if not raced:
            other = engine.catalog.load_table("shop.items")
            with other.update_schema() as update:
                update.add_column("scratch", LongType())
            with other.refresh().update_schema() as update:
                update.delete_column("scratch")
            raced.append(other.refresh().metadata.current_schema_id)
        return original(changes)

    ours.committer.commit_path.compare_and_swap = after_another_engines_change
    report = ours.run_cycle()

    assert raced == [0], "the other engine's change left the schema id as it was"
    [(_, reason)] = report.tables[0].quarantined
    assert "note: new field with id 5, which the table already gave out" in reason
    table = ours.catalog.load_table("shop.items")
    assert table.schema().column_names == SCHEMA.column_names
    assert table.metadata.last_column_id == 5


def test_a_new_schema_gets_a_schema_id_no_earlier_schema_has(tmp_path: Path) -> None:
    """Another engine added a column and dropped it (schemas 0 and 1, the current one 0 again):
    the bookkeeper's next schema is 2, not a second 1 that "set current" would resolve to the
    other engine's schema."""
    config = bookkeeper_config(tmp_path)
    transport = open_transport(config)
    transport.publish(make_moniker(config, 1, None, (0, 10)))
    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    other = bookkeeper.catalog.load_table("shop.items")
    with other.update_schema() as update:
        update.add_column("scratch", LongType())
    with other.refresh().update_schema() as update:
        update.delete_column("scratch")
    label = NestedField(6, "label", StringType(), required=False)  # after scratch's 5
    transport.publish(make_moniker(config, 2, 1, (10, 20), schema=schema(label)))

    report = bookkeeper.run_cycle()

    assert report.committed_monikers == 1
    table = bookkeeper.catalog.load_table("shop.items")
    assert [s.schema_id for s in table.schemas().values()] == [0, 1, 2]
    assert table.schema().schema_id == 2
    assert table.schema().column_names == [*SCHEMA.column_names, "label"]

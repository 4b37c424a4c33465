"""On a REST catalog the bookkeeper plans a table's next commit on the table its last commit's
answer carried. A change that adds no snapshot (another engine's partition-spec evolution) was
not caught by the snapshot's compare-and-swap, so a writer's moniker written for the new spec was
judged against the kept, stale spec and quarantined, although the table as it is now takes it
(found by a review). The commit now also asserts the schema and default spec it planned on."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.transforms import BucketTransform

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.moniker import Moniker
from icekeeper.common.transports import open_transport
from tests.support.catalog_layouts import S3Writer, layout_config, table_of

pytestmark = pytest.mark.integration


def with_partition(moniker: Moniker, spec_id: int, partition: dict) -> Moniker:
    files = [
        f.model_copy(update={"spec_id": spec_id, "partition": partition}) for f in moniker.files
    ]
    return moniker.model_copy(update={"files": files})


def test_a_moniker_for_a_spec_another_engine_evolved_is_committed(
    tmp_path: Path, rest_catalog
) -> None:
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    tables = (
        f"[{{identifier: {namespace}.items, topics: [items], primary_key: [id], mode: changelog, "
        f"partition_by: [_kfk_partition], "
        f"location: '{rest_catalog.warehouse()}/{namespace}/items'}}]"
    )
    config = layout_config(tmp_path, rest_catalog, tables=tables)
    identifier = table_of(config)
    transport, writer = open_transport(config), S3Writer(config)
    bookkeeper = Bookkeeper(config)

    transport.publish(with_partition(writer.batch([(1, 1), (2, 2)]), 0, {"_kfk_partition": 0}))
    report = bookkeeper.run_cycle()
    assert report.committed_monikers == 1, report

    # Another engine evolves the partitioning: no snapshot, so no compare-and-swap notices.
    other = load_catalog("other", **rest_catalog.pyiceberg_properties())
    table = other.load_table(identifier)
    with table.update_spec() as update:
        update.remove_field("_kfk_partition")
        update.add_field("id", BucketTransform(1), "id_bucket")
    table = other.load_table(identifier)
    new_spec = table.spec()
    assert [f.name for f in new_spec.fields] == ["id_bucket"], new_spec

    # The writer follows the table's current spec (writers/table_batch.py: `table.spec()`).
    transport.publish(
        with_partition(writer.batch([(3, 3), (4, 4)]), new_spec.spec_id, {"id_bucket": 0})
    )
    report = bookkeeper.run_cycle()
    quarantined = [(d.moniker.id, why) for t in report.tables for d, why in t.quarantined]
    assert quarantined == [], quarantined
    assert report.committed_monikers == 1, report

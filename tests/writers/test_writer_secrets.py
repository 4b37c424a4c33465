"""A writer whose credentials are referenced (`${env:...}`)
reads with them and writes none of them down."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.moniker import encode_moniker
from icekeeper.samples.produce import produce_synthetic
from icekeeper.samples.synthetic import SyntheticSpec
from icekeeper.writers.job import WriterJob
from tests.support.pipeline import pipeline_config
from tests.support.stack import TEST_STACK_PORTS

pytestmark = [pytest.mark.integration, pytest.mark.spark]
REGISTRY_PASSWORD = "registry-pw-c0ffee42"
KEY_PASSWORD = "kafka-key-pw-5eed77"


def test_a_writer_uses_referenced_secrets_and_no_moniker_or_snapshot_holds_them(
    local_stack, spark, tmp_path: Path, unique_topic: str
) -> None:
    config = pipeline_config(
        tmp_path,
        unique_topic,
        {
            "ICEKEEPER__TABLES__0__IDENTIFIER": "shop.orders",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id]",
            "ICEKEEPER__TABLES__0__MODE": "changelog",
            # The test registry does not check credentials; what matters is that the client gets the
            # resolved URL (an unresolved `${env:...}` is not a URL) and that no output keeps it.
            "ICEKEEPER__SOURCES__0__SCHEMA_REGISTRY_URL": f"http://icekeeper:${{env:IK_REGISTRY_PASSWORD}}@127.0.0.1:{TEST_STACK_PORTS['registry_port']}/apis/ccompat/v7",
            # A credential both Kafka clients know and a plaintext listener ignores.
            "ICEKEEPER__SOURCES__0__CONSUMER_PROPERTIES": "{ssl.key.password: "
            "'${env:IK_KAFKA_KEY_PASSWORD}'}",
            "IK_REGISTRY_PASSWORD": REGISTRY_PASSWORD,
            "IK_KAFKA_KEY_PASSWORD": KEY_PASSWORD,
        },
    )
    source = config.sources[0]
    assert (
        REGISTRY_PASSWORD in source.schema_registry_url
        and source.consumer_properties["ssl.key.password"] == KEY_PASSWORD
    )
    produce_synthetic(
        config,
        SyntheticSpec(seed=3, keys=50, events=400, schema_changes=0),
        topic=unique_topic,
        progress=lambda m: None,
    )

    job = WriterJob(config, spark=spark)
    job.run(until_idle=True)
    [moniker] = job.transport.pending()
    assert moniker.records == 400
    encoded = encode_moniker(moniker).decode()
    assert REGISTRY_PASSWORD not in encoded and KEY_PASSWORD not in encoded

    bookkeeper = Bookkeeper(config)
    bookkeeper.run_cycle()
    table = bookkeeper.catalog.load_table("shop.orders")
    assert table.scan().to_arrow().num_rows == 400
    snapshots = json.dumps([snapshot.model_dump(mode="json") for snapshot in table.snapshots()])
    assert "icekeeper." in snapshots  # the bookkeeper's own summary keys are there to look at
    assert REGISTRY_PASSWORD not in snapshots and KEY_PASSWORD not in snapshots
    assert REGISTRY_PASSWORD not in json.dumps(table.properties) and KEY_PASSWORD not in json.dumps(
        table.properties
    )

    # Nor anything else icekeeper left in its state folder: transaction log, checkpoints,
    # catalog database, table metadata, reports.
    for path in tmp_path.rglob("*"):
        if path.is_file():
            content = path.read_bytes()
            assert (
                REGISTRY_PASSWORD.encode() not in content and KEY_PASSWORD.encode() not in content
            ), path

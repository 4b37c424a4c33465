"""`icekeeper demo` names its own table: seed 000's, whatever the config's tables are; the
development commands fill in seed 000's source and table when a config has none."""

from __future__ import annotations

from pathlib import Path

from icekeeper.common.config import load_config
from icekeeper.demo import demo_config
from icekeeper.localstack.settings import stack_settings
from icekeeper.samples import seed000
from icekeeper.seed_defaults import SEED_SOURCE, SEED_TABLE, with_seed_defaults


def test_the_demo_shows_seed_000s_table_with_a_config_of_ones_own(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(
        f"""
state_dir: {tmp_path / "state"}
sources: [{{name: prod, bootstrap_servers: "broker:9092", topics: [orders]}}]
tables: [{{identifier: shop.orders, source: prod, topics: [orders]}}]
group: {{lease_uri: {tmp_path / "shared-leases"}}}
bookkeeper: {{http_port: 9464}}
stack: {{kafka_port: 19092}}
""",
        encoding="utf-8",
    )
    config = demo_config(load_config(path, environ={}))
    assert [table.identifier for table in config.tables] == [SEED_TABLE.identifier]
    table = config.tables[0]
    assert (table.source, table.topics, table.primary_key) == (
        "prod",
        [seed000.TOPIC],
        ["ID1", "ID2"],
    )
    assert table.upsert
    source = config.sources[0]
    assert (source.name, source.bootstrap_servers, source.topics) == (
        "prod",
        "broker:9092",
        [seed000.TOPIC],
    )
    assert config.state_dir == str(tmp_path / "state" / "demo")
    assert stack_settings(config).kafka_port == 19092
    # The demo's bookkeeper (a thread of the demo) never stands by for the group's real one, nor
    # takes its metrics port.
    assert config.group.lease_uri == str(tmp_path / "state" / "demo" / "bookkeeper-leases")
    assert config.bookkeeper.http_port == 0


def test_without_a_config_the_demo_has_the_same_table() -> None:
    config = demo_config(load_config(None, environ={}))
    assert config.tables == [SEED_TABLE]
    assert config.sources[0].topics == [seed000.TOPIC]


def test_development_commands_fill_in_seed_000s_source_and_table_and_nothing_else(
    tmp_path: Path,
) -> None:
    seeded = with_seed_defaults(load_config(None, environ={}))
    assert seeded.sources == [SEED_SOURCE] and seeded.tables == [SEED_TABLE]
    # A config with a source of its own: seed 000's table reads from it.
    path = tmp_path / "mine.yaml"
    path.write_text("sources: [{name: prod, topics: [orders]}]\n", encoding="utf-8")
    seeded = with_seed_defaults(load_config(path, environ={}))
    assert [source.name for source in seeded.sources] == ["prod"]
    assert [(table.identifier, table.source) for table in seeded.tables] == [
        (SEED_TABLE.identifier, "prod")
    ]
    # A config with tables is left as it is.
    path.write_text(
        "sources: [{name: prod, topics: [orders]}]\n"
        "tables: [{identifier: shop.orders, source: prod, topics: [orders]}]\n",
        encoding="utf-8",
    )
    mine = load_config(path, environ={})
    assert with_seed_defaults(mine) is mine

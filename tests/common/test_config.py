"""Config loading as a user meets it: files, seed-000 properties, env overrides, and errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from icekeeper.common.config import ConfigError, load_config
from icekeeper.common.config.docs import render_markdown
from icekeeper.common.config.model import AzureQueueTransport, parse_duration_s
from icekeeper.common.config.properties import parse_properties, split_top_level
from icekeeper.localstack.settings import SECTION, StackConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_embedded_defaults_give_a_local_sqlite_catalog_under_the_state_folder(
    tmp_path: Path,
) -> None:
    config = load_config(None, environ={"ICEKEEPER__STATE_DIR": str(tmp_path / "state")})
    assert config.state_dir == str(tmp_path / "state")
    assert config.catalog.properties["uri"] == f"sqlite:///{tmp_path}/state/catalog.db"
    assert config.catalog.properties["warehouse"] == f"file://{tmp_path}/state/warehouse"
    assert config.transport.kind == "txlog" and config.transport.uri == f"{tmp_path}/state/txlog"
    # No demo table in the production defaults: the development commands add seed 000's
    # (icekeeper/seed_defaults.py), a deployment lists its own.
    assert config.sources == [] and config.tables == []
    assert config.metadata_columns.kafka.columns == ["topic", "partition", "offset", "timestamp"]


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*")))
def test_every_example_loads(example: str) -> None:
    config = load_config(EXAMPLES / example, environ={})
    assert config.tables and config.sources


def test_seed_properties_keep_their_seed_meaning() -> None:
    config = load_config(EXAMPLES / "seed000.properties", environ={})
    source, table = config.sources[0], config.tables[0]
    assert source.topics == ["test.db_gb18030_test.tbl_test_1"]
    assert source.consumer_group == "iceberg-hadoop"
    assert source.format == "avro-confluent"
    assert source.max_rate_per_partition == 10000
    assert source.consumer_properties == {"max.poll.records": "5"}
    assert source.commit_timeout == 60.0  # 60000 ms
    # `hadoop.` named the Spark catalog in the seed job; the table identifier is what follows.
    assert table.identifier == "db_gb18030_test.tbl_test_1"
    assert table.primary_key == ["id1", "id2"]
    assert table.topics == source.topics
    assert table.properties == {
        "read.split.target-size": "268435456",
        "write.metadata.delete-after-commit.enabled": "true",
    }
    assert config.metadata_columns.source.prefix == "_src_"
    assert config.metadata_columns.transaction.columns == [
        "id",
        "total_order",
        "data_collection_order",
    ]
    assert config.reaper.enabled is True
    assert config.reaper.triggering_time == "21:00:11"
    assert config.reaper.execute_interval == 60.0  # 60000 ms
    assert config.reaper.snapshot_expire_time == 86400.0  # 86400000 ms
    assert config.reaper.compact_filter_column == "_src_ts_ms"
    assert config.reaper.manifests_file_length == 10485760
    assert config.writer.app_name == "Kafka2Iceberg"
    assert config.spark.master == "local[*]"
    assert config.spark.conf == {"spark.sql.sources.partitionOverwriteMode": "dynamic"}


def test_a_bad_seed_property_value_names_the_property_key(tmp_path: Path) -> None:
    path = write(tmp_path, "job.properties", "iceberg.maintenance.execute.interval = soon\n")
    with pytest.raises(ConfigError) as error:
        load_config(path, environ={})
    assert "iceberg.maintenance.execute.interval" in str(error.value) and str(path) in str(
        error.value
    )


def test_an_unknown_seed_property_is_an_error_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, "job.properties", "iceberg.table.nmae = db.t\n")
    with pytest.raises(ConfigError, match=r"iceberg\.table\.nmae.*unknown key"):
        load_config(path, environ={})


def test_a_wrong_type_names_the_key_and_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "c.yaml", "bookkeeper:\n  max_files_per_commit: many\n")
    with pytest.raises(ConfigError) as error:
        load_config(path, environ={})
    message = str(error.value)
    assert (
        str(path) in message
        and "bookkeeper.max_files_per_commit" in message
        and "'many'" in message
    )


def test_an_unknown_key_is_an_error_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, "c.yaml", "tables:\n  - identifier: a.b\n    primary_keys: [id]\n")
    with pytest.raises(ConfigError, match=r"tables\[0\]\.primary_keys: unknown key"):
        load_config(path, environ={})


def test_a_table_must_refer_to_a_known_source(tmp_path: Path) -> None:
    path = write(tmp_path, "c.yaml", "tables:\n  - identifier: a.b\n    source: nowhere\n")
    with pytest.raises(ConfigError, match="nowhere"):
        load_config(path, environ={})


def test_environment_overrides_any_key_including_inside_lists(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "c.yaml",
        "sources:\n  - name: s\n    topics: [t]\ntables:\n  - {identifier: a.b, source: s, "
        "topics: [t]}\n",
    )
    config = load_config(
        path,
        environ={
            "ICEKEEPER__SOURCES__0__BOOTSTRAP_SERVERS": "broker:9999",
            "ICEKEEPER__TABLES__0__PRIMARY_KEY": "[id, region]",
            "ICEKEEPER__BOOKKEEPER__COMMIT_INTERVAL": "250ms",
            "ICEKEEPER__CATALOG__PROPERTIES": "{type: rest, uri: 'http://catalog:8181'}",
        },
    )
    assert config.sources[0].bootstrap_servers == "broker:9999" and config.sources[0].topics == [
        "t"
    ]
    assert config.tables[0].primary_key == ["id", "region"]
    assert config.bookkeeper.commit_interval == 0.25
    assert config.catalog.properties == {"type": "rest", "uri": "http://catalog:8181"}


def test_environment_can_override_a_default_it_did_not_write() -> None:
    config = load_config(None, environ={"ICEKEEPER__SOURCES__0__CONSUMER_GROUP": "g2"})
    # A source the defaults do not have: made from the one field, the rest the source's defaults.
    assert [source.name for source in config.sources] == ["default"]
    assert config.sources[0].consumer_group == "g2"
    assert config.sources[0].bootstrap_servers == "127.0.0.1:9092"


def test_a_whole_list_from_the_environment_takes_field_overrides_of_its_items() -> None:
    # Variables apply in name order: `ICEKEEPER__TABLES` first, then its items' fields, whatever
    # order the environment lists them in (tests/support/seed_config.py builds on this).
    environ = {
        "ICEKEEPER__TABLES__0__MODE": "changelog",
        "ICEKEEPER__TABLES": "[{identifier: shop.orders, topics: [orders], primary_key: [id]}]",
        "ICEKEEPER__SOURCES__0__TOPICS": "[orders]",
    }
    table = load_config(None, environ=environ).tables[0]
    assert (table.identifier, table.primary_key, table.mode) == ("shop.orders", ["id"], "changelog")


def test_a_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="ICEKEEPER__REAPER__RETAIN_LAST"):
        load_config(None, environ={"ICEKEEPER__REAPER__RETAIN_LAST": "lots"})


def test_transport_kind_selects_the_azure_queue_model(tmp_path: Path) -> None:
    path = write(tmp_path, "c.yaml", "transport:\n  kind: azure-queue\n  queue_name: q1\n")
    config = load_config(path, environ={})
    assert isinstance(config.transport, AzureQueueTransport) and config.transport.queue_name == "q1"
    assert config.transport.journal_uri.startswith(config.state_dir)


def test_a_table_in_a_config_with_no_source_says_to_add_one(tmp_path: Path) -> None:
    path = write(tmp_path, "c.yaml", "tables: [{identifier: a.b, topics: [t]}]\n")
    with pytest.raises(ConfigError, match=r"tables\[0\]\.source: .*add one under `sources:`"):
        load_config(path, environ={})


def test_partition_terms_are_checked(tmp_path: Path) -> None:
    path = write(
        tmp_path, "c.yaml", "tables:\n  - identifier: a.b\n    partition_by: ['bucket(id)']\n"
    )
    with pytest.raises(ConfigError, match=r"tables\[0\]\.partition_by"):
        load_config(path, environ={})


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        (
            "{identifier: a.b, properties: {format-version: '3'}}",
            "format-version 3 is not supported",
        ),
        (
            "{identifier: a.b, primary_key: [id], properties: {format-version: '1'}}",
            "upsert table needs format-version 2",
        ),
    ],
)
def test_a_format_version_the_bookkeeper_cannot_commit_is_refused_at_load(
    tmp_path: Path, table: str, problem: str
) -> None:
    path = write(tmp_path, "c.yaml", f"tables:\n  - {table}\n")
    with pytest.raises(ConfigError, match=problem):
        load_config(path, environ={})
    changelog_v1 = write(
        tmp_path,
        "v1.yaml",
        "sources: [{topics: [t]}]\n"
        "tables:\n  - {identifier: a.b, properties: {format-version: '1'}}\n",
    )
    assert load_config(changelog_v1, environ={}).tables[0].properties["format-version"] == "1"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("10s", 10),
        ("5m", 300),
        ("2h", 7200),
        ("7d", 604800),
        (3, 3.0),
        ("1.5", 1.5),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration_s(text) == seconds


def test_properties_parser_handles_continuations_comments_and_separators() -> None:
    parsed = parse_properties(
        "# c\n! c\na = 1 \nb:2\nc 3\nd = x,\\\n    y\nkey\\:with\\=separators = v\nname = "
        "caf\\u00e9\n"
    )
    assert parsed == {
        "a": "1",
        "b": "2",
        "c": "3",
        "d": "x,y",
        "key:with=separators": "v",
        "name": "café",
    }
    assert split_top_level("bucket(16, id), day(ts)") == ["bucket(16, id)", "day(ts)"]


def test_configuration_reference_is_up_to_date() -> None:
    committed = (REPO_ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    expected = render_markdown({SECTION: StackConfig})
    assert committed == expected, "run: icekeeper config docs > docs/configuration.md"
    production = committed.split("# Development sections")[0]
    assert "`stack" not in production and "kafka_port" not in production


def test_environment_can_switch_the_transport_kind() -> None:
    config = load_config(
        None,
        environ={
            "ICEKEEPER__TRANSPORT__KIND": "azure-queue",
            "ICEKEEPER__TRANSPORT__QUEUE_NAME": "q9",
        },
    )
    assert isinstance(config.transport, AzureQueueTransport) and config.transport.queue_name == "q9"


def test_keys_of_the_previous_release_load_into_their_new_places_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(
        tmp_path,
        "old.yaml",
        """
writer: {spark_master: "spark://spark:7077", spark_conf: {spark.executor.memory: 2g}}
bookkeeper: {group: orders, lease_uri: /mnt/leases, max_pending_bytes: 1000}
reaper: {orphan_grace: 2h}
""",
    )
    with caplog.at_level("WARNING", logger="icekeeper.common.config.renames"):
        config = load_config(path, environ={})
    assert config.spark.master == "spark://spark:7077"
    assert config.spark.conf == {"spark.executor.memory": "2g"}
    assert (config.group.name, config.group.lease_uri) == ("orders", "/mnt/leases")
    assert config.group.orphan_grace == 7200.0
    assert config.writer.max_pending_bytes == 1000
    warned = "\n".join(record.getMessage() for record in caplog.records)
    for old, new in [
        ("writer.spark_master", "spark.master"),
        ("writer.spark_conf", "spark.conf"),
        ("bookkeeper.group", "group.name"),
        ("bookkeeper.lease_uri", "group.lease_uri"),
        ("bookkeeper.max_pending_bytes", "writer.max_pending_bytes"),
        ("reaper.orphan_grace", "group.orphan_grace"),
    ]:
        assert f"config key {old} is deprecated: it is now {new}" in warned


def test_an_old_environment_variable_still_overrides_its_moved_key() -> None:
    config = load_config(None, environ={"ICEKEEPER__WRITER__SPARK_MASTER": "local[2]"})
    assert config.spark.master == "local[2]"


def test_a_bad_value_under_an_old_key_names_the_key_as_written(tmp_path: Path) -> None:
    path = write(tmp_path, "old.yaml", "reaper: {orphan_grace: soon}\n")
    with pytest.raises(ConfigError) as error:
        load_config(path, environ={})
    assert "reaper.orphan_grace (group.orphan_grace): 'soon' is not a duration" in str(error.value)
    with pytest.raises(ConfigError) as error:
        load_config(None, environ={"ICEKEEPER__REAPER__ORPHAN_GRACE": "soon"})
    assert "ICEKEEPER__REAPER__ORPHAN_GRACE (group.orphan_grace)" in str(error.value)


def test_an_old_key_and_its_new_key_set_differently_is_an_error_naming_both(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "both.yaml", "reaper: {orphan_grace: 1h}\ngroup: {orphan_grace: 2h}\n")
    with pytest.raises(ConfigError) as error:
        load_config(path, environ={})
    assert "reaper.orphan_grace and group.orphan_grace are both set" in str(error.value)


def test_a_new_file_loads_without_deprecation_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, "new.yaml", "spark: {master: 'local[2]'}\ngroup: {name: orders}\n")
    with caplog.at_level("WARNING", logger="icekeeper.common.config.renames"):
        config = load_config(path, environ={})
    assert (config.spark.master, config.group.name) == ("local[2]", "orders")
    assert not caplog.records


@pytest.mark.parametrize("role", ["writers", "bookkeeper", "reaper", "common"])
def test_no_role_reads_another_roles_config_section(role: str) -> None:
    """A setting two roles need lives in a shared section (`spark`, `group`), never in one
    role's section that another role reaches into."""
    sections = {"writers": "writer", "bookkeeper": "bookkeeper", "reaper": "reaper"}
    others = "|".join(name for folder, name in sections.items() if folder != role)
    pattern = re.compile(rf"config\.({others})\.")
    reads = [
        f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
        for path in sorted((REPO_ROOT / role).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert reads == []

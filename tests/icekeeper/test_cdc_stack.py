"""A real CDC source in the local stack: MariaDB / PostgreSQL -> Debezium in Kafka Connect -> Kafka.

Rows written with plain SQL arrive in Kafka as Debezium change events, Avro in Confluent framing
whose schema ids the stack's registry resolves (or JSON, with and without schemas), with the
values and types users of those databases get from Debezium's defaults.
"""

from __future__ import annotations

import io
import json
import shutil
import socket
import struct
import time
import urllib.request
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import fastavro
import pytest

from icekeeper.common.config import IcekeeperConfig, load_config
from icekeeper.localstack import debian
from icekeeper.localstack.cdc import (
    ConnectClient,
    ConnectorFailed,
    MariaDbSource,
    PostgresSource,
    snapshot_completed,
)
from icekeeper.localstack.errors import StackError
from icekeeper.localstack.settings import stack_settings
from tests.support.stack import REPO_ROOT, TEST_STACK_PORTS, TEST_STACK_STATE_DIR, stack_environ
from tests.support.waiting import wait_until

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros(text: str) -> int:
    """Microseconds since the epoch of a wall-clock time
    (Debezium's DATETIME / TIMESTAMP WITHOUT TIME ZONE)."""
    moment = datetime.fromisoformat(text).replace(tzinfo=UTC)
    return (moment - EPOCH) // timedelta(microseconds=1)


def days(text: str) -> int:
    return (date.fromisoformat(text) - date(1970, 1, 1)).days


class ConfluentAvro:
    """Decodes magic byte 0 + 4-byte id + Avro body,
    resolving ids through the registry's Confluent API."""

    def __init__(self, registry_url: str) -> None:
        self.registry_url = registry_url
        self.schemas: dict[int, dict[str, Any]] = {}

    def decode(self, message: bytes | None) -> tuple[int, dict[str, Any]] | None:
        if message is None:
            return None
        assert message[0] == 0, f"not Confluent framing: magic byte {message[0]}"
        schema_id = struct.unpack(">I", message[1:5])[0]
        if schema_id not in self.schemas:
            with urllib.request.urlopen(
                f"{self.registry_url}/schemas/ids/{schema_id}", timeout=10
            ) as response:
                self.schemas[schema_id] = json.loads(json.load(response)["schema"])
        return schema_id, fastavro.schemaless_reader(
            io.BytesIO(message[5:]), fastavro.parse_schema(self.schemas[schema_id])
        )


def read_topic(
    config: IcekeeperConfig, topic: str, count: int, timeout_s: float = 60.0
) -> list[tuple[bytes | None, bytes | None]]:
    """The first `count` (key, value) messages of every
    partition of `topic`, in offset order per partition."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": config.sources[0].bootstrap_servers,
            "group.id": f"test-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        deadline = time.monotonic() + timeout_s
        partitions = wait_until(
            lambda: consumer.list_topics(topic, timeout=10).topics[topic].partitions,
            timeout_s,
            f"topic {topic}",
            interval_s=0.2,
        )
        # Assigned, not subscribed: no group rebalance to wait for.
        consumer.assign(
            [TopicPartition(topic, partition, OFFSET_BEGINNING) for partition in partitions]
        )
        messages: list[tuple[bytes | None, bytes | None]] = []
        while len(messages) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                messages.append((message.key(), message.value()))
        assert len(messages) >= count, (
            f"{topic}: {len(messages)} of {count} messages after {timeout_s:.0f}s"
        )
        return messages
    finally:
        consumer.close()


def field_types(value_schema: dict[str, Any]) -> dict[str, Any]:
    """Column name -> the non-null branch of its Avro
    type, from a Debezium envelope's `before` record."""
    before = next(field for field in value_schema["fields"] if field["name"] == "before")
    row = next(branch for branch in before["type"] if branch != "null")
    return {
        field["name"]: next(branch for branch in field["type"] if branch != "null")
        if isinstance(field["type"], list)
        else field["type"]
        for field in row["fields"]
    }


def changes_by_key(
    decoder: ConfluentAvro, messages: list[tuple[bytes | None, bytes | None]]
) -> tuple[dict[int, list[dict[str, Any]]], dict[str, Any]]:
    """Change events per primary key `id` (tombstones
    dropped), and the value schema they were written with."""
    by_key: dict[int, list[dict[str, Any]]] = {}
    value_schemas = set()
    for key, value in messages:
        decoded_value = decoder.decode(value)
        if decoded_value is None:
            continue  # Debezium's tombstone after a delete
        key_id, key_record = decoder.decode(key)
        value_id, event = decoded_value
        assert key_id != value_id
        value_schemas.add(value_id)
        by_key.setdefault(key_record["id"], []).append(event)
    assert len(value_schemas) == 1, value_schemas
    return by_key, decoder.schemas[value_schemas.pop()]


# --- unit tests: no services ---


def test_without_root_a_missing_package_is_named_with_the_command_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(debian, "find_programs", lambda package: None)
    monkeypatch.setattr(debian.os, "geteuid", lambda: 1000)
    with pytest.raises(StackError) as error:
        debian.ensure_package(
            debian.MARIADB_SERVER, "stack service mariadb", progress=lambda message: None
        )
    message = str(error.value)
    assert (
        "Debian package(s) mariadb-server" in message
        and "apt-get install -y mariadb-server" in message
    )
    assert "mariadbd" in message and "stack service mariadb" in message
    assert "apt-get install -y postgresql" in debian.missing_packages_message(
        [debian.POSTGRESQL], "stack service postgres"
    )


def test_a_snapshot_is_complete_once_its_offsets_carry_no_snapshot_marker() -> None:
    assert not snapshot_completed([])
    mariadb_during = [
        {
            "partition": {"server": "p"},
            "offset": {"file": "mariadb-bin.000001", "pos": 4, "snapshot": True},
        }
    ]
    mariadb_after = [
        {
            "partition": {"server": "p"},
            "offset": {"file": "mariadb-bin.000001", "pos": 2096, "gtids": "0-1-10"},
        }
    ]
    postgres_last = [
        {
            "partition": {"server": "p"},
            "offset": {
                "lsn": 1,
                "snapshot": "INITIAL",
                "last_snapshot_record": True,
                "snapshot_completed": True,
            },
        }
    ]
    postgres_during = [
        {
            "partition": {"server": "p"},
            "offset": {"lsn": 1, "snapshot": "INITIAL", "snapshot_completed": False},
        }
    ]
    assert not snapshot_completed(mariadb_during) and not snapshot_completed(postgres_during)
    assert snapshot_completed(mariadb_after) and snapshot_completed(postgres_last)


def test_connector_configs_carry_the_registry_and_converters(stack_config: IcekeeperConfig) -> None:
    stack = stack_settings(stack_config)
    config = MariaDbSource(stack).connector_config(
        "orders-cdc", "shop", ["orders", "order_lines"], "sales"
    )
    assert config["table.include.list"] == r"sales\.orders,sales\.order_lines"
    assert (
        config["database.server.id"] != "1"
        and config["schema.history.internal.kafka.topic"] == "shop.schema-history"
    )
    assert (
        config["value.converter"]
        == config["key.converter"]
        == "io.apicurio.registry.utils.converter.AvroConverter"
    )
    assert (
        config["value.converter.apicurio.registry.url"]
        == f"http://127.0.0.1:{stack.registry_port}/apis/registry/v2"
    )
    assert config["value.converter.apicurio.registry.as-confluent"] == "true"
    assert config["value.converter.apicurio.registry.use-id"] == "contentId"
    assert config["value.converter.apicurio.registry.headers.enabled"] == "false"
    assert (
        "decimal.handling.mode" not in config and "time.precision.mode" not in config
    )  # Debezium's defaults
    json_config = PostgresSource(stack).connector_config(
        "Orders-CDC",
        "shop",
        ["orders"],
        record_format="json-schemaless",
        extra={"snapshot.mode": "no_data"},
    )
    assert (
        json_config["value.converter.schemas.enable"] == "false"
        and json_config["snapshot.mode"] == "no_data"
    )
    assert json_config["slot.name"] == json_config["publication.name"] == "orders_cdc"


# --- integration tests: MariaDB, PostgreSQL, Kafka Connect, Kafka, registry ---

MARIADB_COLUMNS = """
    id INT PRIMARY KEY, d DATE, dt3 DATETIME(3), dt6 DATETIME(6), ts TIMESTAMP NULL, t TIME,
    amount DECIMAL(10,2), flag TINYINT(1), doc JSON, color ENUM('red','green'),
    tags SET('a','b','c'), bits BIT(8), payload BLOB, name VARCHAR(40)
"""


@pytest.mark.integration
def test_mariadb_rows_arrive_as_debezium_avro_in_confluent_framing(
    stack_config: IcekeeperConfig, mariadb_cdc: MariaDbSource, kafka_connect: ConnectClient
) -> None:
    tag = uuid.uuid4().hex[:8]
    table, prefix, name = f"types_{tag}", f"test-cdc-{tag}", f"mariadb-{tag}"
    insert = f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
    with mariadb_cdc.connect() as db, db.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {table} ({MARIADB_COLUMNS})")
        cursor.execute(
            insert,
            (
                1,
                "2024-02-29",
                "2024-02-29 12:34:56.789",
                "2024-02-29 12:34:56.123456",
                "2024-02-29 12:34:56",
                "-01:02:03",
                Decimal("12345678.91"),
                1,
                '{"a": [1, 2]}',
                "green",
                "a,c",
                b"\xa5",
                b"\x00\xff",
                "héllo 世界",
            ),
        )
        cursor.execute(
            insert,
            (2, None, None, None, None, None, None, None, None, None, None, None, None, "second"),
        )
        started = time.monotonic()
        kafka_connect.create(mariadb_cdc.connector_config(name, prefix, [table]))
        try:
            kafka_connect.wait_for_snapshot(name, timeout_s=90)
            snapshot_s = time.monotonic() - started
            cursor.execute(
                insert,
                (
                    3,
                    "1970-01-01",
                    None,
                    None,
                    None,
                    "838:59:59",
                    Decimal("-0.01"),
                    0,
                    "[]",
                    "red",
                    "",
                    b"\x00",
                    b"",
                    "third",
                ),
            )
            cursor.execute(f"UPDATE {table} SET name = 'renamed', amount = 0.5 WHERE id = 1")
            cursor.execute(f"DELETE FROM {table} WHERE id = 2")
            # 2 snapshot reads, an insert, an update, a delete and its tombstone.
            messages = read_topic(stack_config, mariadb_cdc.topic(prefix, table), count=6)
            print(
                f"mariadb: snapshot committed {snapshot_s:.1f}s after registering, all changes in "
                f"Kafka after {time.monotonic() - started:.1f}s"
            )
        finally:
            kafka_connect.delete(name)
    by_key, value_schema = changes_by_key(
        ConfluentAvro(stack_config.sources[0].schema_registry_url), messages
    )
    assert [event["op"] for event in by_key[1]] == ["r", "u"]
    assert [event["op"] for event in by_key[2]] == ["r", "d"]
    assert [event["op"] for event in by_key[3]] == ["c"]
    first = by_key[1][0]["after"]
    assert first == {
        "id": 1,
        "d": days("2024-02-29"),
        "dt3": micros("2024-02-29 12:34:56.789") // 1000,
        "dt6": micros("2024-02-29 12:34:56.123456"),
        "ts": "2024-02-29T12:34:56Z",
        "t": -3_723_000_000,
        "amount": Decimal("12345678.91"),
        "flag": 1,
        "doc": '{"a": [1, 2]}',
        "color": "green",
        "tags": "a,c",
        "bits": b"\xa5",
        "payload": b"\x00\xff",
        "name": "héllo 世界",
    }
    assert by_key[1][1]["before"] == first and by_key[1][1]["after"] == {
        **first,
        "name": "renamed",
        "amount": Decimal("0.50"),
    }
    assert by_key[2][1]["before"]["name"] == "second" and by_key[2][1]["after"] is None
    assert (
        by_key[3][0]["after"]["t"] == 3_020_399_000_000 and by_key[3][0]["after"]["d"] == 0
    )  # TIME beyond 24 h
    assert by_key[1][0]["source"]["snapshot"] in (
        "first",
        "true",
        "last",
        "first_in_data_collection",
        "last_in_data_collection",
    )
    assert (
        by_key[3][0]["source"]["snapshot"] == "false" and by_key[3][0]["source"]["table"] == table
    )
    types = field_types(value_schema)
    logical = {
        column: kind.get("connect.name") if isinstance(kind, dict) else kind
        for column, kind in types.items()
    }
    assert logical == {
        "id": "int",
        "d": "io.debezium.time.Date",
        "dt3": "io.debezium.time.Timestamp",
        "dt6": "io.debezium.time.MicroTimestamp",
        "ts": "io.debezium.time.ZonedTimestamp",
        "t": "io.debezium.time.MicroTime",
        "amount": "org.apache.kafka.connect.data.Decimal",
        # TINYINT(1) is a Connect int16 (Avro int); MariaDB's JSON is LONGTEXT, so a plain string
        # (MySQL's would be io.debezium.data.Json).
        "flag": None,
        "doc": "string",
        "color": "io.debezium.data.Enum",
        "tags": "io.debezium.data.EnumSet",
        "bits": "io.debezium.data.Bits",
        "payload": "bytes",
        "name": "string",
    }
    assert types["amount"]["logicalType"] == "decimal" and (
        types["amount"]["precision"],
        types["amount"]["scale"],
    ) == (10, 2)
    assert types["flag"] == {"type": "int", "connect.type": "int16"}


POSTGRES_COLUMNS = """
    id INT PRIMARY KEY, d DATE, ts3 TIMESTAMP(3), ts6 TIMESTAMP, tstz TIMESTAMPTZ, t TIME,
    amount NUMERIC(10,2), n NUMERIC, flag BOOLEAN, doc JSONB, u UUID, iv INTERVAL, payload BYTEA,
    name VARCHAR(40)
"""


@pytest.mark.integration
def test_postgres_rows_arrive_as_debezium_avro_in_confluent_framing(
    stack_config: IcekeeperConfig, postgres_cdc: PostgresSource, kafka_connect: ConnectClient
) -> None:
    tag = uuid.uuid4().hex[:8]
    table, prefix, name = f"types_{tag}", f"test-cdc-{tag}", f"postgres-{tag}"
    insert = f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
    with postgres_cdc.connect() as db:
        db.execute(f"CREATE TABLE {table} ({POSTGRES_COLUMNS})")
        db.execute(
            insert,
            (
                1,
                date(2024, 2, 29),
                datetime(2024, 2, 29, 12, 34, 56, 789000),
                datetime(2024, 2, 29, 12, 34, 56, 123456),
                datetime(2024, 2, 29, 12, 34, 56, tzinfo=UTC),
                "13:14:15",
                Decimal("12345678.91"),
                Decimal("3.14159"),
                True,
                '{"a": [1, 2]}',
                "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
                "1 day 02:00:00.5",
                b"\x00\xff",
                "héllo 世界",
            ),
        )
        db.execute(insert, (2, *([None] * 12), "second"))
        started = time.monotonic()
        kafka_connect.create(postgres_cdc.connector_config(name, prefix, [table]))
        try:
            kafka_connect.wait_for_snapshot(name, timeout_s=90)
            snapshot_s = time.monotonic() - started
            db.execute(insert, (3, *([None] * 12), "third"))
            db.execute(f"UPDATE {table} SET name = 'renamed', amount = 0.5 WHERE id = 1")
            db.execute(f"DELETE FROM {table} WHERE id = 2")
            messages = read_topic(stack_config, postgres_cdc.topic(prefix, table), count=6)
            print(
                f"postgres: snapshot committed {snapshot_s:.1f}s after registering, all changes in "
                f"Kafka after {time.monotonic() - started:.1f}s"
            )
        finally:
            kafka_connect.delete(name)  # drops the replication slot (slot.drop.on.stop)
            postgres_cdc.drop_publication(name)
    by_key, value_schema = changes_by_key(
        ConfluentAvro(stack_config.sources[0].schema_registry_url), messages
    )
    assert [event["op"] for event in by_key[1]] == ["r", "u"]
    assert [event["op"] for event in by_key[2]] == ["r", "d"]
    assert [event["op"] for event in by_key[3]] == ["c"]
    first = by_key[1][0]["after"]
    assert first == {
        "id": 1,
        "d": days("2024-02-29"),
        "ts3": micros("2024-02-29 12:34:56.789") // 1000,
        "ts6": micros("2024-02-29 12:34:56.123456"),
        "tstz": "2024-02-29T12:34:56.000000Z",
        "t": (13 * 3600 + 14 * 60 + 15) * 1_000_000,
        "amount": Decimal("12345678.91"),
        # NUMERIC without a scale: Debezium's VariableScaleDecimal, the unscaled value as
        # big-endian two's complement.
        "n": {"scale": 5, "value": (314159).to_bytes(3, "big", signed=True)},
        "flag": True,
        "doc": '{"a": [1, 2]}',
        "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "iv": (26 * 3600 + 0.5) * 1_000_000,
        "payload": b"\x00\xff",
        "name": "héllo 世界",
    }
    # REPLICA IDENTITY DEFAULT, as users have it unless they change it: no before image on update,
    # only the key on delete.
    assert by_key[1][1]["before"] is None and by_key[1][1]["after"] == {
        **first,
        "name": "renamed",
        "amount": Decimal("0.50"),
    }
    assert (
        by_key[2][1]["before"] == {**{column: None for column in first}, "id": 2}
        and by_key[2][1]["after"] is None
    )
    logical = {
        column: kind.get("connect.name") if isinstance(kind, dict) else kind
        for column, kind in field_types(value_schema).items()
    }
    assert logical == {
        "id": "int",
        "d": "io.debezium.time.Date",
        "ts3": "io.debezium.time.Timestamp",
        "ts6": "io.debezium.time.MicroTimestamp",
        "tstz": "io.debezium.time.ZonedTimestamp",
        "t": "io.debezium.time.MicroTime",
        "amount": "org.apache.kafka.connect.data.Decimal",
        "n": "io.debezium.data.VariableScaleDecimal",
        "flag": "boolean",
        "doc": "io.debezium.data.Json",
        "u": "io.debezium.data.Uuid",
        "iv": "io.debezium.time.MicroDuration",
        "payload": "bytes",
        "name": "string",
    }


@pytest.mark.integration
def test_json_records_with_and_without_the_schema_envelope(
    stack_config: IcekeeperConfig, mariadb_cdc: MariaDbSource, kafka_connect: ConnectClient
) -> None:
    tag = uuid.uuid4().hex[:8]
    table = f"json_{tag}"
    with mariadb_cdc.connect() as db, db.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {table} (id INT PRIMARY KEY, amount DECIMAL(6,2), at DATETIME(6))"
        )
        cursor.execute(f"INSERT INTO {table} VALUES (1, 12.5, '2024-02-29 12:34:56.123456')")
    connectors = {
        fmt: (f"{fmt}-{tag}", f"test-cdc-{fmt}-{tag}") for fmt in ("json", "json-schemaless")
    }
    try:
        for fmt, (name, prefix) in connectors.items():
            kafka_connect.create(
                mariadb_cdc.connector_config(name, prefix, [table], record_format=fmt)
            )
        values = {}
        for fmt, (name, prefix) in connectors.items():
            kafka_connect.wait_for_snapshot(name, timeout_s=90)
            [(key, value)] = read_topic(stack_config, mariadb_cdc.topic(prefix, table), count=1)
            values[fmt] = (json.loads(key), json.loads(value))
    finally:
        for name, _ in connectors.values():
            kafka_connect.delete(name)
    key, enveloped = values["json"]
    assert key["payload"] == {"id": 1} and key["schema"]["type"] == "struct"
    assert (
        enveloped["schema"]["name"].endswith(f"{table}.Envelope")
        and enveloped["payload"]["op"] == "r"
    )
    # Decimal in JSON: base64 of the unscaled two's complement (decimal.handling.mode=precise).
    assert enveloped["payload"]["after"] == {
        "id": 1,
        "amount": "BOI=",
        "at": micros("2024-02-29 12:34:56.123456"),
    }
    key, bare = values["json-schemaless"]
    assert (
        key == {"id": 1}
        and set(bare) >= {"before", "after", "source", "op"}
        and "schema" not in bare
    )
    assert bare["after"] == enveloped["payload"]["after"]


@pytest.mark.integration
def test_a_failed_task_surfaces_its_trace(
    postgres_cdc: PostgresSource, kafka_connect: ConnectClient
) -> None:
    tag = uuid.uuid4().hex[:8]
    table, name = f"failing_{tag}", f"failing-{tag}"
    with postgres_cdc.connect() as db:
        db.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY)")
    # With autocreation off and no publication, the task fails as it starts.
    kafka_connect.create(
        postgres_cdc.connector_config(
            name, f"test-cdc-{tag}", [table], extra={"publication.autocreate.mode": "disabled"}
        )
    )
    try:
        with pytest.raises(
            ConnectorFailed, match="(?s)task 0: .*Publication autocreation is disabled"
        ):
            kafka_connect.wait_until_running(name, timeout_s=60)
    finally:
        assert kafka_connect.delete(name)
    assert not kafka_connect.delete(name)


@pytest.mark.integration
def test_stack_status_shows_the_services_up_with_started(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stack_config: IcekeeperConfig,
    mariadb_cdc: MariaDbSource,
    postgres_cdc: PostgresSource,
) -> None:
    from icekeeper.cli import main

    for key, value in stack_environ(TEST_STACK_STATE_DIR, TEST_STACK_PORTS).items():
        monkeypatch.setenv(key, value)
    assert main(["stack", "status"]) == 0
    lines = {
        line.split()[0]: line.split()
        for line in capsys.readouterr().out.splitlines()
        if line.strip()
    }
    for name, port in (
        ("mariadb", stack_settings(stack_config).mariadb_port),
        ("postgres", stack_settings(stack_config).postgres_port),
        ("connect", stack_settings(stack_config).connect_port),
    ):
        assert lines[name][1] == "running" and str(port) in lines[name][2]


@pytest.mark.integration
def test_a_second_mariadb_and_postgres_start_and_down_leaves_no_process() -> None:
    from icekeeper.localstack.stack import LocalStack

    # Not under pytest's tmp_path: the servers run as mysql
    # / postgres, who cannot enter /tmp/pytest-of-root.
    state_dir = REPO_ROOT / ".icekeeper" / f"test-cdc-down-{uuid.uuid4().hex[:8]}"
    ports = {name: port + 10_200 for name, port in TEST_STACK_PORTS.items()}
    stack = LocalStack(
        load_config(None, environ=stack_environ(state_dir, ports)),
        only=["mariadb", "postgres"],
        with_services=["mariadb", "postgres"],
    )
    try:
        started = time.monotonic()
        report = stack.up(progress=lambda message: None)
        print(f"mariadb and postgres from nothing in {time.monotonic() - started:.1f}s")
        assert sorted(report.started) == ["mariadb", "postgres"]
        pids = [status.pid for status in stack.status()]
        assert all(pids)
        assert sorted(stack.down(progress=lambda message: None)) == ["mariadb", "postgres"]
        assert not any(_process_alive(pid) for pid in pids)
        assert all(status.state == "stopped" for status in stack.status())
        assert not _port_open(ports["mariadb_port"]) and not _port_open(ports["postgres_port"])
    finally:
        stack.down(progress=lambda message: None)
        shutil.rmtree(state_dir, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0

"""Drive the stack's CDC sources: write rows into MariaDB or PostgreSQL, have Debezium stream them.

What tests and `icekeeper demo --source ...` need from `stack up --with mariadb|postgres`:

- `MariaDbSource` / `PostgresSource`: a DB-API connection to the stack's database, and the
  Debezium connector config that streams some of its tables (pure: a dict of strings).
- `ConnectClient`: Kafka Connect's REST API: register (`POST /connectors`), delete, read the
  status and offsets, and wait until a connector runs or its initial snapshot is in Kafka; a
  FAILED connector or task raises `ConnectorFailed` carrying Connect's stack trace.

Connector configs keep Debezium's defaults for how values look (`decimal.handling.mode=precise`,
`time.precision.mode=adaptive_time_microseconds`, ...), so tests see what users see; callers add
or override properties with `extra`. Records are Avro in Confluent framing (magic byte 0, a 4-byte
content id the registry's `/apis/ccompat/v7/schemas/ids/{id}` resolves) through Apicurio's
converter, or Kafka's JsonConverter with or without its schema envelope.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from icekeeper.localstack.databases import DATABASE, DEBEZIUM, OWNER, DatabaseUser
from icekeeper.localstack.settings import StackConfig

if TYPE_CHECKING:
    import psycopg
    import pymysql

RecordFormat = Literal["avro", "json", "json-schemaless"]
"""How the connector writes keys and values: `avro` (Confluent framing via the registry), `json`
(JsonConverter's `{"schema", "payload"}` envelope) or `json-schemaless` (the payload alone)."""

MARIADB_CONNECTOR_CLASS = "io.debezium.connector.mariadb.MariaDbConnector"
POSTGRES_CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
AVRO_CONVERTER_CLASS = "io.apicurio.registry.utils.converter.AvroConverter"
JSON_CONVERTER_CLASS = "org.apache.kafka.connect.json.JsonConverter"


class ConnectError(RuntimeError):
    """Kafka Connect refused a request or did not answer; the message carries its reply."""


class ConnectorFailed(ConnectError):
    """A connector or one of its tasks is FAILED; the message carries Connect's trace."""


def converter_properties(stack: StackConfig, record_format: RecordFormat) -> dict[str, str]:
    """Key and value converter settings of a connector for `record_format`.

    Avro goes through Apicurio's converter in Confluent mode: records carry magic byte 0 and the
    4-byte content id of the schema it registers (in the stack's registry, v2 API).
    """
    properties: dict[str, str] = {}
    for side in ("key", "value"):
        if record_format == "avro":
            prefix = f"{side}.converter.apicurio.registry"
            properties.update(
                {
                    f"{side}.converter": AVRO_CONVERTER_CLASS,
                    f"{prefix}.url": f"http://{stack.host}:{stack.registry_port}/apis/registry/v2",
                    f"{prefix}.auto-register": "true",
                    f"{prefix}.as-confluent": "true",
                    f"{prefix}.use-id": "contentId",
                    f"{prefix}.headers.enabled": "false",
                }
            )
        elif record_format in ("json", "json-schemaless"):
            properties.update(
                {
                    f"{side}.converter": JSON_CONVERTER_CLASS,
                    f"{side}.converter.schemas.enable": "true"
                    if record_format == "json"
                    else "false",
                }
            )
        else:
            raise ValueError(
                f"unknown record format {record_format!r}: use avro, json or json-schemaless"
            )
    return properties


def _include_list(namespace: str, tables: list[str]) -> str:
    # Debezium's include lists are regular expressions matched against the whole `namespace.table`.
    if not tables:
        raise ValueError("name at least one table to stream")
    return ",".join(f"{re.escape(namespace)}\\.{re.escape(table)}" for table in tables)


def _common_properties(name: str, topic_prefix: str, transaction_metadata: bool) -> dict[str, str]:
    if not re.fullmatch(r"[A-Za-z0-9._-]+", topic_prefix):
        raise ValueError(f"topic prefix {topic_prefix!r}: use letters, digits, '.', '_' and '-'")
    return {
        "name": name,
        "tasks.max": "1",
        "topic.prefix": topic_prefix,
        "snapshot.mode": "initial",
        "provide.transaction.metadata": "true" if transaction_metadata else "false",
    }


@dataclass(frozen=True)
class MariaDbSource:
    """The stack's MariaDB (`stack up --with mariadb`) as a Debezium source."""

    stack: StackConfig

    def connect(
        self,
        database: str | None = DATABASE,
        *,
        user: DatabaseUser = OWNER,
        autocommit: bool = True,
    ) -> pymysql.connections.Connection:
        """A DB-API connection (PyMySQL), by default as the owner of the `icekeeper` database.

        Args:
            database: default database of the session (None: none).
            user: `OWNER` (all privileges) or `DEBEZIUM` (what the connector has).
            autocommit: commit every statement, so each is one binlog transaction.
        """
        import pymysql

        return pymysql.connect(
            host=self.stack.host,
            port=self.stack.mariadb_port,
            user=user.name,
            password=user.password,
            database=database,
            autocommit=autocommit,
            charset="utf8mb4",
            connect_timeout=10,
        )

    def topic(self, topic_prefix: str, table: str, database: str = DATABASE) -> str:
        """Topic Debezium writes a table's changes to."""
        return f"{topic_prefix}.{database}.{table}"

    def connector_config(
        self,
        name: str,
        topic_prefix: str,
        tables: list[str],
        database: str = DATABASE,
        *,
        record_format: RecordFormat = "avro",
        transaction_metadata: bool = False,
        extra: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """Config of a Debezium MariaDB connector streaming `database.<table>` for each of `tables`.

        Args:
            name: connector name (unique in the worker; also seeds the replica's server id).
            topic_prefix: topics are `<topic_prefix>.<database>.<table>`; schema changes go to
                `<topic_prefix>`.
            tables: table names in `database`.
            record_format: see `RecordFormat`.
            transaction_metadata: `provide.transaction.metadata` (a `transaction` block and a
                `<topic_prefix>.transaction` topic).
            extra: more connector properties; they win over the ones set here.

        Returns:
            The properties to POST, `name` included.
        """
        properties = {
            **_common_properties(name, topic_prefix, transaction_metadata),
            "connector.class": MARIADB_CONNECTOR_CLASS,
            "database.hostname": self.stack.host,
            "database.port": str(self.stack.mariadb_port),
            "database.user": DEBEZIUM.name,
            "database.password": DEBEZIUM.password,
            # The connector joins the server as a replica: its id must differ from the server's (1)
            # and other replicas'.
            "database.server.id": str(10_000 + zlib.crc32(name.encode()) % 1_000_000),
            "database.include.list": re.escape(database),
            "table.include.list": _include_list(database, tables),
            "schema.history.internal.kafka.bootstrap.servers": (
                f"{self.stack.host}:{self.stack.kafka_port}"
            ),
            "schema.history.internal.kafka.topic": f"{topic_prefix}.schema-history",
            **converter_properties(self.stack, record_format),
        }
        properties.update(extra or {})
        return properties


@dataclass(frozen=True)
class PostgresSource:
    """The stack's PostgreSQL (`stack up --with postgres`)
    as a Debezium source, through pgoutput."""

    stack: StackConfig

    def connect(
        self, dbname: str = DATABASE, *, user: DatabaseUser = OWNER, autocommit: bool = True
    ) -> psycopg.Connection:
        """A DB-API connection (psycopg 3), by default as the owner of the `icekeeper` database
        (and its tables)."""
        import psycopg

        return psycopg.connect(
            host=self.stack.host,
            port=self.stack.postgres_port,
            user=user.name,
            password=user.password,
            dbname=dbname,
            autocommit=autocommit,
            connect_timeout=10,
        )

    def topic(self, topic_prefix: str, table: str, schema: str = "public") -> str:
        """Topic Debezium writes a table's changes to."""
        return f"{topic_prefix}.{schema}.{table}"

    @staticmethod
    def slot_name(name: str) -> str:
        """Replication slot (and publication) of connector
        `name`: lower case, digits and `_`, at most 63."""
        return re.sub(r"[^a-z0-9_]", "_", name.lower())[:63]

    def drop_publication(self, name: str) -> None:
        """Drop the publication connector `name` created (deleting a connector leaves it; its slot
        goes with the connector)."""
        with self.connect(user=DEBEZIUM) as connection:  # the publication's owner
            connection.execute(f'DROP PUBLICATION IF EXISTS "{self.slot_name(name)}"')

    def drop_inactive_slots(self) -> list[str]:
        """Drop replication slots no connector streams from; returns their names.

        `slot.drop.on.stop` drops a slot when its connector stops cleanly; a worker that was killed
        leaves it behind, pinning WAL and using up `max_replication_slots` of the stack's server.
        """
        with self.connect(user=DEBEZIUM) as connection:  # REPLICATION may drop slots
            rows = connection.execute(
                "SELECT slot_name, pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE NOT active AND database = %s",
                (DATABASE,),
            ).fetchall()
        return [row[0] for row in rows]

    def connector_config(
        self,
        name: str,
        topic_prefix: str,
        tables: list[str],
        schema: str = "public",
        *,
        record_format: RecordFormat = "avro",
        transaction_metadata: bool = False,
        extra: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """Config of a Debezium PostgreSQL connector streaming
        `schema.<table>` of the `icekeeper` database.

        Each connector gets its own replication slot and publication (`slot_name(name)`), created
        for just its tables (`publication.autocreate.mode=filtered`: the `debezium` user is a member
        of the tables' owner, which PostgreSQL requires; `all_tables` would need a superuser). The
        slot is dropped when the connector stops (`slot.drop.on.stop`, meant for development), so
        deleted connectors do not pin WAL in the stack's server.

        Args and returns: as `MariaDbSource.connector_config`, with `schema` instead of a database.
        """
        slot = self.slot_name(name)
        properties = {
            **_common_properties(name, topic_prefix, transaction_metadata),
            "connector.class": POSTGRES_CONNECTOR_CLASS,
            "database.hostname": self.stack.host,
            "database.port": str(self.stack.postgres_port),
            "database.user": DEBEZIUM.name,
            "database.password": DEBEZIUM.password,
            "database.dbname": DATABASE,
            "plugin.name": "pgoutput",
            "slot.name": slot,
            "slot.drop.on.stop": "true",
            "publication.name": slot,
            "publication.autocreate.mode": "filtered",
            "schema.include.list": re.escape(schema),
            "table.include.list": _include_list(schema, tables),
            **converter_properties(self.stack, record_format),
        }
        properties.update(extra or {})
        return properties


def snapshot_completed(offsets: list[dict[str, Any]]) -> bool:
    """True when a connector's committed source offsets say its initial snapshot is over.

    Debezium marks offsets taken during a snapshot with `snapshot` (MariaDB: true; PostgreSQL:
    `"INITIAL"`, with `snapshot_completed` once the last snapshot record is in); offsets of streamed
    changes have no such key. No offsets yet means nothing was committed: a snapshot of empty
    tables commits none until the first change, so wait on those with `wait_until_running`.
    """
    if not offsets:
        return False
    for entry in offsets:
        offset = entry.get("offset") or {}
        if offset.get("snapshot") not in (None, False, "false") and not offset.get(
            "snapshot_completed"
        ):
            return False
    return True


class ConnectClient:
    """Kafka Connect's REST API (the stack's worker by default)."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    @classmethod
    def for_stack(cls, stack: StackConfig) -> ConnectClient:
        return cls(f"http://{stack.host}:{stack.connect_port}")

    def _request(
        self,
        method: str,
        path: str,
        body: object | None = None,
        ok: tuple[int, ...] = (200, 201, 202, 204),
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                status, text = response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read().decode(errors="replace")
        except OSError as error:
            raise ConnectError(
                f"{method} {self.url}{path}: Kafka Connect does not answer ({error}); is it "
                "running (icekeeper stack up --with ...)?"
            ) from error
        if status not in ok:
            raise ConnectError(f"{method} {self.url}{path}: HTTP {status}: {text[:2000]}")
        return status, json.loads(text) if text.strip() else None

    def create(self, config: Mapping[str, str]) -> dict[str, Any]:
        """Register a connector (`POST /connectors`);
        `config["name"]` names it. Returns Connect's answer."""
        name = config.get("name")
        if not name:
            raise ValueError("the connector config needs a name")
        _, answer = self._request(
            "POST", "/connectors", {"name": name, "config": dict(config)}, ok=(201,)
        )
        return answer

    def delete(self, name: str) -> bool:
        """Delete a connector (its offsets stay in the worker's file); False if there was none."""
        status, _ = self._request("DELETE", f"/connectors/{name}", ok=(200, 202, 204, 404))
        return status != 404

    def connectors(self) -> list[str]:
        return self._request("GET", "/connectors")[1]

    def status(self, name: str) -> dict[str, Any]:
        """`GET /connectors/<name>/status`: the connector's
        and its tasks' states (and traces when FAILED)."""
        return self._request("GET", f"/connectors/{name}/status")[1]

    def offsets(self, name: str) -> list[dict[str, Any]]:
        """Committed source offsets (`GET /connectors/<name>/offsets`):
        `[{"partition": ..., "offset": ...}]`."""
        return self._request("GET", f"/connectors/{name}/offsets")[1]["offsets"]

    def _running(self, name: str) -> bool:
        """True when the connector and at least one task
        run; raises ConnectorFailed on a FAILED one."""
        code, status = self._request("GET", f"/connectors/{name}/status", ok=(200, 404))
        if code == 404:
            return False  # accepted, not yet started
        states = [("connector", status["connector"])] + [
            (f"task {task['id']}", task) for task in status.get("tasks", [])
        ]
        failed = [(what, state) for what, state in states if state.get("state") == "FAILED"]
        if failed:
            details = "\n".join(
                f"{what}: {state.get('trace', '(no trace)')}" for what, state in failed
            )
            raise ConnectorFailed(f"connector {name} failed:\n{details}")
        return (
            status["connector"].get("state") == "RUNNING"
            and bool(status.get("tasks"))
            and all(task.get("state") == "RUNNING" for task in status["tasks"])
        )

    def wait_until_running(
        self, name: str, timeout_s: float = 60.0, poll_s: float = 0.25
    ) -> dict[str, Any]:
        """Wait until the connector and all its tasks are RUNNING; returns the status.

        Raises:
            ConnectorFailed: the connector or a task is FAILED (with Connect's trace).
            TimeoutError: not running within `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        while not self._running(name):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"connector {name} not RUNNING after {timeout_s:.0f}s: {self.status(name)}"
                )
            time.sleep(poll_s)
        return self.status(name)

    def wait_for_snapshot(
        self, name: str, timeout_s: float = 120.0, poll_s: float = 0.25
    ) -> list[dict[str, Any]]:
        """Wait until the connector's initial snapshot is committed (its records are in Kafka);
        returns the offsets.

        Only for snapshots that emit records: see `snapshot_completed`. A failed connector or task
        raises ConnectorFailed at once instead of waiting out the timeout.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if self._running(name):
                offsets = self.offsets(name)
                if snapshot_completed(offsets):
                    return offsets
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"connector {name}: snapshot not committed after {timeout_s:.0f}s; status "
                    f"{self.status(name)}"
                )
            time.sleep(poll_s)

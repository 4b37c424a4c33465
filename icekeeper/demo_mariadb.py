"""`icekeeper demo --source mariadb`: the main job against a real database, compared with it.

Starts the demo's local stack with MariaDB and Kafka Connect (`stack up --with mariadb`),
creates `icekeeper.orders` in MariaDB with a few typed columns and rows, registers Debezium's
MariaDB connector (Avro in Confluent framing through the registry), and then runs statements
(inserts, updates, a delete, an ALTER TABLE ADD COLUMN) while a writer and the bookkeeper run
in this process, until every change the statements made is committed to `shop.orders`.

Then it shows MariaDB's `SELECT *` beside the table's latest live row per key (the table is a
changelog: `icekeeper.mirror`), the column types on both sides, and the same comparison through
Spark SQL and DuckDB, and ends with a verdict. The figures reconcile: the records Debezium
wrote, as the statements' affected rows predict, are the changelog's rows plus the deletes'
tombstones (and dead letters, none expected).
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from icekeeper.bookkeeper.service import Bookkeeper
from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.demo import Progress, demo_config, fresh_stack
from icekeeper.localstack.cdc import ConnectClient, MariaDbSource
from icekeeper.localstack.databases import DATABASE, OWNER
from icekeeper.localstack.settings import stack_settings
from icekeeper.mirror import (
    Difference,
    differences,
    engine_rows,
    iceberg_types,
    latest_live_rows,
    ordered_keys,
    source_value,
)
from icekeeper.readers import duckdb_rows, render_grid, spark_rows

if TYPE_CHECKING:
    from icekeeper.writers.job import WriterJob

TABLE = "orders"
IDENTIFIER = "shop.orders"
KEY = ["id"]
TOPIC_PREFIX = "demo"
CONNECTOR = "icekeeper-demo"
WAIT_S = 300.0
"""How long the pipeline may take to commit a round's
changes (2 busy cores: Spark batches take seconds)."""

CREATE_TABLE = f"""CREATE TABLE {TABLE} (
  id INT NOT NULL PRIMARY KEY,
  customer VARCHAR(40) CHARACTER SET utf8mb4 NOT NULL,
  amount DECIMAL(10,2) NOT NULL,
  placed_at DATETIME(3) NOT NULL,
  updated_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
  pickup TIME NULL,
  attrs JSON NULL)"""
SNAPSHOT_STATEMENTS = [
    CREATE_TABLE,
    f"""INSERT INTO {TABLE} (id, customer, amount, placed_at, pickup, attrs) VALUES
  (1, '张伟', 128.50, '2024-05-01 09:30:00.125', '09:45:00', '{{"items": 2, "express": true}}'),
  (2, '李娜', 42.00, '2024-05-01 10:02:13.500', NULL, '{{"items": 1}}'),
  (3, '王芳', 310.99, '2024-05-02 18:20:45.001', '18:00:00', '{{"items": 5, "gift": "wrap"}}'),
  (4, '刘洋', 7.25, '2024-05-03 07:00:00.000', '-01:30:00', NULL),
  (5, '陈静', 15.75, '2024-05-03 12:15:30.999', '12:15:30', '[]')""",
]
"""Run before the connector exists: its initial snapshot reads these rows (`_src_op` 'r')."""
STREAMED_ROUNDS = [
    [
        f"INSERT INTO {TABLE} (id, customer, amount, placed_at, pickup, attrs) VALUES (6, '赵磊', "
        "999.99, '2024-05-04 20:00:00.250', '20:30:00', '{\"items\": 9}')",
        f"INSERT INTO {TABLE} (id, customer, amount, placed_at) VALUES (7, '孙丽', 0.01, "
        "'2024-05-04 21:11:11.111')",
        f"UPDATE {TABLE} SET amount = amount + 10 WHERE id = 2",
        f"UPDATE {TABLE} SET customer = '王芳（已核实）', pickup = '19:30:00' WHERE id = 3",
        f"DELETE FROM {TABLE} WHERE id = 4",
    ],
    [
        f"ALTER TABLE {TABLE} ADD COLUMN note VARCHAR(100) NULL",
        f"UPDATE {TABLE} SET note = 'leave at the door' WHERE id IN (1, 6)",
        f"INSERT INTO {TABLE} (id, customer, amount, placed_at, pickup, attrs, note) VALUES (8, "
        "'周杰', 56.20, '2024-05-05 08:08:08.080', '08:30:00', '{\"items\": 3}', 'new after "
        "ALTER')",
        f"UPDATE {TABLE} SET amount = 0, note = 'refunded' WHERE id = 7",
    ],
]
"""Run while the writer and the bookkeeper run; each round is committed before the next starts."""
OP_MEANINGS = {"r": "snapshot reads", "c": "inserts", "u": "updates", "d": "deletes"}
"""Debezium's `op` values, in the order a row's life goes."""
SHOWN_LAST = ["customer"]
"""Shown as the last column: the grid pads by characters, and Chinese ones are two columns wide."""


@dataclass
class PipelineFigures:
    """What the in-process writer and bookkeeper did, summed over their batches and cycles."""

    records_read: int = 0
    rows_committed: int = 0
    tombstones_skipped: int = 0
    dead_lettered: int = 0
    snapshots: list[int] = field(default_factory=list)

    @property
    def records_accounted(self) -> int:
        """Records that are in the table, or were skipped or dead-lettered on purpose."""
        return self.rows_committed + self.tombstones_skipped + self.dead_lettered


def mariadb_demo_config(config: IcekeeperConfig) -> IcekeeperConfig:
    """The demo's config (`demo_config`) with its first source and only table set to Debezium's
    topic of `orders`."""
    config = demo_config(config)
    topic = MariaDbSource(stack_settings(config)).topic(TOPIC_PREFIX, TABLE)
    dumped = config.model_dump(mode="python")
    dumped["sources"] = [{**dumped["sources"][0], "topics": [topic], "topic_pattern": None}]
    dumped["tables"] = [
        {
            **dumped["tables"][0],
            "identifier": IDENTIFIER,
            "source": dumped["sources"][0]["name"],
            "topics": [topic],
            "source_db": None,
            "source_table": None,
            "primary_key": KEY,
            # A changelog: the demo shows every change beside the source, and the latest
            # live row per key worked out from it (`icekeeper demo` shows an upsert mirror).
            "mode": "changelog",
        }
    ]
    return IcekeeperConfig.model_validate(dumped).with_development(config.development)


def expected_records(statement: str, affected_rows: int) -> int:
    """Kafka records Debezium writes for a statement that changed `affected_rows` rows.

    One per row, plus a tombstone per deleted row (`tombstones.on.delete`, Debezium's default);
    DDL writes none to the table's topic (schema changes go to the prefix topic).
    """
    verb = statement.split(None, 1)[0].upper()
    if verb in ("INSERT", "UPDATE"):
        return affected_rows
    if verb == "DELETE":
        return 2 * affected_rows
    return 0


def run_mariadb_demo(
    config: IcekeeperConfig, keep_stack: bool = False, progress: Progress = print
) -> dict[str, Any]:
    """Run the demo against MariaDB; returns the figures
    `icekeeper demo --source mariadb --json` prints.

    Raises:
        StackError: the stack cannot start (MariaDB's Debian package missing and not root, a port
            taken, ...).
    """
    started = time.monotonic()
    config = mariadb_demo_config(config)
    stack = fresh_stack(config, with_services=["mariadb"], progress=progress)
    source = MariaDbSource(stack.stack)
    connect = ConnectClient.for_stack(stack.stack)
    db = spark = None
    connector_created = False
    try:
        db = source.connect()
        with db.cursor() as cursor:
            cursor.execute(
                "SET time_zone = '+00:00'"
            )  # TIMESTAMP values in and out in UTC, as the table holds them
        statements = 0
        expected = 0
        for statement in SNAPSHOT_STATEMENTS:
            expected += expected_records(statement, _execute(db, statement, progress))
            statements += 1
        connect.create(source.connector_config(CONNECTOR, TOPIC_PREFIX, [TABLE]))
        connector_created = True
        progress(
            f"registered Debezium's MariaDB connector {CONNECTOR}: {DATABASE}.{TABLE} -> topic "
            f"{config.sources[0].topics[0]} (Avro via the registry)"
        )
        from icekeeper.common.spark import spark_session
        from icekeeper.writers.job import WriterJob

        progress("starting Spark (local) for the writer")
        spark = spark_session(config, "icekeeper-demo", master="local[2]")
        connect.wait_for_snapshot(CONNECTOR, timeout_s=WAIT_S)
        progress(f"connector {CONNECTOR}: initial snapshot of {DATABASE}.{TABLE} is in Kafka")
        writer, bookkeeper, figures = (
            WriterJob(config, spark=spark),
            Bookkeeper(config),
            PipelineFigures(),
        )
        _sync_until(writer, bookkeeper, figures, expected, progress)
        for round_statements in STREAMED_ROUNDS:
            for statement in round_statements:
                expected += expected_records(statement, _execute(db, statement, progress))
                statements += 1
            _sync_until(writer, bookkeeper, figures, expected, progress)

        table = bookkeeper.catalog.load_table(IDENTIFIER)
        types = iceberg_types(table)
        source_rows, source_types = _select_star(db)
        expected_rows = {
            tuple(row[k] for k in KEY): {
                name: source_value(value, types.get(name, "")) for name, value in row.items()
            }
            for row in source_rows
        }
        engines = engine_rows(
            table, lambda columns: spark_rows(spark, config, IDENTIFIER, columns), duckdb_rows
        )
        mirrors = {engine: latest_live_rows(rows, KEY) for engine, rows in engines.items()}
        found = {engine: differences(expected_rows, mirror) for engine, mirror in mirrors.items()}
        columns = list(source_types)
        _print_side_by_side(
            expected_rows, mirrors["pyiceberg"], engines["pyiceberg"], columns, found["pyiceberg"]
        )
        _print_types(source_types, types)
        _print_engines(config, engines, mirrors, found)
        equal = not any(found.values())
        print(_verdict(len(expected_rows), found))
        return {
            "source": "mariadb",
            "statements": statements,
            "expected_records": expected,
            "records": figures.records_read,
            "rows": len(engines["pyiceberg"]),
            "rows_committed": figures.rows_committed,
            "tombstones_skipped": figures.tombstones_skipped,
            "dead_lettered": figures.dead_lettered,
            "snapshots": len(figures.snapshots),
            "mariadb_rows": len(expected_rows),
            "live_keys": len(mirrors["pyiceberg"]),
            "spark_rows": len(engines["spark"]),
            "duckdb_rows": len(engines["duckdb"]),
            "equal": equal,
            "differences": _difference_lines(found),
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        if db is not None:
            db.close()
        if spark is not None:
            spark.stop()
        if keep_stack:
            progress(
                f"stack kept: MariaDB at {stack.stack.host}:{stack.stack.mariadb_port} (user "
                f"{OWNER.name}, password {OWNER.password}), connector {CONNECTOR} at "
                f"{connect.url}; stop with: ICEKEEPER__STATE_DIR={config.state_dir} icekeeper "
                "stack down --with mariadb"
            )
        else:
            if connector_created:
                try:
                    connect.delete(CONNECTOR)
                    progress(f"deleted connector {CONNECTOR}")
                except Exception as error:  # noqa: BLE001 - the stack goes down next anyway
                    progress(f"could not delete connector {CONNECTOR}: {error}")
            stack.down(progress)


def _execute(db, statement: str, progress: Progress) -> int:  # noqa: ANN001 - pymysql connection
    """Run one statement (autocommit: one binlog transaction); returns the rows it changed."""
    progress(f"mariadb> {' '.join(statement.split())}")
    with db.cursor() as cursor:
        return cursor.execute(statement)


def _sync_until(
    writer: WriterJob,
    bookkeeper: Bookkeeper,
    figures: PipelineFigures,
    expected: int,
    progress: Progress,
) -> None:
    """Run writer batches and bookkeeper cycles until
    `expected` records are accounted for (or WAIT_S passes)."""
    deadline = time.monotonic() + WAIT_S
    while figures.records_accounted < expected:
        if time.monotonic() > deadline:
            progress(
                f"gave up waiting after {WAIT_S:.0f}s: {figures.records_accounted} of {expected} "
                "records committed; comparing what is there"
            )
            return
        for batch in writer.run(until_idle=True):
            figures.records_read += batch.records_read
            figures.tombstones_skipped += batch.tombstones_skipped
            figures.dead_lettered += batch.dead_lettered
            progress(
                f"writer: batch {batch.seq}: {batch.records_read} records -> {batch.rows_written} "
                f"rows in {batch.files} files"
                + (
                    f", {batch.tombstones_skipped} tombstones skipped"
                    if batch.tombstones_skipped
                    else ""
                )
            )
        for _ in range(5):
            cycle = bookkeeper.run_cycle()
            for table in cycle.tables:
                if table.snapshot_id:
                    figures.rows_committed += table.records
                    figures.snapshots.append(table.snapshot_id)
                    progress(
                        f"bookkeeper: committed {table.records} rows of {table.table} as snapshot "
                        f"{table.snapshot_id}"
                    )
            if not cycle.pending:
                break
        if figures.records_accounted < expected:
            time.sleep(0.5)  # Debezium is still writing the statements' records


def _select_star(db) -> tuple[list[dict[str, Any]], dict[str, str]]:  # noqa: ANN001 - pymysql connection
    """MariaDB's rows of the demo table (ordered by
    key) and each column's type as MariaDB names it."""
    import pymysql.cursors

    with db.cursor(pymysql.cursors.DictCursor) as cursor:
        cursor.execute(f"SELECT * FROM {TABLE} ORDER BY {', '.join(KEY)}")
        rows = list(cursor.fetchall())
        cursor.execute(
            "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
            "%s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
            (DATABASE, TABLE),
        )
        types = {row["COLUMN_NAME"]: row["COLUMN_TYPE"] for row in cursor.fetchall()}
    return rows, types


def _shown(value: Any) -> Any:
    """A value as the grid shows it: the same text for equal
    values on both sides, short where that loses nothing."""
    if isinstance(value, dt.datetime):
        spec = (
            "seconds"
            if not value.microsecond
            else "milliseconds"
            if not value.microsecond % 1000
            else "microseconds"
        )
        text = value.isoformat(sep=" ", timespec=spec)
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    if isinstance(value, Decimal):
        return str(value)
    return value


def _print_side_by_side(
    expected_rows: dict[tuple, dict[str, Any]],
    mirror: dict[tuple, dict[str, Any]],
    changelog: list[dict[str, Any]],
    columns: list[str],
    found: list[Difference],
) -> None:
    ops = Counter(row["_src_op"] for row in changelog)
    op_text = ", ".join(
        f"{ops[op]} {op} ({meaning})" for op, meaning in OP_MEANINGS.items() if ops[op]
    )
    print(
        f"\n# MariaDB {DATABASE}.{TABLE} (SELECT *, {len(expected_rows)} rows) beside Iceberg "
        f"{IDENTIFIER}, read with pyiceberg"
    )
    print(
        f"# {IDENTIFIER} is a changelog of {len(changelog)} rows by _src_op: {op_text}; shown is "
        f"its latest row per {', '.join(KEY)} by Kafka partition and offset, leaving out keys "
        "whose last _src_op is 'd'"
    )
    data_columns = [c for c in columns if c not in KEY and c not in SHOWN_LAST] + [
        c for c in SHOWN_LAST if c in columns
    ]
    grid_rows = []
    for identity in ordered_keys(set(expected_rows) | set(mirror)):
        key_cells = dict(zip(KEY, identity))
        differing = [d.column for d in found if d.key == identity and d.column]
        if identity in expected_rows:
            check = "" if identity in mirror else "not in Iceberg"
            grid_rows.append(
                {
                    **key_cells,
                    "side": "MariaDB",
                    "check": check,
                    **{c: _shown(expected_rows[identity].get(c)) for c in data_columns},
                }
            )
        if identity in mirror:
            row = mirror[identity]
            check = (
                "differs: " + ", ".join(differing)
                if differing
                else "same"
                if identity in expected_rows
                else "not in MariaDB"
            )
            grid_rows.append(
                {
                    **key_cells,
                    "side": "Iceberg",
                    "check": check,
                    "_src_op": row["_src_op"],
                    "_kfk_partition": row["_kfk_partition"],
                    "_kfk_offset": row["_kfk_offset"],
                    **{c: _shown(row.get(c)) for c in data_columns},
                }
            )
    for row in grid_rows:
        if row["side"] == "MariaDB":
            row.update({"_src_op": "", "_kfk_partition": "", "_kfk_offset": ""})
    print(
        render_grid(
            grid_rows,
            [*KEY, "side", "check", "_src_op", "_kfk_partition", "_kfk_offset", *data_columns],
            max_width=26,
        )
    )
    live = set(mirror)
    gone = {}
    for row in sorted(changelog, key=lambda r: (r["_kfk_partition"], r["_kfk_offset"])):
        identity = tuple(row[k] for k in KEY)
        if identity not in live:
            gone[identity] = row
    for identity, row in gone.items():
        print(
            f"# {', '.join(KEY)} {', '.join(map(str, identity))}: left out, its last change is a "
            f"delete (_src_op '{row['_src_op']}' at partition {row['_kfk_partition']}, offset "
            f"{row['_kfk_offset']})"
        )


def _print_types(source_types: dict[str, str], types: dict[str, str]) -> None:
    print(f"\n# column types: MariaDB {DATABASE}.{TABLE} -> Iceberg {IDENTIFIER} (docs/types.md)")
    rows = [
        {"column": name, "MariaDB": source_type, "Iceberg": types.get(name, "(missing)")}
        for name, source_type in source_types.items()
    ]
    print(render_grid(rows, ["column", "MariaDB", "Iceberg"]))
    metadata = [name for name in types if name not in source_types]
    print(f"# plus {len(metadata)} metadata columns: {', '.join(metadata)}")


def _print_engines(
    config: IcekeeperConfig,
    engines: dict[str, list[dict[str, Any]]],
    mirrors: dict[str, dict[tuple, dict[str, Any]]],
    found: dict[str, list[Difference]],
) -> None:
    names = {
        "pyiceberg": "pyiceberg",
        "spark": f"Spark SQL (iceberg-spark-runtime) on catalog {config.catalog.name}",
        "duckdb": "DuckDB iceberg_scan",
    }
    print()
    for engine in ("pyiceberg", "spark", "duckdb"):
        outcome = (
            "equal to MariaDB"
            if not found[engine]
            else f"{len(found[engine])} differences from MariaDB"
        )
        print(
            f"# {names[engine]}: {len(engines[engine])} changelog rows -> {len(mirrors[engine])} "
            f"live keys, {outcome}"
        )


def _difference_lines(found: dict[str, list[Difference]]) -> list[str]:
    """Each difference once, whichever engines saw it."""
    return list(
        dict.fromkeys(
            str(difference)
            for differences_seen in found.values()
            for difference in differences_seen
        )
    )


def _verdict(source_rows: int, found: dict[str, list[Difference]]) -> str:
    if not any(found.values()):
        return (
            f"\nverdict: EQUAL: MariaDB's {source_rows} rows are the latest live rows of "
            f"{IDENTIFIER}, every key and every column, through pyiceberg, Spark SQL and DuckDB"
        )
    engines = ", ".join(engine for engine, lines in found.items() if lines)
    lines = _difference_lines(found)
    shown = "; ".join(lines[:10]) + (f"; and {len(lines) - 10} more" if len(lines) > 10 else "")
    return f"\nverdict: DIFFERENT (via {engines}): {shown}"

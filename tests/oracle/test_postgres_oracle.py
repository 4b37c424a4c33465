"""Oracle test: a real PostgreSQL, streamed by Debezium's pgoutput connector (Avro through the
registry), equals its Iceberg tables.

The same checks as the MariaDB oracle, on PostgreSQL's own types: NUMERIC with and without a
scale, TIMESTAMP and TIMESTAMPTZ, TIME, BOOLEAN, JSONB, BYTEA, UUID, INTERVAL and INT[], with
PostgreSQL's default replica identity (updates carry no before image, deletes only the key).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from icekeeper.localstack.databases import DATABASE
from tests.support.oracle import Pipeline, oracle_config, time_text

# Heavy (`make test-heavy`): a PostgreSQL and a pgoutput connector cost the default run over a
# minute of its 35; the MariaDB oracle stays in it.
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.heavy]

ORDERS_DDL = """CREATE TABLE {name} (
  region CHAR(2) NOT NULL, id INT NOT NULL, qty INT, status VARCHAR(20), amount NUMERIC(12,2),
  n NUMERIC, d DATE, ts6 TIMESTAMP(6), tstz TIMESTAMPTZ, t TIME, flag BOOLEAN,
  score DOUBLE PRECISION, doc JSONB, note TEXT, data BYTEA, u UUID, iv INTERVAL, tags INT[],
  PRIMARY KEY (region, id))"""
CUSTOMERS_DDL = (
    "CREATE TABLE {name} (id INT PRIMARY KEY, qty VARCHAR(20), status INT, name TEXT, email TEXT)"
)
ORDER_COLUMNS = (
    "region",
    "id",
    "qty",
    "status",
    "amount",
    "n",
    "d",
    "ts6",
    "tstz",
    "t",
    "flag",
    "score",
    "doc",
    "note",
    "data",
    "u",
    "iv",
    "tags",
)
UTC = dt.UTC

EDGE_ORDERS = [
    (
        "EU",
        1,
        0,
        "new",
        Decimal("-9999999999.99"),
        Decimal("-1234.5670"),
        dt.date(1000, 1, 1),
        dt.datetime(1000, 1, 1, 0, 0, 0, 123456),
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        dt.time(0, 0),
        True,
        1e308,
        '{"k": ["中文", "😀"], "n": null}',
        "中文 😀",
        b"",
        uuid.UUID("5f0c6f5e-3b54-4a8e-9a55-0d7bb1f0a0c1"),
        dt.timedelta(days=3, hours=4, seconds=5),
        [1, None, 3],
    ),
    (
        "US",
        2,
        -2147483648,
        "paid",
        Decimal("9999999999.99"),
        Decimal("1" + "0" * 30),
        dt.date(9999, 12, 31),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
        dt.datetime(2038, 1, 19, 3, 14, 7, 999999, tzinfo=UTC),
        dt.time(23, 59, 59, 999999),
        False,
        -2.2250738585072014e-308,
        "[]",
        None,
        bytes(range(256)),
        None,
        dt.timedelta(0),
        [],
    ),
    (
        "AP",
        3,
        2147483647,
        None,
        Decimal("0.01"),
        Decimal("0.00001"),
        dt.date(1969, 7, 20),
        None,
        None,
        None,
        None,
        0.0,
        None,
        "",
        None,
        None,
        None,
        None,
    ),
]


def random_order(rng: random.Random, region: str, key: int) -> tuple:
    moment = dt.datetime(2020, 1, 1) + dt.timedelta(
        seconds=rng.randint(0, 10**8), microseconds=rng.randint(0, 999_999)
    )
    return (
        region,
        key,
        rng.randint(-1000, 1000),
        rng.choice(["new", "paid", None]),
        Decimal(rng.randint(-(10**6), 10**6)) / 100,
        Decimal(rng.randint(-(10**9), 10**9)) / 10 ** rng.randint(0, 6),
        dt.date(1990, 1, 1) + dt.timedelta(days=rng.randint(0, 20000)),
        moment,
        moment.replace(tzinfo=UTC),
        dt.time(
            rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59), rng.choice([0, 1, 500000])
        ),
        rng.choice([True, False, None]),
        rng.uniform(-1e6, 1e6),
        f'{{"n": {rng.randint(0, 99)}}}',
        rng.choice(["x", "中文", None]),
        rng.randbytes(rng.randint(0, 20)),
        uuid.UUID(int=rng.getrandbits(128)),
        dt.timedelta(seconds=rng.randint(0, 10**6)),
        [rng.randint(0, 9) for _ in range(rng.randint(0, 3))],
    )


def as_table_holds(name: str, value: Any) -> Any:
    """A PostgreSQL value in the form the Iceberg table holds it (docs/types.md)."""
    if value is None:
        return None
    if name == "t":
        return time_text(
            dt.timedelta(
                hours=value.hour,
                minutes=value.minute,
                seconds=value.second,
                microseconds=value.microsecond,
            )
        )
    if name == "n":
        return str(value)  # NUMERIC without a scale: the exact digits
    if name == "u":
        return str(value)
    if name == "iv":
        return value // dt.timedelta(microseconds=1)  # io.debezium.time.MicroDuration
    if name == "tstz":
        return value.astimezone(UTC)
    if name == "tags":
        return json.dumps(value, separators=(",", ":"))  # arrays as JSON text, docs/types.md
    return value


def select_star(connection, table: str) -> list[dict[str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {table}")
        names = [column.name for column in cursor.description]
        return [
            {name: as_table_holds(name, value) for name, value in zip(names, row)}
            for row in cursor.fetchall()
        ]


def test_postgres_tables_equal_select_star_through_every_engine(
    postgres_cdc, kafka_connect, spark, tmp_path: Path
) -> None:
    import psycopg.types.json

    tag = uuid.uuid4().hex[:6]
    orders, customers, prefix, connector = (
        f"orders_{tag}",
        f"customers_{tag}",
        f"pgo{tag}",
        f"pg-oracle-{tag}",
    )
    orders_topic, customers_topic = (
        postgres_cdc.topic(prefix, orders),
        postgres_cdc.topic(prefix, customers),
    )
    config = oracle_config(
        tmp_path,
        "pg",
        orders_topic,
        customers_topic,
        f"{prefix}.dead-letters",
        (DATABASE, customers),
    )
    db = postgres_cdc.connect()
    # Compare JSONB as the text PostgreSQL gives Debezium, not as parsed Python values.
    psycopg.types.json.set_json_loads(lambda data: bytes(data).decode(), db)
    db.execute("SET TIME ZONE 'UTC'")
    db.execute(ORDERS_DDL.format(name=orders))
    db.execute(CUSTOMERS_DDL.format(name=customers))
    rng = random.Random(21)
    live: list[tuple[str, int]] = []
    deleted: list[tuple[str, int]] = []
    next_key = [100]

    def insert(row: tuple) -> None:
        db.execute(
            f"INSERT INTO {orders} ({', '.join(ORDER_COLUMNS)}) VALUES "
            f"({', '.join(['%s'] * len(ORDER_COLUMNS))})",
            row,
        )
        live.append((row[0], row[1]))

    def step() -> None:
        choice = rng.random()
        next_key[0] += 1
        if choice < 0.3 or len(live) < 6:
            insert(random_order(rng, rng.choice(["EU", "US", "AP"]), next_key[0]))
        elif choice < 0.6:
            region, key = rng.choice(live[:5])
            db.execute(
                f"UPDATE {orders} SET qty = %s, status = %s, n = %s, tstz = %s WHERE region = %s "
                "AND id = %s",
                (
                    rng.randint(-(10**6), 10**6),
                    "paid",
                    Decimal(rng.randint(0, 10**12)) / 1000,
                    dt.datetime(1960, 1, 1, tzinfo=UTC)
                    + dt.timedelta(microseconds=rng.randint(0, 10**15)),
                    region,
                    key,
                ),
            )
        elif choice < 0.66:
            target = live.pop(rng.randrange(5, len(live)))
            db.execute(f"DELETE FROM {orders} WHERE region = %s AND id = %s", target)
            deleted.append(target)
        elif choice < 0.7 and deleted:
            region, key = deleted.pop(0)
            insert(random_order(rng, region, key))  # a key that was deleted comes back
        elif choice < 0.75:
            region, key = live.pop(rng.randrange(5, len(live)))
            db.execute(
                f"UPDATE {orders} SET id = %s WHERE region = %s AND id = %s",
                (next_key[0], region, key),
            )  # primary key change
            live.append((region, next_key[0]))
        elif choice < 0.8:
            with db.transaction(force_rollback=True):  # a transaction that never happened
                db.execute(f"UPDATE {orders} SET status = 'rolled-back'")
        else:
            columns = "id, qty, name, email" + (
                ", status" if "status" in customer_columns() else ""
            )
            values = [
                next_key[0],
                f"q{rng.randint(0, 99)}",
                rng.choice(["中文", "ascii", None]),
                f"c{next_key[0]}@example.com",
            ]
            values += [rng.randint(0, 5)] if "status" in columns else []
            db.execute(
                f"INSERT INTO {customers} ({columns}) VALUES ({', '.join(['%s'] * len(values))})",
                values,
            )

    def customer_columns() -> list[str]:
        with db.cursor() as cursor:
            cursor.execute(f"SELECT * FROM {customers} LIMIT 0")
            return [column.name for column in cursor.description]

    for row in EDGE_ORDERS:
        insert(row)
    for _ in range(20):
        step()
    kafka_connect.create(postgres_cdc.connector_config(connector, prefix, [orders, customers]))
    pipeline = Pipeline(config, spark)
    try:
        kafka_connect.wait_for_snapshot(connector)
        for schema_change in (
            None,
            f"ALTER TABLE {orders} ADD COLUMN extra VARCHAR(10)",
            f"ALTER TABLE {orders} ALTER COLUMN qty TYPE BIGINT",
            f"ALTER TABLE {customers} DROP COLUMN status",
        ):
            if schema_change:
                db.execute(schema_change)
            for _ in range(50):
                step()
            region, key = live[0]
            if "extra" in (schema_change or ""):
                db.execute(
                    f"UPDATE {orders} SET extra = 'added' WHERE region = %s AND id = %s",
                    (region, key),
                )
            if "BIGINT" in (schema_change or ""):
                db.execute(
                    f"UPDATE {orders} SET qty = %s WHERE region = %s AND id = %s",
                    (2**40, region, key),
                )
            pipeline.sync()
        db.execute(f"INSERT INTO {customers} (id, qty) VALUES (%s, 'sentinel')", (10**9,))
        pipeline.sync_until("pg.customers", "qty", "sentinel")
    finally:
        kafka_connect.delete(connector)
        postgres_cdc.drop_publication(connector)

    assert pipeline.row_types("pg.orders") == {
        "region": "string",
        "id": "int",
        "qty": "long",
        "status": "string",
        "amount": "decimal(12, 2)",
        "n": "string",
        "d": "date",
        "ts6": "timestamp",
        "tstz": "timestamptz",
        "t": "string",
        "flag": "boolean",
        "score": "double",
        "doc": "string",
        "note": "string",
        "data": "binary",
        "u": "string",
        "iv": "long",
        "tags": "string",
        "extra": "string",
    }
    pipeline.assert_mirrors(
        spark,
        {
            "pg.orders": (["region", "id"], select_star(db, orders)),
            "pg.customers": (["id"], select_star(db, customers)),
        },
        [orders_topic, customers_topic],
    )

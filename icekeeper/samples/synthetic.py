"""Reproducible synthetic CDC streams: many keys, creates/updates/deletes, schema changes, poison.

Everything follows from the spec and its seed, so a test or the chaos suite can regenerate the
exact stream to check what the table must hold, without keeping a copy of what was produced.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from icekeeper.samples.debezium import BinlogPosition, Column, TableShape, envelope

PoisonKind = Literal["bad-magic-byte", "unknown-schema-id", "truncated-avro", "invalid-json"]
_AVRO_POISON: tuple[PoisonKind, ...] = ("bad-magic-byte", "unknown-schema-id", "truncated-avro")
_BASE_TS_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: content does not depend on when it runs


@dataclass(frozen=True)
class SyntheticSpec:
    """What to generate. Ratios are shares of events; poison messages come on top of `events`."""

    seed: int = 1
    keys: int = 1000
    events: int = 10_000
    update_ratio: float = 0.6
    delete_ratio: float = 0.1
    schema_changes: int = 2
    poison_ratio: float = 0.0
    format: Literal["avro", "json"] = "avro"
    server: str = "synth"
    db: str = "shop"
    table: str = "orders"
    key_reuse: Literal["last-deleted", "random"] = "last-deleted"
    """Which free key a create takes: the one deleted last (a deleted key soon comes back), or any
    free key at random (deleted keys stay deleted for a while, many until the end: what an upsert
    table's hard deletes must show)."""

    def __post_init__(self) -> None:
        if self.keys < 1 or self.events < 0:
            raise ValueError("keys must be >= 1 and events >= 0")
        if not (
            0 <= self.update_ratio
            and 0 <= self.delete_ratio
            and self.update_ratio + self.delete_ratio <= 1
        ):
            raise ValueError("update_ratio and delete_ratio must be >= 0 and add up to at most 1")
        if not 0 <= self.poison_ratio < 1:
            raise ValueError("poison_ratio must be in [0, 1)")

    @property
    def topic(self) -> str:
        return f"{self.server}.{self.db}.{self.table}"


@dataclass(frozen=True)
class SyntheticEvent:
    """One message: a change event at a schema version, or a poison message derived from one."""

    index: int
    version: int
    op: str
    key: dict[str, Any]
    value: dict[str, Any]
    poison: PoisonKind | None = None

    def partition(self, partitions: int) -> int:
        """Deterministic key -> partition, so reruns place keys identically."""
        return zlib.crc32(repr(sorted(self.key.items())).encode()) % partitions


ORDER_COLUMNS = (
    Column("id", "int", optional=False),
    Column("customer", "string"),
    Column("amount", "int"),
    Column("price", "double"),
    Column("status", "string"),
    Column("created_at", "long", connect_name="io.debezium.time.Timestamp"),
    Column("updated_at", "long", connect_name="io.debezium.time.Timestamp"),
)
"""The synthetic orders table's first version (keyed by `id`); the upsert benchmark uses it too."""


def schema_versions(spec: SyntheticSpec) -> list[TableShape]:
    """Shape of the table at each version (index 0 = version 1).

    Change i (1-based) adds column `extra_i`, except the second change, which widens `amount`
    from int to long: the two kinds of change the bookkeeper must evolve a table through.
    """
    columns = list(ORDER_COLUMNS)
    shapes = [TableShape(spec.server, spec.db, spec.table, tuple(columns), key=("id",))]
    for change in range(1, spec.schema_changes + 1):
        if change == 2:
            columns = [
                Column("amount", "long") if column.name == "amount" else column
                for column in columns
            ]
        else:
            columns = columns + [Column(f"extra_{change}", "string")]
        shapes.append(TableShape(spec.server, spec.db, spec.table, tuple(columns), key=("id",)))
    return shapes


def synthetic_events(spec: SyntheticSpec) -> Iterator[SyntheticEvent]:
    """The stream, in production order. Deterministic for a given spec."""
    rng = random.Random(spec.seed)
    shapes = schema_versions(spec)
    change_points = [
        spec.events * change // (spec.schema_changes + 1)
        for change in range(1, spec.schema_changes + 1)
    ]
    alive = _AliveKeys()
    free_keys = list(range(spec.keys))
    rng.shuffle(free_keys)
    poison_kinds = _AVRO_POISON if spec.format == "avro" else ("invalid-json",)
    poison_count = 0
    for index in range(spec.events):
        version = 1 + sum(1 for point in change_points if index >= point)
        shape = shapes[version - 1]
        ts_ms = _BASE_TS_MS + index * 10
        op = _pick_op(rng, spec, bool(alive.rows), bool(free_keys))
        if op == "c":
            if (
                spec.key_reuse == "random"
            ):  # swap a random free key to the end; the default draws nothing here
                pick = rng.randrange(len(free_keys))
                free_keys[pick], free_keys[-1] = free_keys[-1], free_keys[pick]
            key_id = free_keys.pop()
            before, after = None, _new_row(rng, shape, key_id, ts_ms)
            alive.put(key_id, after)
        else:
            key_id = alive.ids[rng.randrange(len(alive.ids))]
            before = _conform(alive.rows[key_id], shape)
            if op == "u":
                after = {
                    **before,
                    "amount": rng.randint(1, 10_000),
                    "status": rng.choice(["new", "paid", "shipped", "returned"]),
                    "updated_at": ts_ms,
                }
                if version >= 3 and rng.random() < 0.5:
                    after = {
                        **after,
                        **{
                            c.name: f"x{index}"
                            for c in shape.columns
                            if c.name.startswith("extra_")
                        },
                    }
                alive.put(key_id, after)
            else:
                after = None
                alive.remove(key_id)
                free_keys.append(key_id)
        at = BinlogPosition(
            ts_ms=ts_ms,
            file=f"mysql-bin.{1 + index // 100_000:06d}",
            pos=4 + (index % 100_000) * 512,
            gtid=f"synthetic:{index + 1}",
        )
        event = SyntheticEvent(
            index, version, op, {"id": key_id}, envelope(shape, op, before, after, at, ts_ms + 5)
        )
        yield event
        # Poison messages ride along right after real ones, so they are spread over the stream.
        if spec.poison_ratio and rng.random() < spec.poison_ratio / (1 - spec.poison_ratio):
            kind = poison_kinds[poison_count % len(poison_kinds)]
            poison_count += 1
            yield SyntheticEvent(index, version, op, event.key, event.value, poison=kind)


def _pick_op(rng: random.Random, spec: SyntheticSpec, any_alive: bool, any_free: bool) -> str:
    draw = rng.random()
    op = (
        "d"
        if draw < spec.delete_ratio
        else "u"
        if draw < spec.delete_ratio + spec.update_ratio
        else "c"
    )
    if op == "c" and not any_free:
        op = "u"
    if op in ("u", "d") and not any_alive:
        op = "c"
    return op


class _AliveKeys:
    """Keys that currently exist, with O(1) random pick and removal (swap with the last)."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}
        self.ids: list[int] = []
        self._position: dict[int, int] = {}

    def put(self, key_id: int, row: dict[str, Any]) -> None:
        if key_id not in self.rows:
            self._position[key_id] = len(self.ids)
            self.ids.append(key_id)
        self.rows[key_id] = row

    def remove(self, key_id: int) -> None:
        index = self._position.pop(key_id)
        last = self.ids.pop()
        if last != key_id:
            self.ids[index] = last
            self._position[last] = index
        del self.rows[key_id]


def _new_row(rng: random.Random, shape: TableShape, key_id: int, ts_ms: int) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": key_id,
        "customer": f"customer-{rng.randrange(100_000):05d}",
        "amount": rng.randint(1, 10_000),
        "price": round(rng.uniform(1, 500), 2),
        "status": "new",
        "created_at": ts_ms,
        "updated_at": ts_ms,
    }
    return _conform(row, shape)


def _conform(row: dict[str, Any], shape: TableShape) -> dict[str, Any]:
    """The row with exactly the columns of `shape` (new columns null)."""
    return {column.name: row.get(column.name) for column in shape.columns}


def expected_state(spec: SyntheticSpec) -> dict[int, dict[str, Any] | None]:
    """Key id -> last `after` row (None if its last event deleted it), ignoring poison messages."""
    state: dict[int, dict[str, Any] | None] = {}
    for event in synthetic_events(spec):
        if event.poison is None:
            state[event.key["id"]] = event.value["after"]
    return state

"""Read the seed 000 job's `.properties` file, giving its keys the meaning they had there.

Users of that Spark Streaming job can point icekeeper at their existing file. Each key is
translated to the YAML model's key; `key_names` remembers the original so errors name the
line the user wrote. Keys the old job had but icekeeper has no use for (`hive.*`: it created
Hive external tables) are accepted and reported as ignored; anything else unknown is an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import javaproperties

_IGNORED_PREFIXES = ("hive.",)
# spark.yarn.jars listed the old job's jars; the key deserializer is implied by the value format.
_IGNORED_KEYS = {"spark.yarn.jars", "kafka.consumer.key.deserializer"}


class PropertiesError(ValueError):
    """Raised through ConfigError by the loader; carries the offending key."""


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java `.properties` text as `java.util.Properties.load` does (separators `=`, `:` or
    whitespace, `#`/`!` comments, `\\` continuations, escapes such as `\\:` and `\\u00e9`), through
    `javaproperties`. Values lose trailing whitespace too, which Java keeps: an invisible space
    after `500` is not what a user meant."""
    return {key: value.strip() for key, value in javaproperties.loads(text).items()}


def split_top_level(value: str) -> list[str]:
    """Split on commas outside parentheses, so `bucket(16, id), day(ts)` stays two terms."""
    parts, depth, current = [], 0, ""
    for char in value:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return [part for part in parts if part]


def _table_properties(value: str) -> dict[str, str]:
    """`'read.split.target-size'='268435456','k'='v'` (seed 000's form) or `k=v,k2=v2`."""
    quoted = re.findall(r"'([^']*)'\s*=\s*'([^']*)'", value)
    if quoted:
        return dict(quoted)
    pairs = {}
    for item in split_top_level(value):
        if "=" not in item:
            raise PropertiesError(f"{item!r} is not key=value")
        key, _, item_value = item.partition("=")
        pairs[key.strip().strip("'\"")] = item_value.strip().strip("'\"")
    return pairs


def _identifier(value: str) -> str:
    """`hadoop.db.tbl` names a Spark catalog first; icekeeper's catalog is configured apart."""
    parts = value.split(".")
    return ".".join(parts[1:]) if len(parts) == 3 else value


def _milliseconds(value: str) -> float:
    try:
        return float(value) / 1000.0
    except ValueError:
        raise PropertiesError(f"{value!r} is not a number of milliseconds") from None


def _csv(value: str) -> list[str]:
    return split_top_level(value)


def _format_from_deserializer(value: str) -> str:
    if "Avro" in value:
        return "avro-confluent"
    if "Json" in value or "JSON" in value or "String" in value:
        return "debezium-json"
    raise PropertiesError(
        f"{value!r}: icekeeper reads KafkaAvroDeserializer (avro-confluent) or JSON"
    )


# property key -> (model path, converter)
_DIRECT: dict[str, tuple[tuple[Any, ...], Callable[[str], Any]]] = {
    "spark.master": (("spark", "master"), str),
    "spark.app.name": (("writer", "app_name"), str),
    "spark.streaming.kafka.maxRatePerPartition": (("sources", 0, "max_rate_per_partition"), str),
    "kafka.bootstrap.servers": (("sources", 0, "bootstrap_servers"), str),
    "kafka.schema.registry.url": (("sources", 0, "schema_registry_url"), str),
    "kafka.consumer.group.id": (("sources", 0, "consumer_group"), str),
    "kafka.consumer.topic": (("sources", 0, "topics"), _csv),
    "kafka.consumer.commit.timeout.millis": (("sources", 0, "commit_timeout"), _milliseconds),
    "kafka.consumer.value.deserializer": (("sources", 0, "format"), _format_from_deserializer),
    # The seed's own table of keys spells it without the trailing "r".
    "kafka.consumer.value.deserialize": (("sources", 0, "format"), _format_from_deserializer),
    "record.metadata.source.columns": (("metadata_columns", "source", "columns"), _csv),
    "record.metadata.source.prefix": (("metadata_columns", "source", "prefix"), str),
    "record.metadata.transaction.columns": (("metadata_columns", "transaction", "columns"), _csv),
    "record.metadata.transaction.prefix": (("metadata_columns", "transaction", "prefix"), str),
    "record.metadata.kafka.columns": (("metadata_columns", "kafka", "columns"), _csv),
    "record.metadata.kafka.prefix": (("metadata_columns", "kafka", "prefix"), str),
    "iceberg.table.name": (("tables", 0, "identifier"), _identifier),
    "iceberg.table.primaryKey": (("tables", 0, "primary_key"), _csv),
    "iceberg.table.partitionBy": (("tables", 0, "partition_by"), _csv),
    "iceberg.table.comment": (("tables", 0, "comment"), str),
    "iceberg.table.location": (("tables", 0, "location"), str),
    "iceberg.table.properties": (("tables", 0, "properties"), _table_properties),
    "iceberg.maintenance.enabled": (("reaper", "enabled"), str),
    "iceberg.maintenance.triggering.time": (("reaper", "triggering_time"), str),
    "iceberg.maintenance.execute.interval": (("reaper", "execute_interval"), _milliseconds),
    "iceberg.maintenance.snapshot.expire.time": (("reaper", "snapshot_expire_time"), _milliseconds),
    "iceberg.maintenance.compact.filter.column": (("reaper", "compact_filter_column"), str),
    "iceberg.maintenance.compact.day.offset": (("reaper", "compact_day_offset"), str),
    "iceberg.maintenance.compact.target.file.size.bytes": (
        ("reaper", "compact_target_file_size_bytes"),
        str,
    ),
    "iceberg.maintenance.manifests.file.length": (("reaper", "manifests_file_length"), str),
}


def translate_properties(text: str, source_name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Seed-000 properties text -> (raw config mapping, model key -> property key).

    Raises:
        ConfigError: naming the property key, for an unknown key or a value that cannot convert.
    """
    from icekeeper.common.config.loader import ConfigError  # the loader imports this module

    entries = parse_properties(text)
    raw: dict[str, Any] = {"sources": [{}], "tables": [{}]}
    key_names: dict[str, str] = {}
    for key, value in entries.items():
        if key.startswith(_IGNORED_PREFIXES) or key in _IGNORED_KEYS:
            continue
        if key in _DIRECT:
            path, convert = _DIRECT[key]
            try:
                converted = convert(value)
            except PropertiesError as error:
                raise ConfigError(source_name, key, str(error)) from None
            _set(raw, path, converted)
            key_names[_model_key(path)] = key
        elif key.startswith("spark."):
            raw.setdefault("spark", {}).setdefault("conf", {})[key] = value
        elif key.startswith("kafka.consumer."):
            consumer_key = key.removeprefix("kafka.consumer.")
            raw["sources"][0].setdefault("consumer_properties", {})[consumer_key] = value
        else:
            raise ConfigError(
                source_name,
                key,
                "unknown key (seed 000 keys: spark.*, kafka.*, record.metadata.*, "
                "iceberg.table.*, iceberg.maintenance.*)",
            )
    table, source = raw["tables"][0], raw["sources"][0]
    if "topics" in source and "topics" not in table:
        table["topics"] = list(source["topics"])
    if not table:
        raw.pop("tables")
    return raw, key_names


def ignored_properties(text: str) -> list[str]:
    """Keys of a seed-000 file that icekeeper accepts but does not use (`hive.*`)."""
    return [
        key
        for key in parse_properties(text)
        if key.startswith(_IGNORED_PREFIXES) or key in _IGNORED_KEYS
    ]


def _set(raw: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = raw
    for segment in path[:-1]:
        node = node[segment] if isinstance(segment, int) else node.setdefault(segment, {})
    node[path[-1]] = value


def _model_key(path: tuple[Any, ...]) -> str:
    key = ""
    for part in path:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else part)
    return key

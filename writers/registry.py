"""Value schemas of a topic from the schema registry, cached per id (schemas never change)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from common.schema import resolve_named_types

log = logging.getLogger(__name__)
MAX_VERSIONS_PER_TOPIC = 64
"""Versions decoded per batch; older ones are looked up by id if a batch still contains them."""


@dataclass(frozen=True)
class RegisteredSchema:
    schema_id: int
    text: str
    """The schema exactly as registered (what Spark's from_avro needs)."""
    resolved: dict[str, Any]
    """Parsed, with named-type references inlined."""


class TopicSchemas:
    """Schemas by id, and the ids registered for a topic's value subject (TopicNameStrategy)."""

    def __init__(self, registry_url: str) -> None:
        self.client = SchemaRegistryClient({"url": registry_url})
        self._by_id: dict[int, RegisteredSchema] = {}

    def by_id(self, schema_id: int) -> RegisteredSchema | None:
        """The schema with this id, or None if the registry does not know it."""
        if schema_id not in self._by_id:
            try:
                text = self.client.get_schema(schema_id).schema_str
            except SchemaRegistryError as error:
                if error.http_status_code == 404:
                    return None
                raise
            self._by_id[schema_id] = RegisteredSchema(schema_id, text, resolve_named_types(json.loads(text)))
        return self._by_id[schema_id]

    def for_topic(self, topic: str) -> list[RegisteredSchema]:
        """The newest `MAX_VERSIONS_PER_TOPIC` value schemas of `topic`, oldest first."""
        subject = f"{topic}-value"
        try:
            versions = self.client.get_versions(subject)
        except SchemaRegistryError as error:
            if error.http_status_code == 404:
                return []
            raise
        schemas = []
        for version in sorted(versions)[-MAX_VERSIONS_PER_TOPIC:]:
            registered = self.client.get_version(subject, version)
            schema = self.by_id(registered.schema_id)
            if schema is not None:
                schemas.append(schema)
        return schemas

    def for_topics(self, topics: Iterable[str]) -> list[RegisteredSchema]:
        """The value schemas of every topic in `topics` (`for_topic`), each id once."""
        seen: dict[int, RegisteredSchema] = {}
        for topic in sorted(set(topics)):
            for schema in self.for_topic(topic):
                seen[schema.schema_id] = schema
        return list(seen.values())

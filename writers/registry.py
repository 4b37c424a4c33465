"""Value schemas of a topic from the schema registry, cached per id (schemas never change).

A registry that cannot answer is not a reason to call records poison: every failure to reach it
(connection refused, timeouts, 5xx, an answer that is not the registry's) raises
`RegistryUnavailable`, and so does a registry that answers 404 for the batch's schemas because it
lost them or is not the registry the producers used (`registry_outage`). The writer then pauses
instead of dead-lettering the stream. One unknown id among ids the registry knows is poison.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka.schema_registry.error import SchemaRegistryError

from icekeeper.common.config.model import KafkaSource
from icekeeper.common.config.secrets import mask_text
from icekeeper.common.kafka_clients import registry_client
from icekeeper.common.schema import resolve_named_types

log = logging.getLogger(__name__)


class RegistryUnavailable(RuntimeError):
    """The schema registry cannot say which schemas
    the batch's records name; nothing is published."""


T = TypeVar("T")
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

    def __init__(self, source: KafkaSource) -> None:
        # Error messages (logs, status, alerts) name the
        # registry without the password of its user-info.
        self.url = mask_text(source.schema_registry_url)
        self.client = registry_client(source)
        self._by_id: dict[int, RegisteredSchema] = {}

    def by_id(self, schema_id: int) -> RegisteredSchema | None:
        """The schema with this id, or None if the registry answers that it does not know it."""
        if schema_id not in self._by_id:
            registered = self._ask(
                f"schema id {schema_id}", lambda: self.client.get_schema(schema_id)
            )
            if registered is None:
                return None
            text = registered.schema_str
            self._by_id[schema_id] = RegisteredSchema(
                schema_id, text, resolve_named_types(json.loads(text))
            )
        return self._by_id[schema_id]

    def subjects(self) -> list[str]:
        """Every subject the registry holds; `RegistryUnavailable` when it does not answer this
        (a wrong URL answers 404 here, where a registry always has the endpoint)."""
        subjects = self._ask("subjects", self.client.get_subjects, missing_is_none=False)
        if not isinstance(subjects, list):
            raise RegistryUnavailable(
                f"the schema registry at {self.url} does not list subjects (wrong URL?)"
            )
        return subjects

    def _ask(self, what: str, request: Callable[[], T], missing_is_none: bool = True) -> T | None:
        """`request`'s answer, None for a 404 (if `missing_is_none`); `RegistryUnavailable` for
        anything but an answer."""
        try:
            return request()
        except SchemaRegistryError as error:
            if error.http_status_code == 404 and missing_is_none:
                return None
            raise RegistryUnavailable(
                f"the schema registry at {self.url} answered {error.http_status_code} for {what}: "
                f"{error.error_message}"
            ) from error
        except Exception as error:
            raise RegistryUnavailable(
                mask_text(f"the schema registry at {self.url} did not answer for {what}: {error!r}")
            ) from error

    def for_topic(self, topic: str) -> list[RegisteredSchema]:
        """The newest `MAX_VERSIONS_PER_TOPIC` value schemas of `topic`, oldest first."""
        subject = f"{topic}-value"
        versions = self._ask(f"subject {subject}", lambda: self.client.get_versions(subject)) or []
        schemas = []
        for version in sorted(versions)[-MAX_VERSIONS_PER_TOPIC:]:
            registered = self._ask(
                f"subject {subject} version {version}",
                lambda version=version: self.client.get_version(subject, version),
            )
            schema = self.by_id(registered.schema_id) if registered is not None else None
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


def registry_outage(
    subjects: list[str] | RegistryUnavailable,
    unknown_topics: set[str],
    with_known_ids: Callable[[set[str]], set[str]],
) -> str | None:
    """Why the batch's unknown schema ids are the registry's
    fault, not poison; None when they are poison.

    The registry is at fault when it does not list its subjects (down, or a wrong URL), when it
    lists none (an in-memory registry that restarted, or an empty one), or when a topic whose
    records named only unknown ids in this batch has no value subject there (it lost that
    topic's schemas, or it is not the registry the producers used). An unknown id in a topic
    that still has its subject, or next to ids the registry knows, is a dead letter.

    Args:
        subjects: the registry's subjects, or why it would not list them.
        unknown_topics: topics with records naming schema ids the registry does not know.
        with_known_ids: which of the topics given have records in the batch that name a known
            schema id (asked only about topics without a subject: it reads the batch again).
    """
    if isinstance(subjects, RegistryUnavailable):
        return str(subjects)
    if not subjects:
        return (
            "the schema registry holds no subjects: it lost its schemas (restarted without "
            "storage?) or is not the registry the producers use"
        )
    without_subject = {topic for topic in unknown_topics if f"{topic}-value" not in subjects}
    lost = sorted(without_subject - with_known_ids(without_subject)) if without_subject else []
    if lost:
        return (
            f"the schema registry has no value subject for {', '.join(lost)}, whose records name "
            "only unknown schema ids: it lost them or is not the registry the producers use"
        )
    return None

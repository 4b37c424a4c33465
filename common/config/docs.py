"""Render every config key, its type, default and description as Markdown.

`docs/configuration.md` is this output (`icekeeper config docs > docs/configuration.md`); a
test fails when the two drift apart, so the model stays the one place keys are documented.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from icekeeper.common.config.model import (
    AzureQueueTransport,
    IcekeeperConfig,
    TxLogTransport,
    parse_duration_s,
)
from icekeeper.common.config.renames import RENAMED_KEYS

_HEADER = """# Configuration reference

One YAML file configures icekeeper (`--config`, or `ICEKEEPER_CONFIG`). Unknown keys are errors.
Any key can be overridden by an environment variable: `ICEKEEPER__` plus the key path in upper
case with `__` between levels and list indexes as numbers, e.g.
`ICEKEEPER__SOURCES__0__BOOTSTRAP_SERVERS=broker:9092` or \
`ICEKEEPER__BOOKKEEPER__COMMIT_INTERVAL=2s`;
values are read as YAML scalars. Durations take `500ms`, `10s`, `5m`, `2h`, `7d` or seconds.
`{state_dir}` in any value expands to the state folder.

Seed 000's `.properties` files load too (`--config job.properties`); their keys map as noted
below (`seed 000: ...`), with durations in milliseconds as there.

Generated from `common/config/model.py` by `icekeeper config docs`; do not edit by hand.
"""


_DEVELOPMENT_HEADER = """# Development sections

Read only by the development tools (`icekeeper stack`, `icekeeper demo`, the tests), never by
the writer, the bookkeeper or the reaper; a production config has no need of them. A config file
may hold them beside the sections above, and `ICEKEEPER__STACK__...` variables override them.
"""


def render_markdown(development: Mapping[str, type[BaseModel]] | None = None) -> str:
    """The whole reference: every key of the production model, then the development sections.

    Args:
        development: section name -> its tool's model (e.g. `stack` ->
            `icekeeper.localstack.settings.StackConfig`); `common` imports no tool, so the
            caller names them.
    """
    sections = [_HEADER, _render_renamed_keys()]
    sections.append(_render_model("Top level", IcekeeperConfig, prefix=""))
    for name, field in IcekeeperConfig.model_fields.items():
        for model, suffix in _nested_models(field.annotation):
            title = f"`{name}{suffix}`"
            if model in (TxLogTransport, AzureQueueTransport):
                title += f" (kind `{model.model_fields['kind'].default}`)"
            sections.append(_render_model(title, model, prefix=f"{name}{suffix}."))
            for sub_name, sub_field in model.model_fields.items():
                for sub_model, sub_suffix in _nested_models(sub_field.annotation):
                    sections.append(
                        _render_model(
                            f"`{name}{suffix}.{sub_name}{sub_suffix}`",
                            sub_model,
                            prefix=f"{name}{suffix}.{sub_name}{sub_suffix}.",
                        )
                    )
    if development:
        sections.append(_DEVELOPMENT_HEADER)
        for name, model in development.items():
            sections.append(_render_model(f"`{name}`", model, prefix=f"{name}."))
    return "\n".join(sections)


def _render_renamed_keys() -> str:
    lines = [
        "Keys moved in this release still load from their old place, with a warning naming the",
        "new key; the old names go in the next release:",
        "",
    ]
    for (old_section, old_key), (new_section, new_key) in RENAMED_KEYS.items():
        lines.append(f"- `{old_section}.{old_key}` -> `{new_section}.{new_key}`")
    return "\n".join(lines) + "\n"


def _nested_models(annotation: Any) -> list[tuple[type[BaseModel], str]]:
    """Models inside an annotation, `[]` for lists: `list[KafkaSource]` -> [(KafkaSource, '[]')]."""
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, "")]
    if origin is list:
        return [
            (model, "[]" + suffix)
            for model, suffix in _nested_models(typing.get_args(annotation)[0])
        ]
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        found = []
        for arg in typing.get_args(annotation):
            found.extend(_nested_models(arg))
        return found
    return []


def _summary(model: type[BaseModel]) -> str:
    """The first paragraph of the model's docstring on one line (a summary may wrap at 100)."""
    first_paragraph = (model.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(first_paragraph.split())


def _render_model(title: str, model: type[BaseModel], prefix: str) -> str:
    lines = [
        f"## {title}",
        "",
        _summary(model),
        "",
        "| key | type | default | description |",
        "|---|---|---|---|",
    ]
    for name, field in model.model_fields.items():
        if _nested_models(field.annotation) and name != "transport":
            default = "see below"
        else:
            default = _default(field)
        lines.append(
            f"| `{prefix}{name}` | {_type_name(field)} | {default} | "
            f"{(field.description or '').replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        value = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
        if isinstance(value, list):
            value = [
                item.model_dump(mode="json") if isinstance(item, BaseModel) else item
                for item in value
            ]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    return f"`{json.dumps(value)}`".replace("|", "/")


def _type_name(field: FieldInfo) -> str:
    annotation = field.annotation
    if any(getattr(item, "func", None) is parse_duration_s for item in field.metadata):
        return "duration"
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(f"`{value}`" for value in typing.get_args(annotation))
    text = getattr(annotation, "__name__", None) if typing.get_origin(annotation) is None else None
    if text is None:
        text = (
            str(annotation)
            .replace("typing.", "")
            .replace("icekeeper.common.config.model.", "")
            .replace("pydantic.types.", "")
        )
    if "parse_duration_s" in text:
        return "duration or None"
    return text.replace("|", "or")

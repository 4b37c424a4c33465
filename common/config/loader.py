"""Load a config file (YAML, or a seed 000 `.properties` file) into an `IcekeeperConfig`.

Order of precedence: model defaults < file < environment (`ICEKEEPER__SECTION__KEY=value`).
Every failure is a `ConfigError` that names the file and the key, because a user debugging a
deployment needs to know which line to fix, not which pydantic class complained.
"""

from __future__ import annotations

import copy
import difflib
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from icekeeper.common.config.model import DEVELOPMENT_SECTIONS, DevelopmentSections, IcekeeperConfig
from icekeeper.common.config.properties import translate_properties
from icekeeper.common.config.renames import RENAMED_KEYS
from icekeeper.common.config.secrets import mask_text, remember_secrets_in, resolve_references

ENV_PREFIX = "ICEKEEPER__"
"""Environment variables `ICEKEEPER__A__B__0__C`
override key `a.b[0].c`; values are YAML scalars."""

CONFIG_PATH_ENV = "ICEKEEPER_CONFIG"
"""Environment variable naming the config file when `--config` is not given."""

_STATE_DIR_TOKEN = "{state_dir}"


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""

    def __init__(self, source: str, key: str | None, message: str) -> None:
        self.source = source
        self.key = key
        location = f"{source}: {key}" if key else source
        super().__init__(f"config error in {location}: {message}")


class ConfigErrors(ConfigError):
    """Every error of one config, so that one run shows every line to fix: one `ConfigError` per
    line of the message; `source` and `key` are the first one's."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        self.source, self.key = errors[0].source, errors[0].key
        ValueError.__init__(self, "\n".join(str(error) for error in errors))


def each_error(error: ConfigError) -> list[ConfigError]:
    """The errors `error` stands for: its list for `ConfigErrors`, else itself."""
    return list(error.errors) if isinstance(error, ConfigErrors) else [error]


def one_or_all(errors: list[ConfigError]) -> ConfigError:
    """The error to raise for `errors` (at least one): the error itself when there is one."""
    return errors[0] if len(errors) == 1 else ConfigErrors(errors)


def load_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> IcekeeperConfig:
    """Load, override from the environment, validate and expand a config.

    Args:
        path: a `.yaml`/`.yml` or seed-000 style `.properties` file; None means embedded defaults
            (or the file named by `ICEKEEPER_CONFIG`).
        environ: the environment to read overrides from (default `os.environ`).

    Returns:
        The validated config, with `state_dir` and `cache_dir` made absolute,
        `{state_dir}` expanded in every string value and `${env:NAME}` /
        `${file:path}` secret references resolved (`common/config/secrets.py`).
    """
    environ = os.environ if environ is None else environ
    if path is None and environ.get(CONFIG_PATH_ENV):
        path = environ[CONFIG_PATH_ENV]
    source_name = str(path) if path is not None else "<embedded defaults>"
    raw, key_names = _read_file(Path(path)) if path is not None else ({}, {})
    overridden = _apply_env_overrides(raw, environ, source_name)
    for env_key in overridden:
        key_names.setdefault(overridden[env_key], env_key)

    def reference_error(path: tuple[str | int, ...], reason: str) -> ConfigError:
        return ConfigError(source_name, _user_key(_dotted_key(path), key_names), reason)

    raw = resolve_references(raw, environ, reference_error)
    _name_renamed_keys(raw, key_names)
    development = DevelopmentSections(
        source_name,
        {name: raw.pop(name) for name in DEVELOPMENT_SECTIONS if name in raw},
        dict(key_names),
    )
    try:
        config = IcekeeperConfig.model_validate(raw)
    except ValidationError as error:
        raise one_or_all(_validation_errors(error, source_name, key_names)) from None
    config = _expand_paths(config).with_development(development)
    remember_secrets_in(config)
    return config


SectionModel = TypeVar("SectionModel", bound=BaseModel)


def validate_development_section(
    development: DevelopmentSections, name: str, model: type[SectionModel]
) -> SectionModel:
    """Validate the development section `name` (e.g. `stack`) with its tool's own model.

    Raises:
        ConfigError: naming the file and the key (`stack.kafka_port`), as for any other key.
    """
    try:
        return model.model_validate(development.sections.get(name) or {})
    except ValidationError as error:
        raise one_or_all(
            _validation_errors(
                error, development.source, dict(development.key_names), prefix=(name,), root=model
            )
        ) from None


def _name_renamed_keys(raw: dict[str, Any], key_names: dict[str, str]) -> None:
    """An error in a key the model moves (common/config/renames.py) names the key as written."""
    for (old_section, old_key), (new_section, new_key) in RENAMED_KEYS.items():
        section = raw.get(old_section)
        if isinstance(section, dict) and old_key in section:
            old = f"{old_section}.{old_key}"
            key_names.setdefault(f"{new_section}.{new_key}", key_names.get(old, old))


def _read_file(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Raw mapping from the file, plus model-key -> the key as the user wrote it."""
    if not path.is_file():
        raise ConfigError(str(path), None, "no such file")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".properties":
        return translate_properties(text, str(path))
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(str(path), None, f"not valid YAML: {error}") from None
    if raw is None:
        return {}, {}
    if not isinstance(raw, dict):
        raise ConfigError(str(path), None, "the top level must be a mapping of sections")
    return raw, {}


def _apply_env_overrides(
    raw: dict[str, Any], environ: Mapping[str, str], source_name: str
) -> dict[str, str]:
    """Set each `ICEKEEPER__...` variable into `raw`; returns env var name -> dotted model key.

    Variables apply in name order, so a whole list (`ICEKEEPER__TABLES`) is set before the field
    overrides of its items (`ICEKEEPER__TABLES__0__MODE`), whatever order the environment has.

    Hand-written rather than pydantic-settings' `env_nested_delimiter`: that addresses nested
    models but not list items (`ICEKEEPER__SOURCES__0__BOOTSTRAP_SERVERS`, one field of the first
    source, the rest kept from the file or the defaults), cannot switch a section's `kind` with
    the kind's own defaults, and its errors do not name the variable that caused them.
    """
    defaults = IcekeeperConfig().model_dump(mode="python")
    applied: dict[str, str] = {}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name == ENV_PREFIX:
            continue
        segments = [segment.lower() for segment in name[len(ENV_PREFIX) :].split("__")]
        path: list[str | int] = [
            int(segment) if segment.isdigit() else segment for segment in segments
        ]
        value = yaml.safe_load(environ[name]) if environ[name] != "" else ""
        try:
            _set_path(raw, defaults, path, value)
        except (KeyError, IndexError, TypeError) as error:
            raise ConfigError(
                f"environment variable {name}",
                _dotted_key(tuple(path)),
                f"cannot be set here ({error})",
            ) from None
        applied[name] = _dotted_key(tuple(path))
    return applied


def _set_path(raw: Any, defaults: Any, path: list[str | int], value: Any) -> None:
    """Set `value` at `path`, copying in defaults for containers the file does not have yet.

    Copying defaults (rather than creating empty containers) lets an override such as
    `ICEKEEPER__CATALOG__PROPERTIES__URI` change one key of the default catalog; a list item the
    file does not have (`ICEKEEPER__SOURCES__0__TOPICS` with no `sources:`, which default to none)
    is made from the variable's fields and the item's own defaults.
    """
    node, default_node = raw, defaults
    for segment, next_segment in zip(path, path[1:]):
        default_child = _child(default_node, segment)
        if isinstance(node, dict):
            if segment not in node:
                node[segment] = (
                    copy.deepcopy(default_child)
                    if default_child is not None
                    else ({} if isinstance(next_segment, str) else [])
                )
            node = node[segment]
        elif isinstance(node, list) and isinstance(segment, int):
            while len(node) <= segment:
                node.append({})
            node = node[segment]
        else:
            raise TypeError(f"{segment!r} is not a section")
        default_node = default_child
    last = path[-1]
    if isinstance(node, list) and isinstance(last, int):
        while len(node) <= last:
            node.append(None)
    if last == "kind" and isinstance(node, dict) and node.get("kind") not in (None, value):
        # A different kind (e.g. transport txlog -> azure-queue): drop the old kind's defaults,
        # keep what the user set.
        defaults_here = default_node if isinstance(default_node, dict) else {}
        for key in [k for k, v in node.items() if defaults_here.get(k) == v]:
            del node[key]
    node[last] = value


def _child(node: Any, segment: str | int) -> Any:
    if isinstance(node, dict):
        return node.get(segment)
    if isinstance(node, list) and isinstance(segment, int) and segment < len(node):
        return node[segment]
    return None


def _expand_paths(config: IcekeeperConfig) -> IcekeeperConfig:
    state_dir = str(Path(config.state_dir).expanduser().absolute())
    dumped = config.model_dump(mode="python")
    dumped["state_dir"] = state_dir
    dumped["cache_dir"] = str(Path(config.cache_dir).expanduser().absolute())
    return IcekeeperConfig.model_validate(_replace_token(dumped, state_dir))


def _replace_token(node: Any, state_dir: str) -> Any:
    if isinstance(node, str):
        return node.replace(_STATE_DIR_TOKEN, state_dir)
    if isinstance(node, dict):
        return {key: _replace_token(value, state_dir) for key, value in node.items()}
    if isinstance(node, list):
        return [_replace_token(value, state_dir) for value in node]
    return node


def _dotted_key(loc: tuple[Any, ...]) -> str:
    """('tables', 0, 'primary_key') -> 'tables[0].primary_key'; drops union tags like 'txlog'."""
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        elif part in ("txlog", "azure-queue") and key == "transport":
            continue
        else:
            key += f".{part}" if key else str(part)
    return key


def _user_key(model_key: str, key_names: dict[str, str]) -> str:
    """The key as the user wrote it (a `.properties` key, an env var) when it differs."""
    for candidate, written in key_names.items():
        if (
            model_key == candidate
            or model_key.startswith(candidate + ".")
            or model_key.startswith(candidate + "[")
        ):
            return f"{written} ({model_key})" if written != model_key else model_key
    return model_key


def _validation_errors(
    error: ValidationError,
    source_name: str,
    key_names: dict[str, str],
    prefix: tuple[str, ...] = (),
    root: type[BaseModel] = IcekeeperConfig,
) -> list[ConfigError]:
    """One `ConfigError` per key pydantic found wrong (the first error of each key: a value that
    fits no member of a union fails once per member)."""
    errors: dict[str, ConfigError] = {}
    for found in error.errors():
        key = _dotted_key((*prefix, *found["loc"]))
        if key not in errors:
            message = _describe(found, root, found["loc"])
            errors[key] = ConfigError(source_name, _user_key(key, key_names), message)
    return list(errors.values())


def _describe(
    error: Mapping[str, Any], root: type[BaseModel] = IcekeeperConfig, loc: tuple = ()
) -> str:
    if error["type"] == "extra_forbidden":
        known = known_keys(root, loc[:-1]) + (
            list(DEVELOPMENT_SECTIONS) if root is IcekeeperConfig and len(loc) == 1 else []
        )
        meant = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6) if loc else []
        if meant:
            return (
                f"unknown key: did you mean `{meant[0]}`? (`icekeeper config docs` lists every key)"
            )
        return "unknown key (check its spelling; `icekeeper config docs` lists every key)"
    message = str(error["msg"]).removeprefix("Value error, ")
    value = error.get("input")
    if error["type"] != "missing" and not isinstance(value, (dict, list)):
        message += f" (got {mask_text(repr(value))})"
    return message


def known_keys(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys a config may hold at `loc` (a pydantic error's location, e.g. `('sources', 0)`,
    or `('transport', 'azure-queue')` with a union's tag), for suggesting the key meant by a
    misspelt one; empty where the model does not say (a free-form mapping)."""
    annotation: Any = root
    for part in loc:
        annotation = _member_at(annotation, part)
        if annotation is None:
            return []
    annotation = _single(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []


def _member_at(annotation: Any, part: Any) -> Any:
    """The type one step down `annotation`: a model's field, a list's item, a mapping's value,
    or the member of a tagged union (`kind`) that `part` names."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _member_at(typing.get_args(annotation)[0], part)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for member in typing.get_args(annotation):
            if isinstance(member, type) and issubclass(member, BaseModel):
                kind = member.model_fields.get("kind")
                if kind is not None and kind.default == part:
                    return member
        single = _single(annotation)
        return None if single is annotation else _member_at(single, part)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field is not None else None
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is list and isinstance(part, int) and args:
        return args[0]
    if typing.get_origin(annotation) is dict and len(args) == 2:
        return args[1]
    return None


def _single(annotation: Any) -> Any:
    """`X` for `X | None` (and `Annotated[X, ...]`); any other type as it is."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _single(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(members) == 1:
            return _single(members[0])
    return annotation

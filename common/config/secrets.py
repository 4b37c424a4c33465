"""Secrets in the config: where they come from, and how they are kept out of everything we print.

A config file names a secret instead of holding it, the way Kafka Connect's config providers do:
`${env:NAME}` is replaced by environment variable NAME, `${file:/path}` by the file's content
(trailing newline dropped: a Kubernetes or Docker secret mount) and `${file:/path:key}` by `key` of
a Java properties file (Kafka Connect's `FileConfigProvider`). References work in any string value,
also inside a longer one (`https://user:${env:REGISTRY_PASSWORD}@registry/apis/ccompat/v7`), and are
resolved once, when the config is loaded.

Whatever prints config or logs goes through `mask_text` / `mask_properties`: a URL's password,
`password=`, `AccountKey=` and the like, the values of secret-named keys (`sasl.jaas.config`,
`*password*`, `*secret*`, `*token*`, `*key`, `*account.key*`, `credential`,
`header.Authorization`), and every value a
reference resolved to (remembered in `known_secret_values`, so a log line that quotes one is masked
too) become `MASK`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic_core import to_jsonable_python

MASK = "**********"
"""What a secret prints as (pydantic's `SecretStr` prints the same)."""

_REFERENCE = re.compile(r"\$\{(env|file):([^}]*)\}")
_SECRET_KEY = re.compile(
    r"(password|passwd|secret|token|credential|authorization|jaas|user\.info|(^|[._-])key$|api[._-]?key|account[._-]key)",
    re.IGNORECASE,
)
_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)[^@\s/]+@")
_ASSIGNED_SECRET = re.compile(
    r"\b(AccountKey|SharedAccessSignature|SharedAccessKey|sig|password|passwd|secret|token)(\s*=\s*)(\"[^\"]*\"|'[^']*'|[^;&\s\"',}]+)",
    re.IGNORECASE,
)
_SHORTEST_REMEMBERED = 4
"""Resolved values shorter than this are not masked
everywhere in logs (a `1` would mask every digit)."""

known_secret_values: set[str] = set()
"""Every value a `${...}` reference resolved to, or a secret-named key held, in this process."""


class SecretReferenceError(ValueError):
    """A `${env:...}` or `${file:...}` reference that cannot be resolved; the message says why."""


def resolve_references(
    node: Any,
    environ: Mapping[str, str],
    on_error: Callable[[tuple[str | int, ...], str], Exception],
    path: tuple[str | int, ...] = (),
) -> Any:
    """`node` with every `${env:NAME}` / `${file:path[:key]}` in its strings replaced by the secret.

    Args:
        node: a raw config mapping (as read from YAML, properties or the environment).
        environ: where `${env:NAME}` looks NAME up.
        on_error: turns (key path, reason) into the exception to raise, so the caller names its
            file.
        path: the key path of `node` inside the config.

    Returns:
        A copy of `node`; resolved values are remembered in `known_secret_values`.
    """
    if isinstance(node, dict):
        return {
            key: resolve_references(value, environ, on_error, path + (key,))
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [
            resolve_references(value, environ, on_error, path + (index,))
            for index, value in enumerate(node)
        ]
    if not isinstance(node, str) or "${" not in node:
        return node

    def substitute(match: re.Match[str]) -> str:
        try:
            value = _resolve(match.group(1), match.group(2), environ)
        except SecretReferenceError as error:
            raise on_error(path, str(error)) from None
        remember_secret(value)
        return value

    return _REFERENCE.sub(substitute, node)


def _resolve(provider: str, argument: str, environ: Mapping[str, str]) -> str:
    if provider == "env":
        if argument not in environ:
            raise SecretReferenceError(
                f"${{env:{argument}}}: environment variable {argument} is not set"
            )
        return environ[argument]
    whole = Path(argument)
    if whole.is_file():
        return _read(whole).rstrip("\r\n")
    file_part, _, key = argument.rpartition(":")
    if file_part and Path(file_part).is_file():
        properties = _parse_properties(_read(Path(file_part)))
        if key not in properties:
            raise SecretReferenceError(f"${{file:{argument}}}: {file_part} has no key {key!r}")
        return properties[key]
    raise SecretReferenceError(f"${{file:{argument}}}: no such file")


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as error:
        raise SecretReferenceError(f"${{file:{path}}}: cannot read it ({error.strerror})") from None


def _parse_properties(text: str) -> dict[str, str]:
    """`key=value` / `key: value` lines, `#`/`!` comments: what a secrets properties file holds."""
    properties = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        match = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)$", stripped)
        if match:
            properties[match.group(1)] = match.group(2)
    return properties


def remember_secret(value: str) -> None:
    """Mask `value` wherever `mask_text` looks (log lines, `config show`) from now on."""
    if len(value) >= _SHORTEST_REMEMBERED:
        known_secret_values.add(value)


def is_secret_key(key: str) -> bool:
    """True for property names whose value is a credential (`sasl.jaas.config`,
    `s3.secret-access-key`, ...)."""
    return bool(_SECRET_KEY.search(key))


def mask_text(text: str) -> str:
    """`text` with URL passwords, `password=`/`AccountKey=`-style
    assignments and known secrets masked."""
    for value in sorted(known_secret_values, key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    text = _URL_PASSWORD.sub(lambda match: match.group(1) + MASK + "@", text)
    return _ASSIGNED_SECRET.sub(lambda match: match.group(1) + match.group(2) + MASK, text)


def mask_properties(properties: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a properties mapping with secret-named
    keys' values masked and the rest through `mask_text`."""
    return {
        key: MASK if is_secret_key(str(key)) else mask_strings(value)
        for key, value in properties.items()
    }


def mask_strings(value: Any) -> Any:
    """`value` (a string, or lists and mappings of them)
    with `mask_text` applied to every string in it."""
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, Mapping):
        return {key: mask_strings(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask_strings(item) for item in value]
    return value


def mask_field(value: Any) -> Any:
    """How a config model prints one field's value: secrets `MASK`, property mappings by key,
    strings by `mask_text`."""
    if isinstance(value, SecretStr):
        return MASK
    if isinstance(value, Mapping):
        return mask_properties(value)
    return mask_strings(value)


def masked_dump(model: BaseModel) -> dict[str, Any]:
    """`model.model_dump(mode="json")` with every secret
    masked: what `icekeeper config show` prints."""
    dumped: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            dumped[name] = masked_dump(value)
        elif isinstance(value, list) and any(isinstance(item, BaseModel) for item in value):
            dumped[name] = [
                masked_dump(item) if isinstance(item, BaseModel) else mask_field(item)
                for item in value
            ]
        else:
            dumped[name] = mask_field(
                to_jsonable_python(value) if not isinstance(value, SecretStr) else value
            )
    return dumped


def remember_secrets_in(model: BaseModel) -> None:
    """Remember a loaded config's `SecretStr` values, secret-named
    properties and URL passwords, for `mask_text`."""
    for name in type(model).model_fields:
        _remember(getattr(model, name))


def _remember(value: Any) -> None:
    if isinstance(value, BaseModel):
        remember_secrets_in(value)
    elif isinstance(value, SecretStr):
        remember_secret(value.get_secret_value())
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, str) and is_secret_key(str(key)):
                remember_secret(item)
            else:
                _remember(item)
    elif isinstance(value, list):
        for item in value:
            _remember(item)
    elif isinstance(value, str):
        for match in _URL_PASSWORD.finditer(value):
            remember_secret(match.group(0)[len(match.group(1)) : -1])

"""Structured, quiet-by-default logging shared by every icekeeper process.

Log lines are JSON objects on stderr (one per line) so they can be shipped and queried without
parsing; `extra={...}` fields become keys. The default level is WARNING: a healthy service
prints nothing. The level comes from the command line (`-v` INFO, `-vv` DEBUG, `--log-level`),
else from the config's `log_level` (which `ICEKEEPER__LOG_LEVEL` overrides, like any key).

Long first-run work (fetching jars with Maven, downloads) reports through the `PROGRESS_LOGGER`,
which shows INFO at the default level: minutes of silence look like a hang.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping

from icekeeper.common.config.secrets import mask_strings

_RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

LOG_LEVELS = ("debug", "info", "warning", "error")
"""The levels `--log-level` and the config's `log_level` take."""

LOG_LEVEL_ENV = "ICEKEEPER__LOG_LEVEL"
"""The config key `log_level` as an environment variable: read before the config is loaded too,
so that the loading itself logs at the level asked for."""

PROGRESS_LOGGER = "icekeeper.progress"
"""Progress of long first-run work: shown at the default level (INFO is let through), hidden only
by `--log-level error`."""

_explicit_level = False
"""Whether the command line set the level (then the config's `log_level` does not change it)."""


class JsonLineFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg, and any `extra` fields.

    Secrets are masked in every string (`common/config/secrets.py`): code should never log one,
    and this is the last line of defence when an exception message or a setting quotes one.

    Our own rather than python-json-logger's `JsonFormatter`: it is these dozen lines, the same
    keys in every process (Spark's driver included) with no renaming or reserved-attribute
    configuration to keep in step, and no dependency in every role's image for it.
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": mask_strings(record.getMessage()),
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                line[key] = mask_strings(
                    value
                    if isinstance(value, (str, int, float, bool, list, dict, type(None)))
                    else str(value)
                )
        if record.exc_info:
            line["exc"] = mask_strings(self.formatException(record.exc_info))
        return json.dumps(line, default=str)


def configure_logging(
    verbosity: int = 0, level: str | None = None, environ: Mapping[str, str] | None = None
) -> None:
    """Install the JSON formatter on the root logger at the level asked for.

    Args:
        verbosity: `-v` count: 0 = WARNING, 1 = INFO, 2+ = DEBUG.
        level: `--log-level` (one of `LOG_LEVELS`), which wins over `verbosity`.
        environ: where `ICEKEEPER__LOG_LEVEL` is looked up when neither is given (default
            `os.environ`).
    """
    global _explicit_level
    _explicit_level = bool(level or verbosity)
    if not _explicit_level:
        from_environment = (os.environ if environ is None else environ).get(LOG_LEVEL_ENV, "")
        level = from_environment.strip().lower() or None
        if level not in (None, *LOG_LEVELS):
            level = None  # the config loader names the bad value, as for any key
    if level is None:
        level = "warning" if verbosity <= 0 else "info" if verbosity == 1 else "debug"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    _set_levels(level)


def use_configured_level(level: str) -> None:
    """Apply the config's `log_level`, unless the command line set one (`-v`, `--log-level`)."""
    if not _explicit_level:
        _set_levels(level)


def _set_levels(level: str) -> None:
    numeric = getattr(logging, level.upper())
    logging.getLogger().setLevel(numeric)
    debug = numeric <= logging.DEBUG
    # Chatty libraries stay at WARNING unless DEBUG was asked for.
    for noisy in ("py4j", "azure", "urllib3", "pyiceberg", "botocore", "s3fs", "fsspec"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else max(numeric, logging.WARNING))
    # librdkafka reports transient broker states (coordinator loading, reconnects) as warnings.
    logging.getLogger("librdkafka").setLevel(logging.DEBUG if debug else logging.ERROR)
    logging.getLogger(PROGRESS_LOGGER).setLevel(
        logging.INFO if numeric <= logging.WARNING else numeric
    )

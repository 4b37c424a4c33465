"""Structured, quiet-by-default logging shared by every icekeeper process.

Log lines are JSON objects on stderr (one per line) so they can be shipped and queried without
parsing; `extra={...}` fields become keys. The default level is WARNING: a healthy service
prints nothing, `-v` shows INFO, `-vv` DEBUG.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from icekeeper.common.config.secrets import mask_strings

_RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


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


def configure_logging(verbosity: int = 0) -> None:
    """Install the JSON formatter on the root logger; 0 = WARNING, 1 = INFO, 2+ = DEBUG."""
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Chatty libraries stay at WARNING unless DEBUG was asked for.
    for noisy in ("py4j", "azure", "urllib3", "pyiceberg", "botocore", "s3fs", "fsspec"):
        logging.getLogger(noisy).setLevel(logging.WARNING if verbosity < 2 else logging.DEBUG)
    # librdkafka reports transient broker states (coordinator loading, reconnects) as warnings.
    logging.getLogger("librdkafka").setLevel(logging.ERROR if verbosity < 2 else logging.DEBUG)

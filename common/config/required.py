"""What a service needs from a config before it starts: a source to read, a table to write.

The model lists no source and no table by default (a deployment names its own; the development
commands use seed 000's: icekeeper/seed_defaults.py), so a config that validates may still give a
service nothing to do. These checks stop the service at start with a `ConfigError` that names the
file and the key to add, instead of a writer that reads nothing or a bookkeeper that waits forever.
"""

from __future__ import annotations

from icekeeper.common.config.loader import ConfigError, one_or_all
from icekeeper.common.config.model import IcekeeperConfig

SOURCE_EXAMPLE = (
    "`sources: [{bootstrap_servers: broker:9092, schema_registry_url: http://registry:8081, "
    "topics: [cdc.shop.orders]}]`"
)
TABLE_EXAMPLE = "`tables: [{identifier: shop.orders, topics: [cdc.shop.orders]}]`"


def require_sources(config: IcekeeperConfig, reason: str) -> None:
    """Stop unless the config lists a source.

    Args:
        reason: who needs one, as the end of a sentence ("the writer reads change data from them").

    Raises:
        ConfigError: naming `sources` and showing a source to add.
    """
    for error in _missing_sources(config, reason):
        raise error


def require_tables(config: IcekeeperConfig, reason: str, table_template: bool = True) -> None:
    """Stop unless the config lists a table, or (with `table_template`) a source names its tables
    through a `table_template`.

    Raises:
        ConfigError: naming `tables` and showing a table to add.
    """
    for error in _missing_tables(config, reason, table_template):
        raise error


def check_writer_config(config: IcekeeperConfig) -> None:
    """A writer needs sources that name their topics, and tables (or a `table_template`) to route
    their records to.

    Raises:
        ConfigError: naming the key to add (`ConfigErrors` naming each, when several are missing).
    """
    errors = writer_config_errors(config)
    if errors:
        raise one_or_all(errors)


def writer_config_errors(config: IcekeeperConfig) -> list[ConfigError]:
    """Every reason `check_writer_config` stops a writer for (none: the writer may start)."""
    errors = _missing_sources(config, "the writer reads change data from them")
    for index, source in enumerate(config.sources):
        if not source.topics and not source.topic_pattern:
            errors.append(
                ConfigError(
                    config.development.source,
                    f"sources[{index}].topics",
                    f"source {source.name!r} reads no topic: set `topics` or `topic_pattern`",
                )
            )
    return errors + _missing_tables(config, "the writer routes records to them")


def role_config_errors(config: IcekeeperConfig) -> dict[str, list[ConfigError]]:
    """Role -> the errors it stops at start for, by the checks above (`icekeeper config check`
    runs them all, for each role, so that a config it passes starts every role)."""
    return {
        "writer": writer_config_errors(config),
        "bookkeeper": _missing_tables(config, "the bookkeeper commits to them"),
        "reaper": _missing_tables(config, "the reaper maintains them", table_template=False),
    }


def _missing_sources(config: IcekeeperConfig, reason: str) -> list[ConfigError]:
    if config.sources:
        return []
    return [
        ConfigError(
            config.development.source,
            "sources",
            f"no source is listed, and {reason}: add one, e.g. {SOURCE_EXAMPLE} "
            "(docs/configuration.md)",
        )
    ]


def _missing_tables(
    config: IcekeeperConfig, reason: str, table_template: bool = True
) -> list[ConfigError]:
    if config.tables or (table_template and any(s.table_template for s in config.sources)):
        return []
    template = " and no source has a `table_template`" if table_template else ""
    return [
        ConfigError(
            config.development.source,
            "tables",
            f"no table is listed{template}, and {reason}: add one, e.g. {TABLE_EXAMPLE} "
            "(docs/configuration.md)",
        )
    ]

"""`icekeeper config check`: the checks every role runs on a config at start, all at once, and
with `--connect` whether what it names can be opened.

A config that passes here starts the writer, the bookkeeper and the reaper: the same functions
stop them (common/config/loader.py for keys and values, common/config/required.py for what each
role needs, common/spark.py for the catalog as Spark opens it). Every error is reported, not
the first, so one run shows every line to fix; a misspelt key names the key meant.

`--connect` then opens, read-only, what the roles will open: the catalog (and each listed
table), the storage of the warehouse and of the monikers, each source's Kafka cluster and schema
registry. No table, topic or message is created or changed (a table not created yet is
reported, not created); a local SQLite catalog and its warehouse folder are made empty, as the
roles' first start would make them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from icekeeper.common import exit_codes
from icekeeper.common.config import ConfigError, IcekeeperConfig, load_config
from icekeeper.common.config.loader import each_error
from icekeeper.common.config.required import role_config_errors
from icekeeper.common.config.secrets import mask_text

CONNECT_TIMEOUT_S = 5.0
"""How long a Kafka cluster or a registry may take to answer `--connect`."""


@dataclass
class ConfigCheck:
    """What `config check` found."""

    source: str
    config: IcekeeperConfig | None = None
    errors: list[tuple[ConfigError, list[str]]] = field(default_factory=list)
    """Each error, with the roles that stop for it (empty: the config does not load)."""
    reached: list[str] = field(default_factory=list)
    """With `--connect`: what was opened, one line each."""
    unreachable: list[str] = field(default_factory=list)
    """With `--connect`: what did not answer, one line each."""
    failed: list[str] = field(default_factory=list)
    """With `--connect`: what answered with an error (a table that cannot be loaded)."""

    @property
    def exit_code(self) -> int:
        if self.errors:
            return exit_codes.USAGE
        if self.unreachable:
            return exit_codes.UNAVAILABLE
        return exit_codes.FAILED if self.failed else exit_codes.OK

    def lines(self) -> list[str]:
        """The report, one line per finding (errors first), then a summary line; a secret a
        client's error quoted (a REST catalog's credential or header, a URL's password) masked."""
        return [mask_text(line) for line in self._lines()]

    def _lines(self) -> list[str]:
        found = [
            f"{error}" + (f" (stops {_roles(roles)})" if roles else "")
            for error, roles in self.errors
        ]
        found += [f"  {line}" for line in self.reached]
        found += [f"unreachable: {line}" for line in self.unreachable]
        found += [f"failed: {line}" for line in self.failed]
        if self.errors:
            count = len(self.errors)
            found.append(f"{count} error{'s' if count > 1 else ''} in {self.source}")
        elif self.config is not None:
            found.append(
                f"ok: {self.source} ({len(self.config.tables)} table(s), "
                f"{len(self.config.sources)} source(s)); the writer, the bookkeeper and the "
                "reaper start on it"
                + (
                    ""
                    if not (self.unreachable or self.failed)
                    else ", but not everything it names answered"
                )
            )
        return found


def _roles(roles: list[str]) -> str:
    """`['writer', 'reaper']` -> 'the writer and the reaper'."""
    named = [f"the {role}" for role in roles]
    return named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"


def check_config(path: str | None, connect: bool = False) -> ConfigCheck:
    """Load `path` (None: the embedded defaults, or `ICEKEEPER_CONFIG`) as every role does, run
    every role's start checks, and with `connect` open what the config names."""
    source = path or "<embedded defaults>"
    try:
        config = load_config(path)
    except ConfigError as error:
        return ConfigCheck(source, errors=[(each, []) for each in each_error(error)])
    check = ConfigCheck(config.development.source, config)
    by_message: dict[str, tuple[ConfigError, list[str]]] = {}
    for role, errors in [*role_config_errors(config).items(), *_spark_errors(config).items()]:
        for error in errors:
            # One line per key: the bookkeeper and the reaper miss the same `tables`.
            entry = by_message.setdefault(error.key or str(error), (error, []))
            if role not in entry[1]:
                entry[1].append(role)
    check.errors = list(by_message.values())
    if connect and not check.errors:
        _connect(config, check)
    return check


def _spark_errors(config: IcekeeperConfig) -> dict[str, list[ConfigError]]:
    """The Spark roles' check at session start: Spark opens the catalog under the same name."""
    from icekeeper.common.spark import iceberg_catalog_conf  # pyspark is imported lazily there

    try:
        iceberg_catalog_conf(config)
    except (ValueError, KeyError) as error:
        problem = ConfigError(config.development.source, "catalog.properties", str(error))
        return {"writer": [problem], "reaper": [problem]}
    return {}


def _connect(config: IcekeeperConfig, check: ConfigCheck) -> None:
    _probe(check, "catalog", lambda: _open_catalog(config))
    _probe(check, "storage", lambda: _open_storage(config))
    for source in config.sources:
        _probe(check, f"kafka {source.bootstrap_servers}", lambda s=source: _open_kafka(s))
        _probe(check, f"registry {source.schema_registry_url}", lambda s=source: _open_registry(s))


class _Failed(Exception):
    """A service answered, with an error the config or the data must fix."""


def _probe(check: ConfigCheck, what: str, opened: Callable[[], list[str]]) -> None:
    try:
        lines = opened()
    except _Failed as failure:
        check.failed.append(f"{what}: {failure}")
    except Exception as error:  # noqa: BLE001 - whatever the client raises, it did not answer
        check.unreachable.append(f"{what}: {type(error).__name__}: {_first_line(error)}")
    else:
        check.reached += [f"{what}: {line}" for line in lines]


def _open_catalog(config: IcekeeperConfig) -> list[str]:
    from pyiceberg.exceptions import NoSuchTableError

    from icekeeper.common.catalog import open_catalog

    catalog = open_catalog(config)
    namespaces = catalog.list_namespaces()
    lines = [f"{config.catalog.name} opened ({len(namespaces)} namespace(s))"]
    for spec in config.tables:
        try:
            table = catalog.load_table(spec.identifier)
        except NoSuchTableError:
            lines.append(f"{spec.identifier}: not created yet (the bookkeeper creates it)")
            continue
        except Exception as error:  # the catalog answered: the table is what fails
            raise _Failed(f"{spec.identifier} cannot be loaded: {_first_line(error)}") from error
        lines.append(f"{spec.identifier}: {len(table.snapshots())} snapshot(s)")
    return lines


def _open_storage(config: IcekeeperConfig) -> list[str]:
    from icekeeper.common.storage import open_filesystem
    from icekeeper.common.transports import open_transport

    lines = []
    warehouse = config.catalog.properties.get("warehouse")
    if warehouse:
        filesystem, path = open_filesystem(warehouse)
        found = filesystem.get_file_info(path).type.name.lower()
        lines.append(f"warehouse {warehouse}: {'empty' if found == 'notfound' else found}")
    transport = open_transport(config)
    lines.append(
        f"monikers ({config.transport.kind}): {len(transport.pending())} pending, "
        f"{transport.dead_letter_count()} dead-lettered"
    )
    lease = Path(config.group.lease_uri)
    lines.append(f"leases {lease}: {'present' if lease.is_dir() else 'made at first start'}")
    return lines


def _open_kafka(source) -> list[str]:  # noqa: ANN001 - KafkaSource
    from confluent_kafka.admin import AdminClient

    from icekeeper.common.kafka_clients import librdkafka_config

    # librdkafka's own lines (a refused connection, every retry) would bury the one line here.
    admin = AdminClient(librdkafka_config(source, {"log_level": 0}))
    topics = admin.list_topics(timeout=CONNECT_TIMEOUT_S).topics
    missing = [topic for topic in source.topics if topic not in topics]
    found = f"{len(topics)} topic(s)"
    return [found + (f"; not there yet: {', '.join(missing)}" if missing else "")]


def _open_registry(source) -> list[str]:  # noqa: ANN001 - KafkaSource
    from icekeeper.common.kafka_clients import registry_client

    subjects = registry_client(source).get_subjects()
    return [f"{len(subjects)} subject(s)"]


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]

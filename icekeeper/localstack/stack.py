"""`icekeeper stack up [--with mariadb postgres s3 rest ...] | down | status`:
run the local services as detached processes.

Each process started by `up` gets a pid file under `<state_dir>/stack/<service>/`.
`down` stops exactly those processes (their whole process group) and nothing else,
so a Kafka the user runs on the same machine is never touched. `up` is idempotent:
a healthy service with a live pid is left alone.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from icekeeper.common.artifacts import MavenBundle, Progress, maven_bundle
from icekeeper.common.config.model import IcekeeperConfig
from icekeeper.localstack.catalog_service import CatalogService
from icekeeper.localstack.connect import KafkaConnectService
from icekeeper.localstack.databases import (
    MariaDbService,
    PostgresCatalogService,
    PostgresService,
)
from icekeeper.localstack.errors import StackError, UnknownService
from icekeeper.localstack.hive_metastore import HiveMetastoreService
from icekeeper.localstack.object_store import S3Service
from icekeeper.localstack.rest_catalogs import NessieService, RestCatalogService
from icekeeper.localstack.secured import RegistryAuthService, SaslKafkaService
from icekeeper.localstack.services import LaunchSpec, Service, all_services
from icekeeper.localstack.settings import stack_settings

log = logging.getLogger(__name__)


@dataclass
class ServiceStatus:
    """What `stack status` shows for one service."""

    name: str
    address: str
    # "running", "stopped", "unhealthy", "foreign" (port taken by a process we did not start)
    state: str
    pid: int | None
    log: str


@dataclass
class StackReport:
    """Result of `stack up`."""

    services: list[ServiceStatus]
    started: list[str]
    seconds: float


OPTIONAL_SERVICES: dict[str, type[Service]] = {
    "mariadb": MariaDbService,
    "postgres": PostgresService,
    "connect": KafkaConnectService,
    "kafka-sasl": SaslKafkaService,
    "registry-auth": RegistryAuthService,
    "s3": S3Service,
    "rest": RestCatalogService,
    "nessie": NessieService,
    "hms": HiveMetastoreService,
    "pg-catalog": PostgresCatalogService,
}
"""Services `stack up --with <name>` adds, in start order."""

BROUGHT_ALONG: dict[str, tuple[str, ...]] = {
    "mariadb": ("connect",),
    "postgres": ("connect",),
    "rest": ("s3",),
    "nessie": ("s3",),
    "hms": ("s3",),
    "pg-catalog": ("s3",),
}
"""What an optional service is no use without: a CDC source without Debezium in Connect, a
catalog without the S3 server its tables live on."""


def with_dependencies(names: list[str]) -> list[str]:
    """Optional services to run for `--with names`, with what each brings along."""
    unknown = set(names) - set(OPTIONAL_SERVICES)
    if unknown:
        raise StackError(
            f"no optional service(s) {sorted(unknown)}; --with takes {sorted(OPTIONAL_SERVICES)}"
        )
    wanted = set(names) | {brought for name in names for brought in BROUGHT_ALONG.get(name, ())}
    return [name for name in OPTIONAL_SERVICES if name in wanted]


def started_optional_services(config: IcekeeperConfig) -> list[str]:
    """Optional services that `up` started in this state folder
    (their pid files exist), for `down` and `status`."""
    state_dir, cache_dir = Path(config.state_dir), Path(config.cache_dir)
    stack = stack_settings(config)
    return [
        name
        for name, kind in OPTIONAL_SERVICES.items()
        if _pid_file(kind(stack, state_dir, cache_dir)).exists()
    ]


class LocalStack:
    """The local Kafka, schema registry and Azurite of one
    state folder, plus the optional services asked for."""

    def __init__(
        self,
        config: IcekeeperConfig,
        only: list[str] | None = None,
        with_services: list[str] | None = None,
    ) -> None:
        """
        Args:
            config: state and cache folders, and the file's `stack:` section (ports, versions).
            only: manage just these services (of the core ones and those in `with_services`).
            with_services: optional services to add (`OPTIONAL_SERVICES`) with what each brings
                along (`BROUGHT_ALONG`: `connect` for a database, `s3` for a catalog).
        """
        self.config = config
        self.stack = stack_settings(config)
        state_dir, cache_dir = Path(config.state_dir), Path(config.cache_dir)
        optional = with_dependencies(with_services or [])
        services = all_services(self.stack, state_dir, cache_dir) + [
            OPTIONAL_SERVICES[name](self.stack, state_dir, cache_dir) for name in optional
        ]
        unknown = set(only or []) - {service.name for service in services}
        if unknown:
            raise UnknownService(
                f"no such service(s) {sorted(unknown)}; services: "
                f"{[service.name for service in services]}"
            )
        self.services: list[Service] = [
            service for service in services if not only or service.name in only
        ]
        # Every service by name, also those outside `only`, so a service's `needs` can be checked.
        self._known: dict[str, Service] = {service.name: service for service in services}
        for name, kind in OPTIONAL_SERVICES.items():
            self._known.setdefault(name, kind(self.stack, state_dir, cache_dir))

    def service(self, name: str) -> Service:
        return next(service for service in self.services if service.name == name)

    def spark_client_jars(self, progress: Progress = log.info) -> list[Path]:
        """Jars a SparkSession needs beyond icekeeper's own to reach the stack's S3 server and
        every catalog service (each one's `spark_catalog(...).packages`), fetched once.

        They must be on the session's classpath from its start (`spark.driver.extraClassPath`
        for a local session); a catalog's settings may then be given at any time before its
        first use.
        """
        packages = dict.fromkeys(
            package
            for service in self._known.values()
            if isinstance(service, CatalogService)
            for package in service.spark_catalog("probe").packages
        )
        bundle = MavenBundle(
            name=f"stack-spark-clients-iceberg-{self.stack.iceberg_version}",
            coordinates=tuple(packages),
            transitive=False,
        )
        return maven_bundle(Path(self.config.cache_dir), bundle, progress)

    def up(self, progress: Progress = log.info) -> StackReport:
        """Start every service that is not already running here; wait until all are healthy.

        Services with `needs` are launched once what they need answers (started now or earlier).
        """
        started_at = time.monotonic()
        to_start: list[Service] = []
        for service in self.services:
            status = self._status(service)
            if status.state == "running":
                continue
            if status.state == "unhealthy" and status.pid is not None:
                # Ours but not answering: maybe still starting from an earlier `up`.
                continue
            if service.port_in_use():
                raise StackError(
                    f"{service.name}: port(s) {service.ports()} already in use by a process this "
                    "stack did not start; change stack.* ports or stop it"
                )
            to_start.append(service)
        starting = {service.name for service in to_start}
        needed = [
            self._known[name]
            for name in dict.fromkeys(name for service in to_start for name in service.needs)
        ]
        for dependency in needed:
            if dependency.name not in starting and self._status(dependency).state not in (
                "running",
                "unhealthy",
            ):
                dependents = ", ".join(
                    service.name for service in to_start if dependency.name in service.needs
                )
                raise StackError(
                    f"{dependents} need(s) {dependency.name}, which is not running in this stack; "
                    "start it too (icekeeper stack up)"
                )
        launches = [(service, service.prepare(progress)) for service in to_start]
        for service, launch in launches:
            if service.needs:
                continue
            self._launch(service, launch, progress)
        if any(service.needs for service, _ in launches):
            self._wait_healthy(progress, needed)
            for service, launch in launches:
                if service.needs:
                    self._launch(service, launch, progress)
        self._wait_healthy(
            progress, [service for service in self.services if service not in needed]
        )
        return StackReport(
            services=self.status(),
            started=[service.name for service, _ in launches],
            seconds=time.monotonic() - started_at,
        )

    def _launch(self, service: Service, launch: LaunchSpec, progress: Progress) -> None:
        progress(f"starting {service.name} on {service.address()}")
        service.home.mkdir(parents=True, exist_ok=True)
        with open(service.log_path, "ab") as log_file:
            process = subprocess.Popen(
                launch.command,
                cwd=launch.cwd,
                env={**os.environ, **launch.environment} if launch.environment else None,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                **_as_user(launch.user),
            )
        _pid_file(service).write_text(
            json.dumps({"pid": process.pid, "command": launch.command}), encoding="utf-8"
        )

    def _wait_healthy(self, progress: Progress, services: list[Service]) -> None:
        deadline = time.monotonic() + self.stack.start_timeout
        pending = list(services)
        if not pending:
            return
        with ThreadPoolExecutor(max_workers=len(pending)) as pool:
            while pending:
                healthy = list(pool.map(lambda service: service.healthy(), pending))
                for service, ok in zip(list(pending), healthy):
                    if ok:
                        progress(f"{service.name} is ready at {service.address()}")
                        pending.remove(service)
                    elif _pid_file(service).exists() and not _alive(_read_pid(service)):
                        raise StackError(
                            f"{service.name} exited during start-up; see "
                            f"{service.log_path}:\n{_tail(service.log_path)}"
                        )
                if pending and time.monotonic() > deadline:
                    names = ", ".join(service.name for service in pending)
                    raise StackError(
                        f"not healthy after {self.stack.start_timeout:.0f}s: {names}; logs "
                        f"under {Path(self.config.state_dir) / 'stack'}"
                    )
                if pending:
                    time.sleep(0.25)

    def down(self, progress: Progress = log.info) -> list[str]:
        """Stop the processes `up` started (whole process groups); returns their names."""
        stopped = []
        for service in reversed(self.services):
            pid = _read_pid(service)
            if pid is None:
                continue
            if _alive(pid):
                progress(f"stopping {service.name} (pid {pid})")
                _stop_group(pid, service.stop_signal)
                stopped.append(service.name)
            _pid_file(service).unlink(missing_ok=True)
        return stopped

    def status(self) -> list[ServiceStatus]:
        """State of every service."""
        return [self._status(service) for service in self.services]

    def _status(self, service: Service) -> ServiceStatus:
        pid = _read_pid(service)
        ours = pid is not None and _alive(pid)
        if ours:
            state = "running" if service.healthy() else "unhealthy"
        else:
            state = "foreign" if service.port_in_use() else "stopped"
        return ServiceStatus(
            service.name, service.address(), state, pid if ours else None, str(service.log_path)
        )

    def describe(self) -> list[dict[str, object]]:
        return [asdict(status) for status in self.status()]


def _as_user(user: str | None) -> dict[str, object]:
    """`Popen` arguments that run the process as `user`, with that user's groups only."""
    if user is None:
        return {}
    account = pwd.getpwnam(user)
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _pid_file(service: Service) -> Path:
    return service.home / f"{service.name}.pid"


def _read_pid(service: Service) -> int | None:
    try:
        return int(json.loads(_pid_file(service).read_text(encoding="utf-8"))["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) is not alive for our purposes.
    return _threads_running(Path(f"/proc/{pid}"), missing=True)


def _threads_running(process: Path, missing: bool) -> bool:
    """Whether any thread of the process at `/proc/<pid>` is neither a zombie nor dead
    (`missing`: the answer when /proc cannot tell).

    The main thread alone is not enough: it turns zombie while other threads are still exiting,
    and the process keeps its files, listening sockets included, until the last one has (a Hive
    Metastore stopped and restarted at once found its port still taken).
    """
    try:
        tasks = list((process / "task").iterdir())
    except OSError:
        return missing
    for task in tasks:
        try:
            state = (task / "stat").read_text(encoding="utf-8").split(")")[-1].split()[0]
        except OSError:
            continue  # the thread is gone
        if state not in ("Z", "X"):
            return True
    return False


def _stop_group(pid: int, stop_signal: int = signal.SIGTERM, grace_s: float = 20.0) -> None:
    """Send the process group `stop_signal`, then SIGKILL whatever is left after `grace_s`."""
    try:
        group = os.getpgid(pid)
    except ProcessLookupError:
        return
    try:
        os.killpg(group, stop_signal)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _group_alive(group):
            return
        time.sleep(0.1)
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while _group_alive(group) and time.monotonic() < deadline + 5:
        time.sleep(0.1)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Members that are zombies only (their parent, us, has not reaped them) count as gone.
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().split(")")[-1].split()
            except OSError:
                continue
            if int(fields[2]) == group and _threads_running(entry, missing=False):
                return True
    return False


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"

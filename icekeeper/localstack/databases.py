"""The stack's CDC sources: a private MariaDB and a private PostgreSQL, set up for Debezium.

Each is the distribution's server (Debian's `mariadb-server` 10.11, `postgresql`) run as a private
instance: its own data folder under the state folder, its own port on the stack's host, started in
the foreground so `stack.py` tracks it by pid like every other service. Both servers refuse to run
as root, so as root they run as the system user their package created (`mysql`, `postgres`), and
otherwise as whoever runs `stack up`.

Every instance has two users with fixed, published passwords (local instances on loopback):
`icekeeper`, which owns the data the tests and the demo write, and `debezium`, which holds only
what Debezium's documentation asks for.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from icekeeper.common.artifacts import Progress
from icekeeper.common.jdbc_catalog import POSTGRES_JDBC_DRIVER
from icekeeper.localstack.catalog_service import CatalogService
from icekeeper.localstack.debian import MARIADB_SERVER, POSTGRESQL, ensure_package
from icekeeper.localstack.errors import StackError
from icekeeper.localstack.services import LaunchSpec, Service, port_open


@dataclass(frozen=True)
class DatabaseUser:
    """A login of the stack's databases (not secrets: the instances listen on loopback only)."""

    name: str
    password: str


OWNER = DatabaseUser("icekeeper", "icekeeper")
"""Owns the `icekeeper` database; creates tables and writes rows."""
DEBEZIUM = DatabaseUser("debezium", "debezium")
"""What Debezium connects as: replication rights, no more than its documentation asks for."""
DATABASE = "icekeeper"
"""The database created in both servers (MariaDB:
one of many; PostgreSQL: the one Debezium reads)."""

MARIADB_DEBEZIUM_GRANTS = (
    "SELECT",
    "RELOAD",
    "SHOW DATABASES",
    "LOCK TABLES",
    "REPLICATION SLAVE",
    "BINLOG MONITOR",
)
"""Debezium's MariaDB connector documentation; BINLOG MONITOR is MariaDB's name for REPLICATION
CLIENT since 10.5."""


def _server_user(system_user: str, package: str) -> pwd.struct_passwd:
    """Who runs the server: as root, the system user of its
    package (the servers refuse root); else ourselves."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    try:
        return pwd.getpwnam(system_user)
    except KeyError:
        raise StackError(
            f"no system user {system_user!r}; it comes with the Debian package {package} (apt-get "
            f"install {package})"
        ) from None


def _as_user(user: pwd.struct_passwd) -> list[str]:
    """Command prefix that runs a program as `user` (nothing when that is who we are)."""
    return [] if user.pw_uid == os.geteuid() else ["runuser", "-u", user.pw_name, "--"]


def _give_to(user: pwd.struct_passwd, *folders: Path) -> None:
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        if user.pw_uid != os.geteuid():
            shutil.chown(folder, user.pw_uid, user.pw_gid)
        folder.chmod(0o700)


def _can_reach(user: pwd.struct_passwd, folder: Path) -> bool:
    """Whether `user` can write `folder`: every folder above it must let that user through."""
    return (
        user.pw_uid == os.geteuid()
        or subprocess.run(
            _as_user(user) + ["test", "-w", str(folder)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )


def _server_folder(user: pwd.struct_passwd, home: Path) -> Path:
    """Where a server running as `user` keeps its files: `<home>/server`, or, when a folder above
    the state folder shuts `user` out (a clone under a 0700 `mktemp -d`, /root, pytest's tmp_path),
    a folder of its own under the system's temp folder, tied to this state folder.

    The servers refuse to run as root, so as root they run as their package's user, who must reach
    their data. A fresh state folder (no `server-folder` note in it) starts the fallback afresh, as
    a fresh `<home>/server` would.
    """
    home.mkdir(parents=True, exist_ok=True)
    preferred = home / "server"
    _give_to(user, preferred)
    if _can_reach(user, preferred):
        return preferred
    note = home / "server-folder"
    digest = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:12]
    fallback = Path(tempfile.gettempdir()) / f"icekeeper-{user.pw_name}-{digest}"
    if not note.exists() and fallback.exists():
        shutil.rmtree(fallback)  # left by an earlier state folder of the same path
    _give_to(user, fallback)
    note.write_text(f"{fallback}\n", encoding="utf-8")
    if not _can_reach(user, fallback):
        raise StackError(f"user {user.pw_name} can reach neither {preferred} nor {fallback}")
    return fallback


def _run_logged(
    command: list[str], log_path: Path, what: str, stdin_text: str | None = None
) -> str:
    result = subprocess.run(command, input=stdin_text, capture_output=True, text=True, check=False)
    output = result.stdout + result.stderr
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(command)}\n{output}\n")
    if result.returncode != 0:
        raise StackError(
            f"{what} failed (exit {result.returncode}); see {log_path}:\n{output[-3000:]}"
        )
    return output


class MariaDbService(Service):
    """MariaDB with its binlog in ROW format and full row images, as Debezium needs."""

    name = "mariadb"

    def address(self) -> str:
        return f"mysql://{self.stack.host}:{self.stack.mariadb_port}"

    def ports(self) -> list[int]:
        return [self.stack.mariadb_port]

    def prepare(self, progress: Progress) -> LaunchSpec:
        programs = ensure_package(MARIADB_SERVER, "stack service mariadb", progress)
        mysql = _server_user("mysql", MARIADB_SERVER.name)
        run_as = [f"--user={mysql.pw_name}"] if os.geteuid() == 0 else []
        server = _server_folder(mysql, self.home)
        data_dir, run_dir = server / "data", server / "run"
        _give_to(mysql, run_dir)
        if not (data_dir / "mysql").is_dir():
            progress(f"initialising MariaDB in {data_dir}")
            if data_dir.exists():
                shutil.rmtree(data_dir)  # a half-made folder from an interrupted start
            _give_to(mysql, data_dir)
            _run_logged(
                [
                    programs["mariadb-install-db"],
                    "--no-defaults",
                    *run_as,
                    f"--datadir={data_dir}",
                    "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                ],
                self.home / "install-db.log",
                "mariadb-install-db",
            )
        init_file = server / "init.sql"
        init_file.write_text(self._init_sql(), encoding="utf-8")
        init_file.chmod(0o644)
        command = [
            programs["mariadbd"],
            "--no-defaults",
            *run_as,
            f"--datadir={data_dir}",
            f"--socket={run_dir / 'mariadb.sock'}",
            f"--pid-file={run_dir / 'mariadbd.pid'}",
            f"--bind-address={self.stack.host}",
            f"--port={self.stack.mariadb_port}",
            "--skip-name-resolve",
            # What Debezium's MariaDB connector needs: a binlog of full row images.
            "--log-bin=mariadb-bin",
            "--binlog-format=ROW",
            "--binlog-row-image=FULL",
            "--server-id=1",
            "--character-set-server=utf8mb4",
            # Users and grants, re-applied before every start accepts connections.
            f"--init-file={init_file}",
        ]
        return LaunchSpec(command=command, cwd=self.home)

    @staticmethod
    def _init_sql() -> str:
        grants = ", ".join(MARIADB_DEBEZIUM_GRANTS)
        return "\n".join(
            [
                # Anonymous accounts would shadow ours for some client hosts.
                "DELETE FROM mysql.global_priv WHERE User = '';",
                "FLUSH PRIVILEGES;",
                f"CREATE USER IF NOT EXISTS '{OWNER.name}'@'%' IDENTIFIED BY '{OWNER.password}';",
                f"GRANT ALL PRIVILEGES ON *.* TO '{OWNER.name}'@'%' WITH GRANT OPTION;",
                f"CREATE USER IF NOT EXISTS '{DEBEZIUM.name}'@'%' IDENTIFIED BY "
                f"'{DEBEZIUM.password}';",
                f"GRANT {grants} ON *.* TO '{DEBEZIUM.name}'@'%';",
                f"CREATE DATABASE IF NOT EXISTS {DATABASE} CHARACTER SET utf8mb4;",
                "",
            ]
        )

    def healthy(self) -> bool:
        if not port_open(self.stack.host, self.stack.mariadb_port):
            return False
        import pymysql

        try:
            # As debezium: the init file has run once its account exists.
            connection = pymysql.connect(
                host=self.stack.host,
                port=self.stack.mariadb_port,
                user=DEBEZIUM.name,
                password=DEBEZIUM.password,
                connect_timeout=2,
            )
        except pymysql.MySQLError:
            return False
        with connection:
            with connection.cursor() as cursor:
                cursor.execute("SELECT @@log_bin, @@binlog_format")
                return cursor.fetchone() == (1, "ROW")


class PostgresService(Service):
    """PostgreSQL with `wal_level=logical`, for Debezium's
    connector through the built-in pgoutput plugin."""

    name = "postgres"
    # Fast shutdown: SIGTERM is PostgreSQL's "smart" one, which waits for every client to leave.
    stop_signal = signal.SIGINT

    def port(self) -> int:
        return self.stack.postgres_port

    def address(self) -> str:
        return f"postgresql://{self.stack.host}:{self.port()}/{DATABASE}"

    def ports(self) -> list[int]:
        return [self.port()]

    def prepare(self, progress: Progress) -> LaunchSpec:
        programs = ensure_package(POSTGRESQL, f"stack service {self.name}", progress)
        postgres = _server_user("postgres", POSTGRESQL.name)
        data_dir = _server_folder(postgres, self.home) / "data"
        initialised = self.home / "initialised"
        # The marker alone is not enough: state left by
        # an older layout has it but no data folder here.
        if not initialised.exists() or not (data_dir / "PG_VERSION").exists():
            progress(f"initialising PostgreSQL in {data_dir}")
            if data_dir.exists():
                shutil.rmtree(data_dir)  # a half-made folder from an interrupted start
            _give_to(postgres, data_dir)
            as_postgres = _as_user(postgres)
            _run_logged(
                as_postgres
                + [
                    programs["initdb"],
                    "-D",
                    str(data_dir),
                    "-U",
                    "postgres",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--auth-local=peer",
                    "--auth-host=scram-sha-256",
                ],
                self.home / "initdb.log",
                "initdb",
            )
            # Single-user mode runs the bootstrap SQL without a server listening anywhere.
            output = _run_logged(
                as_postgres + [programs["postgres"], "--single", "-D", str(data_dir), "postgres"],
                self.home / "initdb.log",
                "PostgreSQL bootstrap",
                stdin_text=self._bootstrap_sql(),
            )
            if "ERROR:" in output:
                raise StackError(
                    "PostgreSQL bootstrap SQL failed; see "
                    f"{self.home / 'initdb.log'}:\n{output[-3000:]}"
                )
            initialised.touch()
        # `pg_ctl start` would daemonise and leave no process of ours to track: run the server
        # itself, in the foreground, as postgres.
        command = [
            programs["postgres"],
            "-D",
            str(data_dir),
            "-h",
            self.stack.host,
            "-p",
            str(self.port()),
            "-k",
            "",  # no Unix socket: clients use TCP on the stack's host
            *(option for setting in self._settings() for option in ("-c", setting)),
        ]
        # As root the server runs as postgres, started so by `stack.py` without runuser in between.
        run_as = postgres.pw_name if postgres.pw_uid != os.geteuid() else None
        return LaunchSpec(command=command, cwd=self.home, user=run_as)

    def _settings(self) -> list[str]:
        """`name=value` server settings: what Debezium's logical decoding needs."""
        return ["wal_level=logical", "max_wal_senders=10", "max_replication_slots=10"]

    def _bootstrap_sql(self) -> str:
        # One statement per line: single-user mode ends a statement at a newline.
        return "\n".join(
            [
                f"CREATE ROLE {OWNER.name} LOGIN PASSWORD '{OWNER.password}';",
                f"CREATE ROLE {DEBEZIUM.name} REPLICATION LOGIN PASSWORD '{DEBEZIUM.password}';",
                # Debezium's docs: publications of tables need their owner's
                # rights; a replication user that is a member of the owning role
                # has them (and SELECT for the snapshot) without superuser.
                f"GRANT {OWNER.name} TO {DEBEZIUM.name};",
                f"CREATE DATABASE {DATABASE} OWNER {OWNER.name};",
                "",
            ]
        )

    def healthy(self) -> bool:
        if not port_open(self.stack.host, self.port()):
            return False
        import psycopg

        try:
            with psycopg.connect(
                host=self.stack.host,
                port=self.port(),
                user=DEBEZIUM.name,
                password=DEBEZIUM.password,
                dbname=DATABASE,
                connect_timeout=2,
            ) as connection:
                return connection.execute("SHOW wal_level").fetchone() == ("logical",)
        except psycopg.Error:
            return False


CATALOG_DATABASE = "iceberg_catalog"
"""The database of the stack's SQL catalog (`pg-catalog`), owned by `OWNER`."""


class PostgresCatalogService(PostgresService, CatalogService):
    """A PostgreSQL of its own (`stack.pg_catalog_port`) holding an Iceberg SQL catalog: the
    tables pyiceberg's SqlCatalog and Iceberg's JdbcCatalog share (schema V1), warehouse on S3.

    A separate instance from the CDC source `postgres`: a catalog outlives and ignores the
    databases it describes, and needs no logical decoding.
    """

    name = "pg-catalog"

    def port(self) -> int:
        return self.stack.pg_catalog_port

    def address(self) -> str:
        return f"postgresql://{self.stack.host}:{self.port()}/{CATALOG_DATABASE}"

    def _settings(self) -> list[str]:
        return []

    def _bootstrap_sql(self) -> str:
        return "\n".join(
            [
                f"CREATE ROLE {OWNER.name} LOGIN PASSWORD '{OWNER.password}';",
                f"CREATE DATABASE {CATALOG_DATABASE} OWNER {OWNER.name};",
                "",
            ]
        )

    def healthy(self) -> bool:
        if not port_open(self.stack.host, self.port()):
            return False
        import psycopg

        try:
            with psycopg.connect(
                host=self.stack.host,
                port=self.port(),
                user=OWNER.name,
                password=OWNER.password,
                dbname=CATALOG_DATABASE,
                connect_timeout=2,
            ) as connection:
                return connection.execute("SELECT current_database()").fetchone() == (
                    CATALOG_DATABASE,
                )
        except psycopg.Error:
            return False

    def pyiceberg_properties(self) -> dict[str, str]:
        # SQLAlchemy's psycopg (3) dialect: the driver the stack already installs.
        uri = (
            f"postgresql+psycopg://{OWNER.name}:{OWNER.password}@{self.stack.host}:{self.port()}"
            f"/{CATALOG_DATABASE}"
        )
        return {
            "type": "sql",
            "uri": uri,
            "warehouse": self.warehouse(),
            **self.storage.pyiceberg_properties(),
        }

    def iceberg_catalog_properties(self) -> dict[str, str]:
        return {
            "type": "jdbc",
            "uri": f"jdbc:postgresql://{self.stack.host}:{self.port()}/{CATALOG_DATABASE}",
            "jdbc.user": OWNER.name,
            "jdbc.password": OWNER.password,
            # The tables pyiceberg's SqlCatalog creates (Iceberg's V1 layout, views included).
            "jdbc.schema-version": "V1",
            "warehouse": self.warehouse(),
        }

    def extra_spark_packages(self) -> tuple[str, ...]:
        return (POSTGRES_JDBC_DRIVER,)

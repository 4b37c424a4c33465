"""The stack's Hive Metastore (`stack up --with hms`): 3.1.3 standalone, Derby, tables on S3.

Seed 000 registered its tables in a Hive Metastore; Iceberg's Hive catalog (pyiceberg's and
Spark's) still speaks to one over Thrift. 3.1.3 it is: Hive 4.x removed the `get_table` call that
every Iceberg client makes (`Invalid method name: 'get_table'`; pyiceberg #1222, apache/iceberg
#12878).

The standalone metastore's tarball (its schema scripts are only there) runs on Hadoop 3.1.0's
client jars, plus hadoop-aws: the metastore itself makes each database's and table's folder, so
it reaches the stack's S3 server through s3a, with the `s3` scheme mapped to s3a so that every
location it hands out is `s3://...` like everyone else's. Its Derby database lives under the
state folder, its schema created once (`MetastoreSchemaTool -initSchema`). 3.1.3 has no setting
for the address it binds: unlike the stack's other services it listens on every interface.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from xml.sax.saxutils import escape

from icekeeper.common.artifacts import (
    MavenBundle,
    Progress,
    maven_bundle,
    maven_file_url,
    unpacked_archive,
)
from icekeeper.localstack.catalog_service import CatalogService
from icekeeper.localstack.errors import StackError
from icekeeper.localstack.java import find_java
from icekeeper.localstack.services import LaunchSpec, port_open

HADOOP_VERSION = "3.1.0"
"""The Hadoop Hive 3.1.3 was built against (its tarball carries no Hadoop)."""
_JAVA_17_OPENS = (
    "java.base/java.lang",
    "java.base/java.util",
    "java.base/java.net",
    "java.base/java.nio",
    "java.base/sun.nio.ch",
)
"""Hive 3 and Hadoop 3.1 reach into these on Java 17."""


LOCK_TIMEOUT_S = 60
"""Seconds after which the stack's metastore releases a lock nobody heartbeats
(`metastore.txn.timeout`)."""


class HiveMetastoreService(CatalogService):
    """Hive Metastore 3.1.3 on Thrift (`stack.hive_metastore_port`), Derby, warehouse on S3."""

    name = "hms"

    def address(self) -> str:
        return f"thrift://{self.stack.host}:{self.stack.hive_metastore_port}"

    def ports(self) -> list[int]:
        return [self.stack.hive_metastore_port]

    def hadoop_bundle(self) -> MavenBundle:
        return MavenBundle(
            name=f"hive-metastore-hadoop-{HADOOP_VERSION}",
            coordinates=(
                f"org.apache.hadoop:hadoop-common:{HADOOP_VERSION}",
                f"org.apache.hadoop:hadoop-mapreduce-client-core:{HADOOP_VERSION}",
                f"org.apache.hadoop:hadoop-hdfs-client:{HADOOP_VERSION}",
                # s3a, with the AWS SDK 1.11 bundle it was built for (86 MB).
                f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}",
                # That SDK's XML binding needs javax.activation, gone from the JDK since 11.
                "com.sun.activation:javax.activation:1.2.0",
            ),
            # Hive logs through log4j2 (its own jars); Hadoop 3.1's log4j 1 binding would compete.
            exclusions=("org.slf4j:slf4j-log4j12", "log4j:log4j"),
        )

    def prepare(self, progress: Progress) -> LaunchSpec:
        version = self.stack.hive_metastore_version
        url = maven_file_url(
            f"org.apache.hive:hive-standalone-metastore:{version}",
            classifier="bin",
            extension="tar.gz",
        )
        unpacked = unpacked_archive(
            self.cache_dir, f"hive-standalone-metastore-{version}", url, progress
        )
        metastore_home = next(unpacked.glob("apache-hive-metastore-*"), None)
        if metastore_home is None:
            raise StackError(f"no apache-hive-metastore-* folder in {unpacked}")
        hadoop_jars = maven_bundle(self.cache_dir, self.hadoop_bundle(), progress)
        # Hadoop 3.1 asks for Subject.getSubject, which Java 23 and later refuse.
        java = find_java(17, purpose=f"Hive Metastore {version}", max_major=21)
        conf = self.home / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "metastore-site.xml").write_text(self._site_xml(), encoding="utf-8")
        (conf / "log4j2.properties").write_text(_log4j2_properties(), encoding="utf-8")
        classpath = ":".join(
            [str(conf), str(metastore_home / "lib" / "*"), str(hadoop_jars[0].parent / "*")]
        )
        jvm = [
            java,
            "-Xms64m",
            "-Xmx512m",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configurationFile={conf / 'log4j2.properties'}",
            f"-Dderby.system.home={self.home}",
            *(f"--add-opens={module}=ALL-UNNAMED" for module in _JAVA_17_OPENS),
            "-cp",
            classpath,
        ]
        initialised = self.home / "schema-initialised"
        # The marker alone is not enough: a Derby folder removed by hand would come back empty.
        if not initialised.exists() or not self.derby_dir.is_dir():
            progress(f"creating the Hive Metastore {version} schema in Derby (once)")
            self._init_schema(jvm, metastore_home)
            initialised.touch()
        return LaunchSpec(
            command=[*jvm, "org.apache.hadoop.hive.metastore.HiveMetaStore"], cwd=self.home
        )

    @property
    def derby_dir(self) -> Path:
        return self.home / "metastore_db"

    def _init_schema(self, jvm: list[str], metastore_home: Path) -> None:
        """Create the metastore's tables in a fresh Derby database (a half-made one from an
        interrupted start is dropped first: the marker is written only after this succeeds)."""
        if self.derby_dir.exists():
            shutil.rmtree(self.derby_dir)
        result = subprocess.run(
            [
                *jvm,
                "org.apache.hadoop.hive.metastore.tools.MetastoreSchemaTool",
                "-dbType",
                "derby",
                "-initSchema",
            ],
            # The schema tool finds its SQL scripts under METASTORE_HOME.
            env={**os.environ, "METASTORE_HOME": str(metastore_home)},
            cwd=self.home,
            capture_output=True,
            text=True,
            check=False,
        )
        schema_log = self.home / "schema-tool.log"
        schema_log.write_text(result.stdout + result.stderr, encoding="utf-8")
        if result.returncode != 0:
            raise StackError(
                f"the Hive Metastore schema tool failed (exit {result.returncode}); see "
                f"{schema_log}:\n{(result.stdout + result.stderr)[-3000:]}"
            )

    def _site_xml(self) -> str:
        storage = self.storage
        settings = {
            "metastore.thrift.port": str(self.stack.hive_metastore_port),
            "javax.jdo.option.ConnectionURL": (
                f"jdbc:derby:;databaseName={self.derby_dir};create=true"
            ),
            "javax.jdo.option.ConnectionDriverName": "org.apache.derby.jdbc.EmbeddedDriver",
            "metastore.warehouse.dir": self.warehouse(),
            # 3.1.3 does not start without these two (its defaults name classes that live in the
            # full Hive, not in the standalone metastore).
            "metastore.expression.proxy": (
                "org.apache.hadoop.hive.metastore.DefaultPartitionExpressionProxy"
            ),
            "metastore.task.threads.always": ",".join(
                f"org.apache.hadoop.hive.metastore.{task}"
                for task in (
                    "events.EventCleanerTask",
                    "RuntimeStatsCleanerTask",
                    "MaterializationsRebuildLockCleanerTask",
                    "txn.AcidHouseKeeperService",
                )
            ),
            # A lock whose client died (a commit killed half way: pyiceberg does not heartbeat
            # its locks) is released once older than the timeout by the housekeeper above; the
            # standalone metastore never starts it otherwise (it is one of the compactor's
            # tasks, and the compactor's classes are not in it). Commits take well under this.
            "metastore.txn.timeout": f"{LOCK_TIMEOUT_S}s",
            "metastore.acid.housekeeper.interval": "10s",
            # s3:// locations through s3a, on the stack's S3 server.
            "fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "fs.s3a.endpoint": storage.address(),
            "fs.s3a.endpoint.region": self.stack.s3_region,
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": "false",
            "fs.s3a.access.key": self.stack.s3_access_key_id,
            "fs.s3a.secret.key": self.stack.s3_secret_access_key,
        }
        properties = "".join(
            f"  <property><name>{escape(key)}</name><value>{escape(value)}</value></property>\n"
            for key, value in settings.items()
        )
        return f"<configuration>\n{properties}</configuration>\n"

    def healthy(self) -> bool:
        if not port_open(self.stack.host, self.stack.hive_metastore_port):
            return False
        # pyiceberg's Thrift stubs; its own client sets no socket timeout, a probe needs one.
        from hive_metastore.ThriftHiveMetastore import Client
        from thrift.protocol.TBinaryProtocol import TBinaryProtocol
        from thrift.transport.TSocket import TSocket
        from thrift.transport.TTransport import TBufferedTransport

        socket = TSocket(self.stack.host, self.stack.hive_metastore_port)
        socket.setTimeout(3000)
        transport = TBufferedTransport(socket)
        try:
            transport.open()
            return "default" in Client(TBinaryProtocol(transport)).get_all_databases()
        except Exception:  # noqa: BLE001 - any Thrift or socket error means "not ready yet"
            return False
        finally:
            transport.close()

    def pyiceberg_properties(self) -> dict[str, str]:
        return {
            "type": "hive",
            "uri": self.address(),
            "warehouse": self.warehouse(),
            **self.storage.pyiceberg_properties(),
        }

    def iceberg_catalog_properties(self) -> dict[str, str]:
        # Spark's Hive catalog talks to the metastore with PySpark's own Hive 2.3 client.
        return {"type": "hive", "uri": self.address(), "warehouse": self.warehouse()}


def _log4j2_properties() -> str:
    # Standard error is the service's log; the metastore's INFO lines are one per call.
    return (
        "status = error\n"
        "appender.console.type = Console\n"
        "appender.console.name = console\n"
        "appender.console.target = SYSTEM_ERR\n"
        "appender.console.layout.type = PatternLayout\n"
        "appender.console.layout.pattern = %d{ISO8601} %5p [%t] %c{2}: %m%n\n"
        "rootLogger.level = WARN\n"
        "rootLogger.appenderRef.console.ref = console\n"
        "logger.datanucleus.name = DataNucleus\nlogger.datanucleus.level = ERROR\n"
    )

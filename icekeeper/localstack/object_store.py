"""The stack's S3 server (`stack up --with s3`): s3proxy over files under the state folder.

s3proxy (Maven Central, one self-contained jar) serves the S3 API with its `filesystem` backend:
each folder under `<state>/stack/s3/data` is a bucket, each file an object, so the bucket
`stack.s3_bucket` exists from the start (its folder is made before launch) and everything in it
survives a restart. It answers signed requests only (V2 or V4) with the stack's published key,
and honours conditional writes (`If-None-Match: *`, `If-Match`), as AWS S3 does.

Besides running it, this module says how each client reaches it, with the property names users
know: pyiceberg's `s3.*`, Iceberg's S3FileIO for Spark (plus the jars it needs), Hadoop's s3a for
Spark's own Parquet, and a DuckDB secret. `s3://<bucket>/<path>` is the one URI form for all of
them (Spark's Hadoop paths map the `s3` scheme to s3a).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from icekeeper.common.artifacts import Progress, maven_file
from icekeeper.localstack.java import find_java
from icekeeper.localstack.services import LaunchSpec, Service, port_open

if TYPE_CHECKING:
    from pyarrow.fs import S3FileSystem

S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
HADOOP_AWS_VERSION = "3.4.2"
"""hadoop-aws of the Hadoop that PySpark 4.1.1 ships (hadoop-client-api 3.4.2)."""
AWS_SDK_TRANSFER_MANAGER_VERSION = "2.44.4"
"""The one AWS SDK module s3a needs beyond what iceberg-aws-bundle carries (its S3 client): the
SDK's own `bundle` would add ~600 MB for the same classes."""


class S3Service(Service):
    """s3proxy 4.x with a filesystem backend, one bucket made at start."""

    name = "s3"

    def address(self) -> str:
        return f"http://{self.stack.host}:{self.stack.s3_port}"

    def ports(self) -> list[int]:
        return [self.stack.s3_port]

    @property
    def data_dir(self) -> Path:
        """Where the objects are: one folder per bucket."""
        return self.home / "data"

    def uri(self, path: str = "") -> str:
        """`s3://<bucket>/<path>`: a location in the stack's bucket, as every client names it."""
        return f"s3://{self.stack.s3_bucket}/{path.lstrip('/')}"

    def prepare(self, progress: Progress) -> LaunchSpec:
        jar = maven_file(
            self.cache_dir,
            f"org.gaul:s3proxy:{self.stack.s3proxy_version}",
            classifier="jar-with-dependencies",
            progress=progress,
        )
        java = find_java(17, purpose=f"s3proxy {self.stack.s3proxy_version}")
        # The filesystem backend's buckets are folders: this one exists before the first request.
        (self.data_dir / self.stack.s3_bucket).mkdir(parents=True, exist_ok=True)
        properties = self.home / "s3proxy.properties"
        properties.write_text(
            "".join(f"{key}={value}\n" for key, value in self._properties().items()),
            encoding="utf-8",
        )
        command = [
            java,
            "-Xms64m",
            "-Xmx512m",
            "-Djava.awt.headless=true",
            "-jar",
            str(jar),
            "--properties",
            str(properties),
        ]
        return LaunchSpec(command=command, cwd=self.home)

    def _properties(self) -> dict[str, str]:
        return {
            "s3proxy.endpoint": self.address(),
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": self.stack.s3_access_key_id,
            "s3proxy.credential": self.stack.s3_secret_access_key,
            "jclouds.provider": "filesystem",
            "jclouds.filesystem.basedir": str(self.data_dir),
        }

    def filesystem(self) -> S3FileSystem:
        """A pyarrow filesystem on the server (paths are `<bucket>/<key>`)."""
        from pyarrow.fs import AwsStandardS3RetryStrategy, S3FileSystem

        return S3FileSystem(
            access_key=self.stack.s3_access_key_id,
            secret_key=self.stack.s3_secret_access_key,
            region=self.stack.s3_region,
            endpoint_override=self.address(),
            scheme="http",
            force_virtual_addressing=False,
            connect_timeout=2,
            request_timeout=5,
            retry_strategy=AwsStandardS3RetryStrategy(max_attempts=1),
        )

    def healthy(self) -> bool:
        if not port_open(self.stack.host, self.stack.s3_port):
            return False
        from pyarrow.fs import FileSelector

        try:
            # A signed ListBuckets: the server runs, takes our key, and has the bucket.
            buckets = self.filesystem().get_file_info(FileSelector("", recursive=False))
        except OSError:
            return False
        return self.stack.s3_bucket in {bucket.path for bucket in buckets}

    def pyiceberg_properties(self) -> dict[str, str]:
        """pyiceberg's FileIO properties (also those of a catalog) for this server."""
        return {
            "s3.endpoint": self.address(),
            "s3.access-key-id": self.stack.s3_access_key_id,
            "s3.secret-access-key": self.stack.s3_secret_access_key,
            "s3.region": self.stack.s3_region,
            "s3.path-style-access": "true",
        }

    def iceberg_java_properties(self) -> dict[str, str]:
        """Iceberg's S3FileIO properties of a catalog (Spark, and Java catalog servers)."""
        return {
            "io-impl": S3_FILE_IO,
            "s3.endpoint": self.address(),
            "s3.path-style-access": "true",
            "s3.access-key-id": self.stack.s3_access_key_id,
            "s3.secret-access-key": self.stack.s3_secret_access_key,
            "client.region": self.stack.s3_region,
        }

    def spark_packages(self) -> tuple[str, ...]:
        """Maven coordinates of the jars Spark needs for this server, beyond icekeeper's own:
        Iceberg's S3FileIO with its AWS SDK, and Hadoop's s3a."""
        return (
            f"org.apache.iceberg:iceberg-aws-bundle:{self.stack.iceberg_version}",
            f"org.apache.hadoop:hadoop-aws:{HADOOP_AWS_VERSION}",
            f"software.amazon.awssdk:s3-transfer-manager:{AWS_SDK_TRANSFER_MANAGER_VERSION}",
        )

    def spark_hadoop_conf(self) -> dict[str, str]:
        """Spark settings for plain files on this server through Hadoop's s3a, under the same
        `s3://` URIs as Iceberg's.

        As given (`spark.hadoop.*`) they count at a session's start; on a running session, set
        them without the `spark.hadoop.` prefix (Spark copies its SQL settings into the Hadoop
        configuration of each read and write as they are).
        """
        prefix = "spark.hadoop.fs.s3a"
        return {
            "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            f"{prefix}.endpoint": self.address(),
            f"{prefix}.endpoint.region": self.stack.s3_region,
            f"{prefix}.path.style.access": "true",
            f"{prefix}.connection.ssl.enabled": "false",
            f"{prefix}.access.key": self.stack.s3_access_key_id,
            f"{prefix}.secret.key": self.stack.s3_secret_access_key,
        }

    def duckdb_statements(self) -> list[str]:
        """Statements that let DuckDB (with httpfs loaded) read `s3://` URIs of this server."""
        return [
            "CREATE OR REPLACE SECRET icekeeper_stack_s3 (TYPE S3, "
            f"KEY_ID '{self.stack.s3_access_key_id}', SECRET '{self.stack.s3_secret_access_key}', "
            f"ENDPOINT '{self.stack.host}:{self.stack.s3_port}', URL_STYLE 'path', "
            f"USE_SSL false, REGION '{self.stack.s3_region}')"
        ]

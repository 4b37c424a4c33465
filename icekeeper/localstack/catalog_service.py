"""What a client needs to open one of the stack's Iceberg catalogs: pyiceberg, Spark and DuckDB.

Each catalog `stack up --with` runs (`rest`, `nessie`, `hms`, `pg-catalog`) keeps its tables on
the stack's S3 server (`object_store.py`) and answers the same three questions, so a test, the
demo or a role's config can be pointed at any of them alike. The answers are plain values
(property maps, Maven coordinates, SQL statements): nothing here opens a connection.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

from icekeeper.localstack.object_store import S3Service
from icekeeper.localstack.services import Service

SPARK_CATALOG_CLASS = "org.apache.iceberg.spark.SparkCatalog"


@dataclass(frozen=True)
class SparkCatalogSettings:
    """How a SparkSession opens one of the stack's catalogs.

    Attributes:
        conf: `spark.sql.catalog.<name>[.<property>]` settings (set before the catalog's first use).
        packages: Maven coordinates of the jars the catalog needs beyond icekeeper's own Spark
            packages (`common/spark.py`), e.g. iceberg-aws-bundle for S3FileIO.
    """

    conf: dict[str, str]
    packages: tuple[str, ...]


class CatalogService(Service):
    """A catalog service of the stack, with its warehouse in the stack's S3 bucket."""

    @property
    def storage(self) -> S3Service:
        """The stack's S3 server, where this catalog's tables live."""
        return S3Service(self.stack, self.state_dir, self.cache_dir)

    def warehouse(self) -> str:
        """The catalog's warehouse: `s3://<bucket>/warehouse/<service name>`."""
        return self.storage.uri(f"warehouse/{self.name}")

    @abstractmethod
    def pyiceberg_properties(self) -> dict[str, str]:
        """Properties of `pyiceberg.catalog.load_catalog(name, **properties)`, `s3.*` included."""

    @abstractmethod
    def iceberg_catalog_properties(self) -> dict[str, str]:
        """The catalog's own properties in Iceberg's Java client (`type`, `uri`, ...), without
        those of its FileIO."""

    def extra_spark_packages(self) -> tuple[str, ...]:
        """Jars Spark needs for this catalog beyond those of S3 (a JDBC driver)."""
        return ()

    def spark_catalog(self, name: str) -> SparkCatalogSettings:
        """Settings that register this catalog in Spark as `name`.

        A SQL catalog stores the client's catalog name with every table: give Spark the name
        pyiceberg loads the catalog under.
        """
        prefix = f"spark.sql.catalog.{name}"
        properties = {**self.iceberg_catalog_properties(), **self.storage.iceberg_java_properties()}
        return SparkCatalogSettings(
            conf={
                prefix: SPARK_CATALOG_CLASS,
                **{f"{prefix}.{key}": value for key, value in properties.items()},
            },
            packages=self.storage.spark_packages() + self.extra_spark_packages(),
        )

    def duckdb_statements(self, alias: str) -> list[str]:
        """Statements that let DuckDB (httpfs and iceberg loaded) read this catalog's tables.

        DuckDB attaches REST catalogs (tables are then `<alias>.<namespace>.<table>`); for the
        others it reads a table by its metadata file, `iceberg_scan('<metadata location>')`, and
        needs only the S3 secret.
        """
        return self.storage.duckdb_statements()

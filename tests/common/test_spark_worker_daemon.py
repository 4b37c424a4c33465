"""Local Python workers start their tasks without re-reading Spark's archives
(common/spark_worker_daemon.py): every task invalidates the import caches, and each archive on
the import path is then read again (~150 ms a task for Spark 4.1's jar and pyspark.zip)."""

from __future__ import annotations

from pathlib import Path

import pytest

from icekeeper.common.spark_worker_daemon import import_path


def _package(root: Path, name: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")


def test_archives_leave_the_path_when_pyspark_and_py4j_import_without_them(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site-packages"
    _package(site, "pyspark")
    _package(site, "py4j")
    archives = [tmp_path / "pyspark.zip", tmp_path / "py4j-src.zip"]
    for archive in archives:
        archive.write_bytes(b"")
    jar = str(tmp_path / "spark-core.jar")
    paths = [str(tmp_path / "app"), *map(str, archives), jar, str(site)]

    assert import_path(paths) == [str(tmp_path / "app"), str(site)]


def test_archives_stay_when_pyspark_comes_only_from_them(tmp_path: Path) -> None:
    archive = tmp_path / "pyspark.zip"
    archive.write_bytes(b"")
    jar = str(tmp_path / "spark-core.jar")

    assert import_path([str(archive), jar]) == [str(archive)]


@pytest.mark.spark
def test_a_local_python_task_imports_nothing_from_an_archive(spark) -> None:
    def look(_: int) -> tuple[list[str], list[str], str]:
        import sys
        import zipimport

        import pyspark

        zip_finders = [
            path
            for path, finder in sys.path_importer_cache.items()
            if isinstance(finder, zipimport.zipimporter)
        ]
        return sys.path, zip_finders, pyspark.__file__

    [(paths, zip_finders, pyspark_file)] = (
        spark.sparkContext.parallelize([1], 1).map(look).collect()
    )

    assert not [path for path in paths if path.endswith((".jar", "pyspark.zip"))]
    assert zip_finders == []
    assert ".zip" not in pyspark_file

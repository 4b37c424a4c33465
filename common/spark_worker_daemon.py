"""PySpark's worker daemon without archives on the workers' import path.

Every Python task starts with `importlib.invalidate_caches()` (pyspark's
`worker_util.setup_spark_files`), and since Python 3.10 that makes each zipimporter read its
archive's whole central directory again. Spark puts two archives on its workers' PYTHONPATH,
`pyspark.zip` (read again once per package imported from it) and, in 4.1, `spark-core_*.jar`
(some 20,000 entries): with a py-spy sample of a reused worker, three quarters of its time on
one-record tasks went there, ~150 ms a task. Where pyspark and py4j are installed as packages
(as here: the zip is the installed package's own copy), the daemon drops the archives from
`sys.path` before it imports pyspark and forks its workers, and a task starts in milliseconds;
elsewhere it drops only the jar, which nothing Python imports. Named by
`spark.python.daemon.module` (common/spark.py) for sessions whose workers run this project's
interpreter.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder


def import_path(paths: list[str]) -> list[str]:
    """`paths` without archives when pyspark and py4j import without them; else without jars."""
    jarless = [path for path in paths if not path.endswith(".jar")]
    unarchived = [path for path in jarless if not (path.endswith(".zip") and os.path.isfile(path))]
    if all(PathFinder.find_spec(name, unarchived) for name in ("pyspark", "py4j")):
        return unarchived
    return jarless


def main() -> None:
    """Run pyspark's daemon with the archives gone from the import path and its finder cache."""
    kept = import_path(sys.path)
    dropped = [path for path in sys.path if path not in kept]
    for path in list(sys.path_importer_cache):
        if any(path == d or path.startswith(d + os.sep) for d in dropped):
            del sys.path_importer_cache[path]
    sys.path[:] = kept
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()

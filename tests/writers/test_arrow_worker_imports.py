"""What a fresh Spark Python worker imports before its first arrow-engine task (no Spark needed).

A worker is forked from PySpark's daemon and imports the task module when it unpickles its first
task; Spark forks a new one whenever an idle worker was stopped (a minute idle: a writer whose
trigger interval is longer pays it every batch). After the writer core (issue 27) the task module
pulled in pyiceberg's catalog and tables, ~140 modules the task never uses: through the core's
planning (`table_batch.UpsertRule`) and `parquet_files`' Spark helpers (`common/internals.py`)."""

from __future__ import annotations

import subprocess
import sys

UNUSED_IN_TASKS = (
    "pyiceberg.catalog",
    "pyiceberg.table",
    "icekeeper.common.catalog",
    "icekeeper.common.internals",
    "icekeeper.writers.table_batch",
)


def test_an_arrow_task_imports_no_catalog_code_into_its_worker() -> None:
    code = (
        "import sys, pyspark.daemon\n"
        "import icekeeper.writers.arrow_engine.task\n"
        f"print(sorted(m for m in sys.modules if m.startswith({UNUSED_IN_TASKS!r})))\n"
    )
    imported = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    ).stdout.strip()
    assert imported == "[]", f"a fresh worker imports {imported}"

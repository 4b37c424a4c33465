"""Where a benchmark keeps its tables, catalog and transaction log while it runs."""

from __future__ import annotations

import uuid
from pathlib import Path


def fresh_work_folder(state_dir: str | Path, name: str) -> Path:
    """A new folder of this run's own under the state folder (`<name>-<random>`), created empty.

    Each run gets its own rather than clearing a fixed `<name>` folder: two runs on one state
    folder (a bench started while another is still checking its results) once deleted each
    other's catalog and tables that way. The caller removes it when done.
    """
    folder = Path(state_dir) / f"{name}-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    return folder

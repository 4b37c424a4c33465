"""A writer's checkpoints when storage cannot serve them now: an outage, never "no checkpoint".

Read as absent, an outage made a writer forget the tables its `table_template` named (its next
moniker for such a table chained on no seq: it waited for ever, or was dropped as a duplicate when
its seq was not above the committed one) and write the list back without them; and it planned the
template's new tables from `starting_offsets` and wrote back only the batch's partitions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from icekeeper.common.config.model import KafkaSource
from icekeeper.writers.checkpoints import SourceCheckpoints
from icekeeper.writers.offsets import BatchPlan


class _ReadsFail:
    """A store that lists and writes but cannot serve a read now (S3 answering 503 to a GET,
    a mount gone stale): every other call goes to the real filesystem."""

    def __init__(self, filesystem) -> None:
        self.filesystem = filesystem

    def open_input_stream(self, path: str):
        raise OSError(f"{path}: 503 SlowDown (storage cannot serve it now)")

    def __getattr__(self, name: str):
        return getattr(self.filesystem, name)


def test_a_writer_does_not_forget_its_templated_tables_in_an_outage(tmp_path: Path) -> None:
    checkpoints = SourceCheckpoints(str(tmp_path / "checkpoints"), "w1")
    checkpoints.remember_templated_tables({"db.t1": "cdc", "db.t2": "cdc"})
    real = checkpoints.folder.filesystem
    checkpoints.folder.filesystem = _ReadsFail(real)
    with pytest.raises(OSError, match="503"):
        checkpoints.templated_tables()  # what a restarting writer reads
    with pytest.raises(OSError, match="503"):
        checkpoints.remember_templated_tables({"db.t3": "cdc"})  # a new table in a batch
    checkpoints.folder.filesystem = real
    assert checkpoints.templated_tables() == {"db.t1": "cdc", "db.t2": "cdc"}


def test_a_checkpoint_storage_cannot_serve_is_not_read_as_none(tmp_path: Path) -> None:
    source = KafkaSource(name="cdc", topics=["t"])
    checkpoints = SourceCheckpoints(str(tmp_path / "checkpoints"), "w1")
    checkpoints.advance(source, BatchPlan({("t", 0): (0, 100), ("t", 1): (0, 50)}, {}))
    real = checkpoints.folder.filesystem
    checkpoints.folder.filesystem = _ReadsFail(real)
    with pytest.raises(OSError, match="503"):
        checkpoints.read(source)  # a batch plans from it
    with pytest.raises(OSError, match="503"):
        checkpoints.advance(source, BatchPlan({("t", 0): (100, 120)}, {}))
    checkpoints.folder.filesystem = real
    assert checkpoints.read(source) == {("t", 0): 100, ("t", 1): 50}

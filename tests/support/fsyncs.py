"""Which files and folders a piece of code syncs to disk: durability tests assert what a power
cut would leave (a moniker, its data files and the folders naming them) by the paths synced."""

from __future__ import annotations

import os

import pytest


def record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path `os.fsync` is called on from now to the test's end, in order (the real sync
    still happens)."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(descriptor: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced

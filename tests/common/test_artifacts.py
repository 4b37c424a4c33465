"""npm installs into the cache (common/artifacts.py): an install `npm ls` finds incomplete is done
again once, then refused, with a fake `npm` on the PATH."""

from __future__ import annotations

from pathlib import Path

import pytest

from icekeeper.common.artifacts import ArtifactError, npm_package


def fake_npm(tmp_path: Path, monkeypatch, incomplete_installs: int) -> None:
    """An `npm` whose install succeeds and whose `ls` fails for the first installs."""
    folder = tmp_path / "bin"
    folder.mkdir()
    checks = tmp_path / "checks"
    npm = folder / "npm"
    npm.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  install) mkdir -p "$3/node_modules/.bin"; exit 0;;\n'
        f"  ls) n=$(cat {checks} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {checks}\n"
        f'      if [ $n -le {incomplete_installs} ]; then echo "missing: agent" >&2; exit 1; fi;;\n'
        "esac\n"
    )
    npm.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")


def test_an_incomplete_install_is_done_again(tmp_path: Path, monkeypatch) -> None:
    fake_npm(tmp_path, monkeypatch, incomplete_installs=1)
    said: list[str] = []
    found = npm_package(tmp_path / "cache", "azurite", "3.0.0", progress=said.append)
    assert found == tmp_path / "cache" / "npm-azurite-3.0.0" / "node_modules" / ".bin"
    assert found.is_dir()
    assert any("incomplete (attempt 1): missing: agent" in line for line in said)
    assert (tmp_path / "checks").read_text().strip() == "2"


def test_an_install_incomplete_twice_is_refused(tmp_path: Path, monkeypatch) -> None:
    fake_npm(tmp_path, monkeypatch, incomplete_installs=2)
    with pytest.raises(ArtifactError, match="incompletely twice"):
        npm_package(tmp_path / "cache", "azurite", "3.0.0", progress=lambda _: None)
    assert (tmp_path / "checks").read_text().strip() == "2"

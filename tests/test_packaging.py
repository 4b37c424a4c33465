"""What `pip install` puts in site-packages: one top-level package, `icekeeper` (issue 27, item 4).

The role folders (`common/`, `writers/`, `bookkeeper/`, `reaper/`) stay at the repository's top
level and install as `icekeeper.common`, `icekeeper.writers`, ...: a package named `common` in
site-packages would collide with any other project's.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.support.stack import REPO_ROOT

ROLE_FOLDERS = ("common", "writers", "bookkeeper", "reaper")


def _pyproject() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def test_every_package_folder_installs_under_icekeeper() -> None:
    setuptools = _pyproject()["tool"]["setuptools"]
    mapping = {"icekeeper": "icekeeper", **setuptools["package-dir"]}
    folders = {
        ".".join(init.parent.relative_to(REPO_ROOT).parts)
        for top in ("icekeeper", *ROLE_FOLDERS)
        for init in (REPO_ROOT / top).rglob("__init__.py")
    }
    listed = set()
    for package in setuptools["packages"]:
        assert package == "icekeeper" or package.startswith("icekeeper."), package
        base = max((name for name in mapping if package.startswith(name)), key=len)
        listed.add(mapping[base].replace("/", ".") + package[len(base) :])
    assert listed == folders


def test_no_module_imports_a_role_by_its_top_level_name() -> None:
    """Every import names `icekeeper.<role>`: a bare `import common` works only from a checkout."""
    offenders = []
    for path in REPO_ROOT.rglob("*.py"):
        parts = path.relative_to(REPO_ROOT).parts
        if parts[0] in {".venv", ".cache", ".icekeeper", "build"} or parts[0].startswith("."):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            stripped = line.strip()
            for role in ROLE_FOLDERS:
                if stripped.startswith((f"from {role}.", f"from {role} ", f"import {role}")):
                    offenders.append(f"{Path(*parts)}:{number}: {stripped}")
    assert offenders == []

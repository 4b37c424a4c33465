"""Module boundaries a newcomer relies on (issue 27, item 1).

The writer is one engine-neutral core (`writers/*.py`) and two sibling engines
(`writers/spark_sql_engine/`, `writers/arrow_engine/`): neither engine imports the other, so
either can be read, changed or dropped alone. And no module reaches into another's private
(`_name`) helpers: what two modules share is public and named for what it is.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from tests.support.stack import REPO_ROOT

SOURCE_FOLDERS = ("common", "writers", "bookkeeper", "reaper", "icekeeper")
ENGINES = {
    "icekeeper.writers.spark_sql_engine": "writers/spark_sql_engine",
    "icekeeper.writers.arrow_engine": "writers/arrow_engine",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts if parts[0] == "icekeeper" else ["icekeeper", *parts])


def _sources() -> Iterator[tuple[Path, str, ast.Module]]:
    for folder in SOURCE_FOLDERS:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            yield path, _module_name(path), ast.parse(path.read_text(), str(path))


def _imports(tree: ast.Module) -> Iterator[tuple[int, str, list[str]]]:
    """(line, module, names) of every project import, however deep in the module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(REPO_ROOT)}:{line}"


def test_neither_writer_engine_imports_the_other() -> None:
    for folder in ENGINES.values():
        assert (REPO_ROOT / folder / "__init__.py").is_file(), f"{folder} is not a package"
    offenders = []
    for path, module, tree in _sources():
        engine = next((e for e in ENGINES if module == e or module.startswith(e + ".")), None)
        if engine is None:
            continue
        for line, imported, names in _imports(tree):
            targets = [imported] + [f"{imported}.{name}" for name in names]
            for other in set(ENGINES) - {engine}:
                if any(t == other or t.startswith(other + ".") for t in targets):
                    offenders.append(f"{_where(path, line)}: {module} imports {imported}")
    assert offenders == []


def test_no_two_writer_modules_share_a_name() -> None:
    """A name says what a module holds, once: an engine's own flattening is `sql_flatten.py` or
    `arrow_flatten.py`, never a second `flatten.py`."""
    seen: dict[str, list[str]] = {}
    for path in sorted((REPO_ROOT / "writers").rglob("*.py")):
        if path.name not in {"__init__.py", "__main__.py"}:
            seen.setdefault(path.name, []).append(str(path.relative_to(REPO_ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_no_module_imports_another_modules_private_name() -> None:
    """`from x import _helper`, or `x._helper` on an imported project module, across modules."""
    offenders = []
    for path, module, tree in _sources():
        aliases: dict[str, str] = {}
        for line, imported, names in _imports(tree):
            if not imported.startswith("icekeeper") or imported == module:
                continue
            private = [name for name in names if _is_private(name)]
            if private:
                offenders.append(f"{_where(path, line)}: from {imported} import {private}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("icekeeper") and alias.asname:
                        aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    if node.module.startswith("icekeeper"):
                        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and _is_private(node.attr)
                and _is_module(aliases[node.value.id])
            ):
                offenders.append(
                    f"{_where(path, node.lineno)}: {aliases[node.value.id]}.{node.attr}"
                )
    assert offenders == []


def _is_module(dotted: str) -> bool:
    """Whether `dotted` names a project module (a file or package), not a class or function."""
    parts = dotted.split(".")[1:]
    if parts and parts[0] not in SOURCE_FOLDERS[:4]:
        parts = ["icekeeper", *parts]
    path = REPO_ROOT.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_the_module_map_lists_every_module() -> None:
    """`docs/modules.md` has one line per module (packages without a docstring aside)."""
    listed = set(
        re.findall(r"^\| `([^`]+\.py)` \|", (REPO_ROOT / "docs" / "modules.md").read_text(), re.M)
    )
    modules = {
        str(path.relative_to(REPO_ROOT))
        for path, _, tree in _sources()
        if path.name != "__init__.py" or ast.get_docstring(tree)
    }
    assert sorted(modules - listed) == [], "a module without its line in docs/modules.md"
    assert sorted(listed - modules) == [], "docs/modules.md lists a module that is gone"

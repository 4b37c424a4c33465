"""The Python environment Spark executors run the writer's Python tasks in, packed to be shipped.

The arrow engine's tasks (`writers/arrow_engine/task.py`) run in each executor's Python worker and
import icekeeper, pyarrow, polars, confluent-kafka and pyiceberg-core there; the executors of a
real cluster have none of them. As PySpark's packaging guide describes, a virtual environment
with `icekeeper[executor]` is packed into one archive (venv-pack), shipped with
`spark.archives=<archive>#environment`, unpacked by Spark in every executor's work folder, and
run as `./environment/bin/python`. What executors still need is what venv-pack does not pack:
Java, Spark, and the same Python interpreter as this one at the same path (the archive's
`bin/python` is a link to it).

The archive is built once per (Python, platform, installed versions, icekeeper's own files) and
kept in the cache folder (`cache_dir/executor-env/`): built under a temporary name and renamed
whole, so a build that dies half way is simply redone and never shipped half made. Its packages
are pinned to the versions installed here, so the objects the driver pickles for its tasks
(pydantic models, numpy arrays) unpickle into the same classes in the executors.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from icekeeper.common.exit_codes import UsageError

ARCHIVE_ALIAS = "environment"
"""The folder Spark unpacks the archive into, in each executor's work folder (`#environment`)."""
EXECUTOR_PYTHON = f"./{ARCHIVE_ALIAS}/bin/python"
"""The executors' Python in the unpacked archive, relative to their work folder."""
PACKED = "packed"
"""`spark.executor_env` value: build (or reuse from the cache) and ship the packed environment."""
EXECUTOR_EXTRA = "executor"
"""The extra (pyproject.toml) with what executors need beyond the base install: no PySpark."""
_PACKAGE_FOLDERS = (
    "icekeeper",
    "icekeeper.common",
    "icekeeper.writers",
    "icekeeper.bookkeeper",
    "icekeeper.reaper",
)

Progress = Callable[[str], None]


class ExecutorEnvError(RuntimeError):
    """The environment could not be built; the message says which step failed and why."""


class ExecutorsLackPython(UsageError):
    """A Spark job's Python tasks could not import what they run: the executors' Python is not
    icekeeper's. Nothing was published; the message says how to ship them the environment."""

    def __init__(self, module: str) -> None:
        self.module = module
        super().__init__(
            f"the Spark executors' Python cannot import {module!r}: the writer's arrow engine runs "
            "Python tasks there. Ship them icekeeper's environment (`spark.executor_env: packed`, "
            "or spark-submit --archives with `icekeeper writer --executor-env`), install "
            "'icekeeper[executor]' in their Python, or use `writer.engine: spark-sql` "
            '(docs/operations.md, "Writers on a Spark cluster")'
        )


_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def missing_executor_module(job_failure: str) -> str | None:
    """The module a failed Spark job's Python tasks could not import, from its message (the
    executors' traceback), or None when it failed otherwise."""
    found = _MISSING_MODULE.search(job_failure)
    return found.group(1) if found else None


@dataclass(frozen=True)
class PackedEnv:
    """A packed environment in the cache, ready for `spark.archives`."""

    archive: Path
    built: bool
    """False when an archive of the same key was already in the cache."""


@dataclass(frozen=True)
class InstallSource:
    """Where `pip` gets icekeeper itself for the executors' environment."""

    requirement: str
    """The pip requirement: the local source folder (a checkout) or `name==version`."""
    fingerprint: str
    """Changes whenever what would be installed changes (the checkout's files, the version)."""


def spark_archive_conf(archive: str, existing: str | None = None) -> dict[str, str]:
    """`spark.archives` shipping `archive` as `#environment`, after any archives already set."""
    entry = f"{archive}#{ARCHIVE_ALIAS}"
    return {"spark.archives": f"{existing},{entry}" if existing else entry}


def install_source() -> InstallSource:
    """icekeeper as it runs here: the checkout it is imported from (an editable install, or the
    source folder on the path), else its installed version."""
    import icekeeper

    folder = Path(icekeeper.__file__).resolve().parents[1]
    pyproject = folder / "pyproject.toml"
    if pyproject.is_file() and 'name = "icekeeper"' in pyproject.read_text(encoding="utf-8"):
        return InstallSource(f"{folder}[{EXECUTOR_EXTRA}]", _sources_fingerprint(folder))
    # Not `metadata.distribution`: a checkout's `icekeeper.egg-info` on the path would answer.
    version = metadata.version("icekeeper")
    return InstallSource(f"icekeeper[{EXECUTOR_EXTRA}]=={version}", f"icekeeper=={version}")


def _sources_fingerprint(folder: Path) -> str:
    """A digest of the checkout's package files (and pyproject.toml): what pip would install."""
    import importlib

    digest = hashlib.sha256((folder / "pyproject.toml").read_bytes())
    for name in _PACKAGE_FOLDERS:
        for package_folder in importlib.import_module(name).__path__:
            for path in sorted(Path(package_folder).rglob("*.py")):
                digest.update(str(path.relative_to(package_folder)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


def installed_constraints() -> str:
    """`name==version` of every distribution installed here except icekeeper: the executors'
    environment gets the same versions."""
    pins = set()
    for distribution in metadata.distributions():
        name = distribution.metadata["Name"]
        if not name or name.lower() == "icekeeper":
            continue
        direct_url = distribution.read_text("direct_url.json")
        if direct_url and "dir_info" in json.loads(direct_url):
            continue  # installed from a local folder: no version pip could find elsewhere
        pins.add(f"{name}=={distribution.version}")
    return "\n".join(sorted(pins, key=str.lower)) + "\n"


def env_key(source: InstallSource, constraints: str) -> str:
    """What the archive depends on, hashed: interpreter, platform, pins, icekeeper's files."""
    parts = [sys.version, sys.executable, platform.machine(), platform.system(), constraints]
    parts.append(source.fingerprint)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def archive_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / "executor-env" / f"icekeeper-executor-{key}.tar.gz"


def packed_env(
    cache_dir: Path, progress: Progress, output: Path | None = None, force: bool = False
) -> PackedEnv:
    """The packed executors' environment: from the cache, or built now (a few minutes: a fresh
    virtual environment, `pip install icekeeper[executor]`, then venv-pack), reporting each step
    to `progress` and venv-pack's progress bar on stderr.

    Args:
        output: also copy the archive there (for a user who keeps it elsewhere).
        force: build anew even when the cache has it.
    """
    source = install_source()
    constraints = installed_constraints()
    archive = archive_path(cache_dir, env_key(source, constraints))
    built = False
    if force or not archive.is_file():
        _build(archive, source, constraints, progress)
        built = True
    else:
        progress(f"executor environment: {archive} (cached)")
    if output is not None and output.resolve() != archive.resolve():
        partial = output.with_name(f"{output.name}.{os.getpid()}.part")
        shutil.copyfile(archive, partial)
        partial.replace(output)
        archive = output
    return PackedEnv(archive, built)


def _build(archive: Path, source: InstallSource, constraints: str, progress: Progress) -> None:
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="build-", dir=archive.parent) as scratch:
        venv_folder = Path(scratch) / "venv"
        progress(f"executor environment: creating a virtual environment ({sys.executable})")
        _run([sys.executable, "-m", "venv", str(venv_folder)], "python -m venv")
        constraints_file = Path(scratch) / "constraints.txt"
        constraints_file.write_text(constraints, encoding="utf-8")
        progress(f"executor environment: pip install {source.requirement} (pinned as here)")
        _run(
            [
                str(venv_folder / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--progress-bar",
                "off",
                "-c",
                str(constraints_file),
                source.requirement,
            ],
            "pip install",
            show=progress,
        )
        progress(f"executor environment: packing {venv_folder} with venv-pack")
        partial = archive.with_name(f"{archive.name}.{os.getpid()}.part")
        _pack(venv_folder, partial)
        partial.chmod(0o644)  # venv-pack writes it private; other users' writers ship it too
        partial.replace(archive)  # whole, never half: a build that died leaves only a .part
        size_mb = archive.stat().st_size / 1024**2
        progress(f"executor environment: {archive} ({size_mb:.0f} MB)")
    prune_cache(archive.parent, keep=KEEP_ARCHIVES)


KEEP_ARCHIVES = 3
"""Archives kept in the cache: each change of icekeeper's files makes a new one (~240 MB), and a
running writer may still serve an older one to executors that start late."""


def prune_cache(folder: Path, keep: int) -> None:
    """Delete all but the `keep` newest archives (and build leftovers of dead builds a day old)."""
    archives = sorted(
        folder.glob("icekeeper-executor-*.tar.gz"), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for stale in archives[keep:]:
        stale.unlink(missing_ok=True)
    day_ago = time.time() - 86_400
    for leftover in folder.glob("icekeeper-executor-*.part"):
        if leftover.stat().st_mtime < day_ago:
            leftover.unlink(missing_ok=True)
    for scratch in folder.glob("build-*"):  # a build killed before it could clean up
        if scratch.stat().st_mtime < day_ago:
            shutil.rmtree(scratch, ignore_errors=True)


def _pack(venv_folder: Path, output: Path) -> None:
    import venv_pack

    env = venv_pack.Env(str(venv_folder))
    # pip installs nothing in an executor; its ~17 MB would be unpacked by every one of them.
    env = env.exclude("lib/python*/site-packages/pip/*").exclude("bin/pip*")
    with _stdout_to_stderr():  # venv-pack draws its progress bar on stdout
        env.pack(output=str(output), format="tar.gz", verbose=True, force=True, compress_level=1)
    print(file=sys.stderr, flush=True)  # the bar ends without a newline


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    with contextlib.redirect_stdout(sys.stderr):
        yield


def _run(command: list[str], step: str, show: Progress | None = None) -> None:
    """Run one build step; its last lines of output name what failed."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.rstrip())
        if show is not None and line.startswith(("Collecting", "Building", "Successfully")):
            show(f"  {line.rstrip()}")
    if process.wait() != 0:
        tail = "\n".join(lines[-15:])
        raise ExecutorEnvError(f"{step} failed (exit {process.returncode}):\n{tail}")

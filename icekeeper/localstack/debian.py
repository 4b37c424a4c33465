"""Programs the stack's databases run on, from Debian packages: found, installed as root, or named.

The stack's MariaDB and PostgreSQL are the distribution's own servers run as private instances,
not downloads into `.cache`: their packages bring the system users (`mysql`, `postgres`) the
servers insist on running as. A machine without them gets them from apt-get when icekeeper runs
as root (a fresh CI machine), and otherwise a StackError that names the packages to install.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from dataclasses import dataclass

from icekeeper.common.artifacts import Progress
from icekeeper.localstack.errors import StackError


@dataclass(frozen=True)
class DebianPackage:
    """A Debian package and the programs the stack needs from it.

    Attributes:
        name: the package apt-get installs.
        programs: executables that must all be found.
        search_dirs: glob patterns of folders searched before PATH, newest first
            (PostgreSQL keeps its server programs in `/usr/lib/postgresql/<major>/bin`).
    """

    name: str
    programs: tuple[str, ...]
    search_dirs: tuple[str, ...] = ()


MARIADB_SERVER = DebianPackage(
    "mariadb-server", ("mariadbd", "mariadb-install-db"), ("/usr/sbin", "/usr/bin")
)
POSTGRESQL = DebianPackage("postgresql", ("initdb", "postgres"), ("/usr/lib/postgresql/*/bin",))

_apt_lists_updated = False


def find_programs(package: DebianPackage) -> dict[str, str] | None:
    """Paths of all of the package's programs, or None if one is missing.

    The search folders come first (a user's PATH often
    lacks /usr/sbin), newest version first, then PATH.
    """
    folders = [
        folder
        for pattern in package.search_dirs
        for folder in sorted(glob.glob(pattern), key=_version_key, reverse=True)
    ]
    found = {}
    for program in package.programs:
        path = next(
            (
                candidate
                for folder in folders
                if os.access(candidate := os.path.join(folder, program), os.X_OK)
            ),
            None,
        )
        path = path or shutil.which(program)
        if path is None:
            return None
        found[program] = path
    return found


def _version_key(folder: str) -> tuple[int, ...]:
    # /usr/lib/postgresql/15/bin sorts below /usr/lib/postgresql/17/bin, and "9.6" below "10".
    return tuple(int(part) for part in "".join(c if c.isdigit() else " " for c in folder).split())


def missing_packages_message(packages: list[DebianPackage], purpose: str) -> str:
    """What a user without root reads when programs are missing."""
    names = " ".join(package.name for package in packages)
    programs = ", ".join(program for package in packages for program in package.programs)
    return (
        f"{purpose} needs the Debian package(s) {names} (programs {programs} not found); "
        f"install them with: sudo apt-get install -y {names}"
    )


def ensure_package(package: DebianPackage, purpose: str, progress: Progress) -> dict[str, str]:
    """Paths of the package's programs; installs the package with apt-get first if running as root.

    Raises:
        StackError: the programs are missing and cannot be installed here (not root, no apt-get,
            or apt-get failed); the message names the package.
    """
    found = find_programs(package)
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise StackError(missing_packages_message([package], purpose))
    _apt_get_install(package.name, progress)
    found = find_programs(package)
    if not found:
        raise StackError(
            f"apt-get installed {package.name} but {', '.join(package.programs)} are still not "
            "found"
        )
    return found


def _apt_get_install(name: str, progress: Progress) -> None:
    global _apt_lists_updated
    environ = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _apt_lists_updated:
        progress("apt-get update (once, to install Debian packages the stack needs)")
        _run_apt(["apt-get", "update", "-q"], environ, name)
        _apt_lists_updated = True
    progress(f"apt-get install {name} (once)")
    _run_apt(["apt-get", "install", "-y", "-q", "--no-install-recommends", name], environ, name)


def _run_apt(command: list[str], environ: dict[str, str], name: str) -> None:
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=environ,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if result.returncode != 0:
        raise StackError(
            f"`{' '.join(command)}` failed while installing "
            f"{name}:\n{(result.stdout + result.stderr)[-3000:]}"
        )

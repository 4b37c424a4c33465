"""Find a JDK of at least a given major version.

Kafka 4 needs Java 17; Apicurio Registry 3.3 is compiled for Java 21. Machines often have
several JDKs side by side (a distribution's 17 plus a newer Temurin), so we look beyond
`JAVA_HOME` instead of making users juggle it.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

_SEARCH_ROOTS = (
    "/usr/lib/jvm",
    "/usr/java",
    "/opt/java",
    "/opt",
    "/Library/Java/JavaVirtualMachines",
)


class JavaNotFound(RuntimeError):
    """No JDK of the needed version; the message says which version to install."""


@functools.cache
def java_major_version(java: str) -> int | None:
    """Major version `java -version` reports, or None if it does not run."""
    try:
        result = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def candidate_javas(preferred_home: str | None = None) -> list[str]:
    """`java` executables worth trying, most explicit first."""
    candidates: list[str] = []
    for home in (preferred_home, os.environ.get("JAVA_HOME")):
        if home:
            candidates.append(str(Path(home) / "bin" / "java"))
    on_path = shutil.which("java")
    if on_path:
        candidates.append(on_path)
    for root in _SEARCH_ROOTS:
        root_path = Path(root)
        if root_path.is_dir():
            candidates.extend(str(path) for path in sorted(root_path.glob("*/bin/java")))
            candidates.extend(
                str(path) for path in sorted(root_path.glob("*/Contents/Home/bin/java"))
            )
    seen: set[str] = set()
    return [c for c in candidates if Path(c).exists() and not (c in seen or seen.add(c))]


def find_java(
    min_major: int,
    preferred_home: str | None = None,
    purpose: str = "",
    max_major: int | None = None,
) -> str:
    """Path of a `java` of at least `min_major` (and at most `max_major`, for programs a newer
    JDK breaks): the preferred home if it qualifies, else the newest found."""

    def fits(major: int | None) -> bool:
        return bool(major) and major >= min_major and (max_major is None or major <= max_major)

    versions = [(java, java_major_version(java)) for java in candidate_javas(preferred_home)]
    if preferred_home:
        preferred = str(Path(preferred_home) / "bin" / "java")
        for java, major in versions:
            if java == preferred and fits(major):
                return java
    usable = [(major, java) for java, major in versions if fits(major)]
    if not usable:
        found = ", ".join(f"{java} ({major})" for java, major in versions) or "none"
        wanted = f"{min_major}+" if max_major is None else f"{min_major} to {max_major}"
        raise JavaNotFound(
            f"{purpose or 'this'} needs Java {wanted}; found: {found}. Install a JDK "
            f"{wanted} and set JAVA_HOME or stack.registry_java_home"
        )
    return max(usable)[1]

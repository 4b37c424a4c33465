"""Fetch and cache what icekeeper runs on: Maven jars, release archives, npm packages.

Everything lands under the cache folder (`cache_dir`, ignored by git) and is fetched once: a
`.complete` marker is written only after a download finished, so an interrupted fetch is
redone rather than trusted. Maven resolves transitive dependencies for us (Kafka's broker is
~45 jars); we only write a tiny pom.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import tarfile
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from icekeeper.common.logs import PROGRESS_LOGGER
from icekeeper.common.retries import retry

log = logging.getLogger(__name__)
announce = logging.getLogger(PROGRESS_LOGGER).info
"""Where fetches report by default: shown at the default log level, since a first run's jars
take minutes (a caller with a screen of its own, `icekeeper stack up`, passes its printer)."""

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
_COMPLETE = ".complete"

Progress = Callable[[str], None]


class ArtifactError(RuntimeError):
    """A download or install that failed; the message says what to install or retry."""


@dataclass(frozen=True)
class MavenBundle:
    """A named set of Maven artifacts copied into one `lib/` folder.

    Attributes:
        name: folder name under the cache, include versions so upgrades fetch anew.
        coordinates: `group:artifact:version` entries, or `group:artifact:version:classifier` for
            a jar published beside the main one (`iceberg-core`'s `tests`).
        transitive: also copy their runtime dependencies.
        exclusions: `group:artifact` pairs left out of every dependency's tree.
    """

    name: str
    coordinates: tuple[str, ...]
    transitive: bool = True
    exclusions: tuple[str, ...] = field(default_factory=tuple)


def maven_bundle(cache_dir: Path, bundle: MavenBundle, progress: Progress = announce) -> list[Path]:
    """Jars of `bundle`, fetched with `mvn dependency:copy-dependencies` on first use."""
    home = cache_dir / bundle.name
    lib = home / "lib"
    if not (home / _COMPLETE).exists():
        if shutil.which("mvn") is None:
            raise ArtifactError(
                "Maven (`mvn`) is needed once to fetch jars from Maven Central; install it "
                "(Debian: apt-get install maven)"
            )
        progress(
            f"fetching {bundle.name} from Maven Central with Maven (once, may take minutes; "
            f"cached in {home})"
        )
        started = time.monotonic()
        if lib.exists():
            shutil.rmtree(lib)
        home.mkdir(parents=True, exist_ok=True)
        (home / "pom.xml").write_text(_pom(bundle), encoding="utf-8")
        command = [
            "mvn",
            "-B",
            "-f",
            str(home / "pom.xml"),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            # Absolute: Maven resolves a relative one against the pom's folder.
            f"-DoutputDirectory={lib.resolve()}",
            f"-DexcludeTransitive={'false' if bundle.transitive else 'true'}",
        ]
        returncode, output_tail = _run_reporting_downloads(command, progress)
        if returncode != 0:
            raise ArtifactError(f"mvn could not fetch {bundle.name}:\n{output_tail[-3000:]}")
        (home / _COMPLETE).touch()
        jars = list(lib.glob("*.jar"))
        progress(
            f"fetched {bundle.name}: {len(jars)} jars, "
            f"{sum(jar.stat().st_size for jar in jars) / 1e6:.0f} MB in "
            f"{time.monotonic() - started:.0f} s"
        )
    return sorted(lib.glob("*.jar"))


_DOWNLOADED = re.compile(r"Downloaded from [^:]+: \S+/([^/\s]+\.jar) \(([\d.]+) MB")
"""Maven's line for a finished download of a jar of a megabyte or more."""


def _run_reporting_downloads(command: list[str], progress: Progress) -> tuple[int, str]:
    """Run Maven, reporting each jar of a megabyte or more as it arrives (a bundle can take a
    minute); returns the exit code and the output's last lines."""
    tail: deque[str] = deque(maxlen=60)
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            tail.append(line)
            if match := _DOWNLOADED.search(line):
                progress(f"  {match.group(1)} ({match.group(2)} MB)")
    return process.returncode, "".join(tail)


def _pom(bundle: MavenBundle) -> str:
    # A `*:*` exclusion keeps Maven from even resolving the dependency tree (`excludeTransitive`
    # still resolves it, and fails when a mirror lacks a pom we would not copy anyway).
    excluded = ("*:*",) if not bundle.transitive else bundle.exclusions
    exclusions = "".join(
        f"<exclusion><groupId>{group}</groupId><artifactId>{artifact}</artifactId></exclusion>"
        for group, artifact in (item.split(":") for item in excluded)
    )
    dependencies = "".join(_dependency(coordinate, exclusions) for coordinate in bundle.coordinates)
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>icekeeper.cache</groupId><artifactId>{bundle.name}</artifactId><version>1</version>"
        f"<dependencies>{dependencies}</dependencies></project>\n"
    )


def _dependency(coordinate: str, exclusions: str) -> str:
    group, artifact, version, *classifier = coordinate.split(":")
    classified = f"<classifier>{classifier[0]}</classifier>" if classifier else ""
    return (
        f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
        f"<version>{version}</version>{classified}<exclusions>{exclusions}</exclusions></dependency>"
    )


def download(url: str, destination: Path, progress: Progress = announce) -> Path:
    """Download `url` to `destination` (via a temporary name), reporting every ~10%."""
    if destination.exists():
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".part")
    progress(f"downloading {url}")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0)
            done, next_report = 0, 0.1
            while chunk := response.read(1 << 20):
                out.write(chunk)
                done += len(chunk)
                if total and done / total >= next_report:
                    progress(f"  {done / total:4.0%} of {total / 1e6:.0f} MB")
                    next_report += 0.1
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise ArtifactError(f"could not download {url}: {error}") from error
    partial.rename(destination)
    return destination


def maven_file_url(coordinate: str, classifier: str | None = None, extension: str = "jar") -> str:
    """URL of one file on Maven Central from `group:artifact:version`."""
    group, artifact, version = coordinate.split(":")
    suffix = f"-{classifier}" if classifier else ""
    folder = f"{group.replace('.', '/')}/{artifact}/{version}"
    return f"{MAVEN_CENTRAL}/{folder}/{artifact}-{version}{suffix}.{extension}"


def maven_file(
    cache_dir: Path,
    coordinate: str,
    classifier: str | None = None,
    extension: str = "jar",
    progress: Progress = announce,
) -> Path:
    """One file from Maven Central (a self-contained jar, an archive), downloaded once into
    `<cache_dir>/downloads`."""
    url = maven_file_url(coordinate, classifier, extension)
    return download(url, cache_dir / "downloads" / url.rsplit("/", 1)[-1], progress)


def unpacked_archive(cache_dir: Path, name: str, url: str, progress: Progress = announce) -> Path:
    """Folder holding the unpacked tar.gz at `url`, fetched and unpacked once."""
    home = cache_dir / name
    if (home / _COMPLETE).exists():
        return home / "unpacked"
    archive = download(url, cache_dir / "downloads" / url.rsplit("/", 1)[-1], progress)
    target = home / "unpacked"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    progress(f"unpacking {archive.name}")
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    (home / _COMPLETE).touch()
    return target


def npm_package(cache_dir: Path, package: str, version: str, progress: Progress = announce) -> Path:
    """`node_modules/.bin` of `package@version` installed into the cache (pinned, once)."""
    home = cache_dir / f"npm-{package}-{version}"
    bin_dir = home / "node_modules" / ".bin"
    if not (home / _COMPLETE).exists():
        if shutil.which("npm") is None:
            raise ArtifactError(
                f"npm is needed once to install {package}; install Node.js 18+ with npm"
            )
        progress(f"installing {package}@{version} from npm (once; cached in {home})")

        def install(attempt: int) -> bool:
            """A clean install; whether `npm ls` finds its tree complete."""
            if home.exists():
                shutil.rmtree(home)
            home.mkdir(parents=True)
            result = subprocess.run(
                [
                    "npm",
                    "install",
                    "--prefix",
                    str(home),
                    "--no-audit",
                    "--no-fund",
                    "--loglevel=error",
                    f"{package}@{version}",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                raise ArtifactError(
                    "npm could not install "
                    f"{package}@{version}:\n{(result.stdout + result.stderr)[-3000:]}"
                )
            # npm once exited 0 here with half of Azurite's tree missing (https-proxy-agent among
            # it), and the cache then held a server that could not start: `npm ls` checks the tree.
            check = subprocess.run(
                ["npm", "ls", "--prefix", str(home), "--all"],
                capture_output=True,
                text=True,
                check=False,
            )
            if check.returncode != 0:
                progress(
                    f"npm left {package}@{version} incomplete (attempt {attempt}): "
                    f"{check.stderr.strip()[-300:]}"
                )
            return check.returncode == 0

        complete = retry(
            install,
            attempts=2,
            what="npm left an install incomplete, installing again",
            retry_while=lambda complete: not complete,
            log_extra={"package": f"{package}@{version}"},
        )
        if not complete:
            raise ArtifactError(
                f"npm installed {package}@{version} incompletely twice; see "
                f"`npm ls --prefix {home} --all`"
            )
        (home / _COMPLETE).touch()
    return bin_dir

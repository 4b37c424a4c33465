"""Headless Chromium for the tests that look at a page as a browser shows it.

Debian's `chromium` package, as the stack's database servers are installed (installed with
apt-get when the tests run as root on a fresh machine; `icekeeper/localstack/debian.py`), since a
test tool's download of its own browser fails on a closed network. Started with the flags a
closed network needs: without the background-networking ones Chromium keeps trying Google's hosts.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from icekeeper.localstack.debian import DebianPackage, ensure_package
from icekeeper.localstack.errors import StackError

CHROMIUM = DebianPackage("chromium", ("chromium",), ("/usr/bin",))

FLAGS = (
    "--headless",
    "--no-sandbox",  # the tests may run as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def find_chromium() -> tuple[str | None, str]:
    """The Chromium program (installed first when possible), or None and why not."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path, ""
    try:
        return ensure_package(CHROMIUM, "the status page's browser test", print)["chromium"], ""
    except StackError as error:
        return None, str(error)


def chromium(program: str, url: str, *arguments: str, timeout_s: float = 60) -> str:
    """Run headless Chromium on `url` with `arguments` (`--dump-dom`, `--screenshot=...`), in a
    profile of its own; returns what it printed (the DOM, for `--dump-dom`)."""
    with tempfile.TemporaryDirectory(prefix="icekeeper-chromium-") as profile:
        result = subprocess.run(
            [program, *FLAGS, f"--user-data-dir={profile}", *arguments, url],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    if result.returncode != 0:
        raise AssertionError(f"chromium failed ({result.returncode}): {result.stderr[-2000:]}")
    return result.stdout


def screenshot(program: str, url: str, path: Path, width: int = 1280, height: int = 1600) -> Path:
    chromium(program, url, f"--screenshot={path}", f"--window-size={width},{height}")
    assert path.is_file() and path.stat().st_size > 0, f"no screenshot at {path}"
    return path

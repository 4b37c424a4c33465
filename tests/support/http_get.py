"""Plain HTTP for the tests that probe a role's endpoints: a free port, and a GET that tells a
closed port (0) from an error status."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return probe_socket.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    """(status, body); (0, "") when nothing listens."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:  # not listening
        return 0, ""

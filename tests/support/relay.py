"""A TCP relay in front of a real server (a REST catalog, PostgreSQL, a Hive Metastore, an S3
server) that faults one chosen request on the wire protocol the client really speaks: the request
reaches the server or not, and the server's answer reaches the client, is lost, is replaced, or
never comes (a dropped connection, a failover, a load balancer or a proxy timing out). What a
commit of unknown outcome, a lost conditional write or a stalled server must survive.

A test arms the relay with where to fault (`at`: a test of the bytes the client sent since the
relay was armed, e.g. `containing(b"If-None-Match")`) and what to do there (a `Fault`: `lose()`,
`refuse()`, `late(4.0)`, `replace(503)`, `stall()`, `forward_after(...)`). Every other byte is
relayed unchanged, each client connection on a server connection of its own.
"""

from __future__ import annotations

import re
import socket
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Literal

CHUNK = 65536
"""What one read takes, and how much of a connection's bytes `at` is shown at the most."""

DEFAULT_PORTS = {"http": 80, "https": 443}

REQUEST_LINE = re.compile(rb"(?:GET|HEAD|POST|PUT|DELETE|PATCH|OPTIONS) /\S* HTTP/1\.[01]$")
REQUEST_START = re.compile(rb"(?:GET|HEAD|POST|PUT|DELETE|PATCH|OPTIONS) /\S* HTTP/1\.[01]\r\n")
CONTENT_LENGTH = re.compile(rb"(?im)^content-length:[ \t]*(\d+)")
"""An HTTP/1.1 request line, at the end of what came since the last CRLF (a request follows the
last one's body directly, with no CRLF between them)."""


@dataclass(frozen=True)
class Fault:
    """What the relay does to the request `at` matched, and to the server's answer to it.

    Attributes:
        forward: whether the request reaches the server.
        answer: what the client hears instead of the server's answer: `pass` (the answer itself),
            `lose` (nothing: its connection is closed once the server answered), `stall` (nothing
            more: the connection stays open until the client gives up, or the server closes it and
            the relay then closes the client's, as a proxy does), or an HTTP status that replaces
            it. For a request not forwarded: `lose` (its connection is closed), `stall` or an HTTP
            status.
        delay_s: the client's connection is closed at once and the request reaches the server
            that much later (a stalled metastore thread, a proxy that gave up on the client first).
        before_forward: runs just before the request is forwarded (another client's commit
            landing first: a lost compare-and-swap on the real server).
    """

    forward: bool = True
    answer: Literal["pass", "lose", "stall"] | int = "lose"
    delay_s: float = 0.0
    before_forward: Callable[[], None] | None = None


def lose() -> Fault:
    """The server does the request; the client never hears so (an interim `100 Continue` still
    goes through)."""
    return Fault()


def refuse(status: int | None = None) -> Fault:
    """The request never reaches the server: the client's connection is closed, or it is answered
    `status` (a gateway refusing it)."""
    return Fault(forward=False, answer="lose" if status is None else status)


def replace(status: int) -> Fault:
    """The server does the request; the client hears `status` instead (a gateway that gave up
    after the server applied it)."""
    return Fault(answer=status)


def stall(forward: bool = True) -> Fault:
    """The server does the request (or, not `forward`, never gets it); the client hears nothing
    more until it gives up (its read timeout) or the server closes the connection (its idle
    timeout)."""
    return Fault(forward=forward, answer="stall")


def late(delay_s: float) -> Fault:
    """The client's connection is closed at once; the request reaches the server `delay_s`
    later."""
    return Fault(delay_s=delay_s)


def forward_after(action: Callable[[], None]) -> Fault:
    """`action` runs, then the request goes through and the client hears the server's answer."""
    return Fault(answer="pass", before_forward=action)


def containing(marker: bytes) -> Callable[[bytes], bool]:
    """Matches once the client's bytes contain `marker`, in any case (HTTP's header names are
    case-insensitive): a header (`If-None-Match`), a request line (`POST /v1/.../tables/items `),
    a Thrift method's name."""
    wanted = marker.lower()
    return lambda sent: wanted in sent.lower()


def lacking(*headers: bytes, unless: bytes = b"") -> Callable[[bytes], bool]:
    """Matches once the head of the client's last request is whole and lacks one of `headers`
    (each `Name: value`, or the start of one: `Authorization: Bearer `), in any case; never a
    request whose request line contains `unless` (`/v1/oauth/tokens`). Armed with `refuse(401)`
    for good, a server that takes no credentials refuses whoever does not send them, as a
    secured one does."""
    wanted = [header.lower() for header in headers]

    def at(sent: bytes) -> bool:
        starts = [found.start() for found in REQUEST_START.finditer(sent)]
        if not starts:
            return False
        head, whole, _ = sent[starts[-1] :].partition(b"\r\n\r\n")
        if not whole:
            return False
        request_line, *lines = head.split(b"\r\n")
        if unless and unless in request_line:
            return False
        given = [line.strip().lower() for line in lines]
        return any(not any(line.startswith(header) for line in given) for header in wanted)

    return at


def http_status(code: int) -> bytes:
    """An HTTP/1.1 answer `code` without a body, after which the relay closes the connection."""
    return (
        f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\nContent-Type: text/plain\r\n"
        "Content-Length: 0\r\nConnection: close\r\n\r\n"
    ).encode()


class Relay:
    """Relays the host and port of `uri` on a local port; `address` is `uri` with the relay's
    instead (user and path kept), for the client's config.

    Once armed (`arm`), the next request whose client's bytes match `at` is faulted as `fault`
    says; `faulted` counts those, `lost` the server's answers the client never heard (lost,
    replaced or held), and `requests` holds every HTTP request line the clients sent."""

    def __init__(self, uri: str) -> None:
        parts = urllib.parse.urlsplit(uri)
        self.target = (parts.hostname or "127.0.0.1", parts.port or DEFAULT_PORTS[parts.scheme])
        self.faulted = 0
        self.lost = 0
        self.requests: list[str] = []
        self._at: Callable[[bytes], bool] | None = None
        self._fault = lose()
        self._times = 0
        self._generation = 0
        """Incremented by each `arm`: what a connection sent before does not count."""
        self._lock = threading.Lock()
        self._connections: set[_Connection] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        self.address = urllib.parse.urlunsplit(
            (parts.scheme, netloc, parts.path, parts.query, parts.fragment)
        )
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, at: Callable[[bytes], bool], fault: Fault, times: int = 1) -> None:
        """Fault the next `times` requests whose client's bytes match `at`: on each connection,
        the bytes sent since this call or since the last request faulted on it."""
        with self._lock:
            self._at, self._fault, self._times = at, fault, times
            self._generation += 1

    def close(self) -> None:
        """Stops listening and closes every connection still open (a stalled one too)."""
        self._listener.close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self.target)
            except OSError:
                _close(client)  # the server is down: the client finds it so
                continue
            connection = _Connection(client, server)
            with self._lock:
                self._connections.add(connection)
            threading.Thread(target=self._up, args=(connection,), daemon=True).start()
            threading.Thread(target=self._down, args=(connection,), daemon=True).start()

    def _match(self, connection: _Connection, data: bytes) -> Fault | None:
        """The fault for the client's `data`, if it completes a match (then disarmed after
        `times`)."""
        with self._lock:
            self.requests.extend(connection.request_lines(data))
            if connection.generation != self._generation:
                connection.generation, connection.sent = self._generation, b""
            connection.sent = (connection.sent + data)[-CHUNK:]
            if self._at is None or not self._at(connection.sent):
                return None
            connection.matched, connection.sent = connection.sent, b""
            self._times -= 1
            if self._times <= 0:
                self._at = None
            self.faulted += 1
            return self._fault

    def _up(self, connection: _Connection) -> None:
        """The client's bytes to the server, but for a faulted request's."""
        client, server = connection.client, connection.server
        try:
            while data := client.recv(CHUNK):
                if connection.dropping:
                    continue  # the rest of a request the server never sees
                fault = self._match(connection, data)
                if fault is None:
                    server.sendall(data)
                    continue
                if fault.before_forward is not None:
                    fault.before_forward()
                if not fault.forward and fault.answer == "lose":
                    break  # never reaches the server
                if not fault.forward:
                    # Held or answered here until either side closes (the client as an answer
                    # asks): closing with its bytes unread would reset it under the answer.
                    connection.dropping = True
                    if isinstance(fault.answer, int):
                        client.sendall(http_status(fault.answer))
                    continue
                connection.answer = fault.answer  # before forwarding: no answer slips past
                if fault.delay_s:
                    data += _rest_of_request(client, connection.matched)
                    _close(client)
                    threading.Timer(fault.delay_s, _send_quietly, (server, data)).start()
                    return  # `_down` swallows the server's answer and closes the rest
                server.sendall(data)
        except OSError:
            pass
        self._end(connection)

    def _down(self, connection: _Connection) -> None:
        """The server's bytes to the client, but for its answer to a faulted request."""
        client, server = connection.client, connection.server
        try:
            while data := server.recv(CHUNK):
                answer = connection.answer
                if answer == "pass" or data.startswith(b"HTTP/1.1 100 "):
                    client.sendall(data)  # an interim `100 Continue` is not the answer
                    continue
                if answer == "held":
                    continue  # the rest of a held answer
                with self._lock:
                    self.lost += 1
                if answer == "stall":
                    # Held until either side closes: the client (its timeout; `_up` then ends
                    # the connection) or the server (its idle timeout; the client's closes too).
                    connection.answer = "held"
                    continue
                if isinstance(answer, int):
                    client.sendall(http_status(answer))
                break
        except OSError:
            pass
        self._end(connection)

    def _end(self, connection: _Connection) -> None:
        with self._lock:
            self._connections.discard(connection)
        connection.close()


class _Connection:
    """One client's connection and the relay's own to the server, with what the relay knows of
    them."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.generation = 0
        self.sent = b""
        """The client's bytes since the relay was armed (or since the last fault here)."""
        self.matched = b""
        """The bytes `sent` held when the last fault here matched them."""
        self.unscanned = b""
        """The client's bytes since its last CRLF: the start of a line not yet whole."""
        self.answer: Literal["pass", "lose", "stall", "held"] | int = "pass"
        """What the client hears of the server's bytes: the `Fault`'s answer once one was
        forwarded here (`held` once a stalled answer came)."""
        self.dropping = False
        """The client's bytes go nowhere: what is left of a request the server never sees."""

    def request_lines(self, data: bytes) -> list[str]:
        """The HTTP request lines `data` completes."""
        lines = (self.unscanned + data).split(b"\r\n")
        self.unscanned = lines.pop()[-CHUNK:]
        return [
            found.group().decode(errors="replace")
            for line in lines
            if (found := REQUEST_LINE.search(line))
        ]

    def close(self) -> None:
        _close(self.client)
        _close(self.server)


def _rest_of_request(client: socket.socket, sent: bytes, wait_s: float = 5.0) -> bytes:
    """What is still to come from `client` of the HTTP request `sent` ends in: the rest of its
    headers, then its `Content-Length` bytes of body. Clients send a body apart from its headers
    (http.client, requests), and a request held back to reach the server late must reach it
    whole: cut after its headers, the server waited for the body until the test ended. Nothing
    for bytes that are no HTTP request (a Thrift call comes whole)."""
    starts = [found.start() for found in REQUEST_START.finditer(sent)]
    if not starts:
        return b""
    request, more = sent[starts[-1] :], b""
    client.settimeout(wait_s)
    try:
        while b"\r\n\r\n" not in request + more:
            if not (chunk := client.recv(CHUNK)):
                return more
            more += chunk
        head, _, body = (request + more).partition(b"\r\n\r\n")
        length = CONTENT_LENGTH.search(head)
        wanted = int(length.group(1)) if length else 0
        while len(body) < wanted and (chunk := client.recv(CHUNK)):
            body, more = body + chunk, more + chunk
    except OSError:
        pass  # the client gave up (or took too long): the server gets what came
    finally:
        client.settimeout(None)
    return more


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()

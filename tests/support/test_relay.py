"""The test relay's faults (`tests/support/relay.py`) against a real HTTP server on loopback: what
the server did and what the client heard, for each one. The tests of commits of unknown outcome
(tests/bookkeeper/test_rest_catalogs.py, test_shared_catalog_outages.py, test_fencing.py) rely on
exactly this."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.relay import (
    Relay,
    containing,
    forward_after,
    late,
    lose,
    refuse,
    replace,
    stall,
)

COMMIT = b"POST /v1/namespaces/ns/tables/items "


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.done: list[str] = []
        """`<method> <path>` of every request the server did, in order."""
        self.idle_timeout_s: float | None = None
        """How long a connection may wait for its next request before the server closes it."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the catalogs' clients use it

    def setup(self) -> None:
        self.timeout = self.server.idle_timeout_s
        super().setup()

    def do_GET(self) -> None:
        self.answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.answer()

    def answer(self) -> None:
        self.server.done.append(f"{self.command} {self.path}")
        body = b"done"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Server]:
    server = Server()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def relay(server: Server) -> Iterator[Relay]:
    relay = Relay(f"http://127.0.0.1:{server.server_address[1]}/base")
    yield relay
    relay.close()


def connect(relay: Relay, timeout_s: float = 5.0) -> http.client.HTTPConnection:
    assert relay.address == f"http://127.0.0.1:{relay.port}/base"
    return http.client.HTTPConnection("127.0.0.1", relay.port, timeout=timeout_s)


def ask(connection: http.client.HTTPConnection, method: str, path: str) -> tuple[int, bytes]:
    connection.request(method, path, body=b"{}" if method == "POST" else None)
    answer = connection.getresponse()
    return answer.status, answer.read()


def test_unarmed_it_relays_every_request_on_a_kept_connection(server: Server, relay: Relay) -> None:
    connection = connect(relay)
    assert ask(connection, "GET", "/v1/config") == (200, b"done")
    assert ask(connection, "POST", "/v1/namespaces/ns/tables/items") == (200, b"done")
    assert server.done == ["GET /v1/config", "POST /v1/namespaces/ns/tables/items"]
    assert relay.requests == [
        "GET /v1/config HTTP/1.1",
        "POST /v1/namespaces/ns/tables/items HTTP/1.1",
    ]
    assert relay.faulted == 0 and relay.lost == 0


def test_lose_the_server_does_it_and_the_client_never_hears(server: Server, relay: Relay) -> None:
    connection = connect(relay)
    assert ask(connection, "GET", "/v1/config")[0] == 200  # a kept connection, armed after
    relay.arm(containing(COMMIT), lose())
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        ask(connection, "POST", "/v1/namespaces/ns/tables/items")
    assert server.done[-1] == "POST /v1/namespaces/ns/tables/items"
    assert relay.faulted == 1 and relay.lost == 1
    # Disarmed: the same request again goes through.
    assert ask(connect(relay), "POST", "/v1/namespaces/ns/tables/items") == (200, b"done")
    assert relay.faulted == 1 and len(server.done) == 3


def test_refuse_the_server_never_sees_it(server: Server, relay: Relay) -> None:
    relay.arm(containing(COMMIT), refuse())
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        ask(connect(relay), "POST", "/v1/namespaces/ns/tables/items")
    assert relay.faulted == 1 and server.done == []


def test_refuse_with_a_status_answers_it_without_the_server(server: Server, relay: Relay) -> None:
    relay.arm(containing(COMMIT), refuse(503))
    assert ask(connect(relay), "POST", "/v1/namespaces/ns/tables/items") == (503, b"")
    assert relay.faulted == 1 and server.done == []


def test_replace_the_server_does_it_and_the_client_hears_the_status(
    server: Server, relay: Relay
) -> None:
    relay.arm(containing(COMMIT), replace(504))
    assert ask(connect(relay), "POST", "/v1/namespaces/ns/tables/items") == (504, b"")
    assert server.done == ["POST /v1/namespaces/ns/tables/items"]
    assert relay.faulted == 1 and relay.lost == 1


def test_stall_the_server_does_it_and_the_client_waits_until_its_timeout(
    server: Server, relay: Relay
) -> None:
    relay.arm(containing(COMMIT), stall())
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        ask(connect(relay, timeout_s=1.0), "POST", "/v1/namespaces/ns/tables/items")
    assert time.monotonic() - started >= 0.9
    assert server.done == ["POST /v1/namespaces/ns/tables/items"]
    assert relay.faulted == 1 and relay.lost == 1


def test_late_the_client_is_cut_at_once_and_the_server_does_it_later(
    server: Server, relay: Relay
) -> None:
    relay.arm(containing(COMMIT), late(2.0))
    connection = connect(relay)
    # The body apart from its headers, as urllib3 (pyiceberg's REST client) sends it: the relay
    # matched on the headers, and the body must reach the server too.
    connection.putrequest("POST", "/v1/namespaces/ns/tables/items")
    connection.putheader("Content-Length", "2")
    connection.endheaders()
    time.sleep(0.2)
    connection.send(b"{}")
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        connection.getresponse()
    assert server.done == []
    deadline = time.monotonic() + 30
    while not server.done and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.done == ["POST /v1/namespaces/ns/tables/items"]


def test_forward_after_runs_its_action_before_the_server_sees_the_request(
    server: Server, relay: Relay
) -> None:
    seen_first: list[list[str]] = []
    relay.arm(containing(COMMIT), forward_after(lambda: seen_first.append(list(server.done))))
    assert ask(connect(relay), "POST", "/v1/namespaces/ns/tables/items") == (200, b"done")
    assert seen_first == [[]] and relay.faulted == 1 and relay.lost == 0


def test_only_what_a_connection_sends_after_arming_counts(server: Server, relay: Relay) -> None:
    connection = connect(relay)
    assert ask(connection, "POST", "/v1/namespaces/ns/tables/items")[0] == 200
    relay.arm(lambda sent: b"tables/items" in sent and b"/v1/config" in sent, lose())
    assert ask(connection, "GET", "/v1/config") == (200, b"done")  # the commit came before
    assert relay.faulted == 0


def test_stall_ends_when_the_server_closes_the_connection(server: Server, relay: Relay) -> None:
    """A server that ends an idle session (PostgreSQL's idle timeouts) ends the stall: the relay
    then closes the client's side too, as a proxy does, long before the client's own timeout."""
    server.idle_timeout_s = 1.0
    relay.arm(containing(COMMIT), stall())
    started = time.monotonic()
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        ask(connect(relay, timeout_s=60.0), "POST", "/v1/namespaces/ns/tables/items")
    assert time.monotonic() - started < 30
    assert server.done == ["POST /v1/namespaces/ns/tables/items"]
    assert relay.faulted == 1 and relay.lost == 1


def test_stall_without_forwarding_the_server_never_sees_it_and_the_client_waits(
    server: Server, relay: Relay
) -> None:
    relay.arm(containing(COMMIT), stall(forward=False))
    with pytest.raises(TimeoutError):
        ask(connect(relay, timeout_s=1.0), "POST", "/v1/namespaces/ns/tables/items")
    assert server.done == []
    assert relay.faulted == 1 and relay.lost == 0

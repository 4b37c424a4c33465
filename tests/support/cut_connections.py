"""A TCP relay in front of a real database or metastore that cuts a connection at a chosen
request: the client's request reaches the server, which does it, and the client never hears the
answer (a dropped connection, a failover, a proxy timing out). What settling a commit of unknown
outcome must survive, on the wire protocol the catalog really speaks (PostgreSQL's, Thrift)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


class CuttingRelay:
    """Relays `host:port` on a local port (`port`). Once armed (`cut_after(...)`), the first
    connection whose client sends bytes that `at(sent_so_far)` matches has those bytes forwarded,
    the server's answer swallowed, and both sides closed; with `forward=False` the bytes are not
    forwarded at all (the request never reached the server). Other connections are relayed
    unchanged. With `delay_s`, the client's side is closed at once and the bytes reach the server
    that much later (a stalled metastore thread, a proxy that gave up on the client first)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._at: Callable[[bytes], bool] | None = None
        self._forward = True
        self._delay_s = 0.0
        self._armed = 0
        """Incremented by each `cut_after`: what a connection sent before does not count."""
        self.cuts = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_after(
        self, at: Callable[[bytes], bool], forward: bool = True, delay_s: float = 0.0
    ) -> None:
        """Cut the next connection whose client's bytes so far match `at`."""
        with self._lock:
            self._at, self._forward, self._delay_s = at, forward, delay_s
            self._armed += 1

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            state = {"swallow": False}
            threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, state), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, state: dict) -> None:
        sent, armed = b"", 0
        try:
            while data := client.recv(65536):
                with self._lock:
                    if armed != self._armed:
                        sent, armed = b"", self._armed
                    sent = (sent + data)[-65536:]
                    cut = self._at is not None and self._at(sent)
                    forward, delay_s = self._forward, self._delay_s
                    if cut:
                        self._at = None
                        self.cuts += 1
                if cut and not forward:
                    break  # never reaches the server
                if cut:
                    state["swallow"] = True
                if cut and delay_s:
                    _close(client)
                    threading.Timer(delay_s, _send_quietly, (server, data)).start()
                    return
                server.sendall(data)
                if cut:
                    return  # the answer is swallowed by `_down`, which closes both
        except OSError:
            pass
        _close(client)
        _close(server)

    def _down(self, server: socket.socket, client: socket.socket, state: dict) -> None:
        try:
            while data := server.recv(65536):
                if state["swallow"]:
                    break  # the server answered; the client never hears it
                client.sendall(data)
        except OSError:
            pass
        finally:
            _close(client)
            _close(server)


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

"""A TCP relay in front of a real HTTP server that loses the answers to chosen requests: the
server did the request, the client never hears so (a dropped connection, a load balancer timing
out), and its SDK sends the request again. What a conditional write must survive."""

from __future__ import annotations

import socket
import threading
import urllib.parse


class LosingRelay:
    """Relays `target` (`http://host:port`) on a local port; the answer to each of the next
    `lose` requests whose bytes contain `marker` is swallowed and the client's connection closed
    once the server has answered (an interim `100 Continue` still goes through)."""

    def __init__(self, target: str, marker: bytes) -> None:
        parsed = urllib.parse.urlparse(target)
        self.target = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.marker = marker.lower()
        self.lose = 0
        self.lost = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

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
        try:
            while data := client.recv(65536):
                if self.marker in data.lower():
                    with self._lock:
                        if self.lose > 0:
                            self.lose -= 1
                            state["swallow"] = True
                server.sendall(data)
        except OSError:
            pass
        finally:
            _close(server)

    def _down(self, server: socket.socket, client: socket.socket, state: dict) -> None:
        try:
            while data := server.recv(65536):
                if state["swallow"] and not data.startswith(b"HTTP/1.1 100"):
                    with self._lock:
                        self.lost += 1
                    break  # the server answered; the client never hears it
                client.sendall(data)
        except OSError:
            pass
        finally:
            _close(client)
            _close(server)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()

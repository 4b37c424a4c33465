"""A reverse proxy that lets through only requests with the right HTTP basic credentials.

The local stack's `registry-auth` service runs it in front of Apicurio Registry, whose own basic
auth needs an OIDC server (see `secured.py`). Everything else about a request (method, path,
body, headers but `Authorization`) goes to the upstream unchanged, and the upstream's answer,
errors included, comes back unchanged. A wrong or missing credential gets 401, as from a
registry that checks them itself.

    python -m icekeeper.localstack.basic_auth_proxy --listen 127.0.0.1:8082 \\
        --upstream http://127.0.0.1:8081 --credentials <file holding user:password>
"""

from __future__ import annotations

import argparse
import hmac
import urllib.error
import urllib.request
from base64 import b64encode
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_NOT_FORWARDED = {"host", "authorization", "connection", "keep-alive", "transfer-encoding"}


def proxy_handler(upstream: str, expected_authorization: str) -> type[BaseHTTPRequestHandler]:
    """A request handler class that forwards authorized requests to `upstream`."""

    class Handler(BaseHTTPRequestHandler):
        def _forward(self) -> None:
            given = self.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), expected_authorization.encode()):
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="schema registry"')
                self.send_header("Content-Type", "application/json")
                body = b'{"error_code": 401, "message": "Unauthorized"}'
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            length = int(self.headers.get("Content-Length") or 0)
            request = urllib.request.Request(
                upstream + self.path,
                data=self.rfile.read(length) if length else None,
                method=self.command,
                headers={
                    key: value
                    for key, value in self.headers.items()
                    if key.lower() not in _NOT_FORWARDED
                },
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    status, headers, body = response.status, response.headers, response.read()
            except urllib.error.HTTPError as error:
                status, headers, body = error.code, error.headers, error.read()
            except OSError as error:
                status, headers = 502, None
                body = f'{{"error_code": 502, "message": "upstream: {error}"}}'.encode()
            self.send_response(status)
            for key, value in headers.items() if headers is not None else []:
                if key.lower() not in _NOT_FORWARDED | {"content-length"}:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        def log_message(self, format: str, *args: object) -> None:
            pass  # no access log: the registry's own log says the same

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="host:port to serve on")
    parser.add_argument("--upstream", required=True, help="base URL requests go to")
    parser.add_argument("--credentials", required=True, help="file holding user:password")
    arguments = parser.parse_args()
    host, port = arguments.listen.rsplit(":", 1)
    user_info = Path(arguments.credentials).read_text(encoding="utf-8").strip()
    authorization = "Basic " + b64encode(user_info.encode()).decode()
    server = ThreadingHTTPServer(
        (host, int(port)), proxy_handler(arguments.upstream.rstrip("/"), authorization)
    )
    server.serve_forever()


if __name__ == "__main__":
    main()

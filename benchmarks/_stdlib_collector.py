"""The collector's HTTP API on the standard library's ThreadingHTTPServer (comparison only).

`benchmarks/collector_load.py --stacks stdlib` runs this in place of `mfuscope collector` (aiohttp)
to compare the two HTTP stacks on the same `Routes`. Same options as the real collector's
``--listen``, ``--address-file``, ``--rate-limit``, ``--per-rank-labels``.

    python benchmarks/_stdlib_collector.py --listen 127.0.0.1:0 --address-file F
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mfuscope.collector._clock import SystemClock
from mfuscope.collector._routes import HttpRequest, HttpResponse, Routes
from mfuscope.collector.app import build_routes, resolve_config


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # read by listen() during construction, so a class attribute


def _handler(routes: Routes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like aiohttp

        def _send(self, response: HttpResponse) -> None:
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            for name, value in response.headers:
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)

        def _dispatch(self) -> None:
            length_text = self.headers.get("Content-Length")
            length = int(length_text) if length_text and length_text.isdigit() else None
            request = HttpRequest(
                method=self.command,
                path=self.path.split("?", 1)[0],
                client=self.client_address[0],
                authorization=self.headers.get("Authorization"),
                content_length=length,
                content_encoding=self.headers.get("Content-Encoding", ""),
                accept=self.headers.get("Accept", ""),
                content_type=self.headers.get("Content-Type", ""),
            )
            early = routes.before_body(request)
            if early is not None:
                self.close_connection = bool(length)  # the unread body would desync the stream
                self._send(early)
                return
            body = self.rfile.read(length) if length else b""
            self._send(routes.handle(request, body))

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _dispatch

        def log_message(self, format: str, *args: object) -> None:
            return None

    return Handler


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--address-file")
    parser.add_argument("--rate-limit", dest="rate_limit_per_s", type=float)
    parser.add_argument("--per-rank-labels", action="store_true", default=None)
    config = resolve_config(vars(parser.parse_args()), os.environ)
    routes = build_routes(config, SystemClock())
    server = _Server(config.host_port, _handler(routes))
    host, port = server.server_address[:2]
    print(f"stdlib collector listening on http://{host}:{port}", flush=True)
    if config.address_file:
        tmp = config.address_file + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{host}:{port}\n")
        os.replace(tmp, config.address_file)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

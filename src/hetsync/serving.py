"""Serving a Starlette app with uvicorn, bounded: a mode's service's and the live page's.

uvicorn (its httptools parser, uvloop where installed) in one process and one event loop, on a
socket bound here (so a bad host or a taken port is one line before anything starts), on a
background thread (tests, `launch`) or in the foreground (a CLI server). What uvicorn does not
bound is bounded here: a request must arrive whole within `REQUEST_TIMEOUT` seconds of its
first byte, and its head (request line and headers) is at most `MAX_HEAD` bytes; idle
keep-alive connections close after `KEEP_ALIVE` seconds, and at most `MAX_CONNECTIONS` are
served at once.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD = 16 * 1024          # bytes: request line and headers
REQUEST_TIMEOUT = 10.0        # seconds from a request's first byte to its last
KEEP_ALIVE = 120              # seconds an idle keep-alive connection stays open
MAX_CONNECTIONS = 2048


class ServerConfigError(ValueError):
    """The server cannot be started as asked (a bad host, a taken port, a missing token)."""


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class _TimedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline per request and a bound on its head:
    uvicorn closes idle keep-alive connections, but not one that sends half a request and
    stops (or never sends one), and httptools accepts headers of any length."""

    _deadline: asyncio.TimerHandle | None = None
    _head = -1  # bytes received while a request's head is incomplete (-1: not in a head)
    _parsed = 0  # bytes of the head the parser has handed over so far

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None:  # a request begins: it has REQUEST_TIMEOUT to arrive whole
            self._arm()
        super().data_received(data)
        if self._head >= 0 and not self.transport.is_closing():  # the head is still coming
            self._head += len(data)
            if self._head > MAX_HEAD:
                self.send_400_response(f"request head over {MAX_HEAD} bytes")

    def on_message_begin(self) -> None:
        self._head = self._parsed = 0
        super().on_message_begin()

    # A head that arrives in one read is parsed whole before `data_received` can count it:
    # the parser's callbacks count it too, and one over the bound fails the parse (a 400).
    def on_url(self, url: bytes) -> None:
        self._grow(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._grow(len(name) + len(value) + 4)  # (": " and CRLF)
        super().on_header(name, value)

    def _grow(self, n: int) -> None:
        self._parsed += n
        if self._parsed > MAX_HEAD:
            raise ValueError(f"request head over {MAX_HEAD} bytes")

    def send_400_response(self, msg: str) -> None:
        if self._parsed > MAX_HEAD:
            msg = f"request head over {MAX_HEAD} bytes"
        super().send_400_response(msg)

    def on_headers_complete(self) -> None:
        self._head = -1
        self._parsed = 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def connection_lost(self, exc) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(REQUEST_TIMEOUT, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()


class Service:
    """`app` served on host:port (port 0: any free one; `self.port` says which)."""

    def __init__(self, app, host: str, port: int):
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._socket = socket.socket(family, socket.SOCK_STREAM)
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._socket.bind((host, port))
            self._socket.listen(1024)
        except (OSError, OverflowError) as err:
            self._socket.close()
            why = err.strerror if isinstance(err, OSError) and err.strerror else err
            raise ServerConfigError(f"--port: invalid value {port}; cannot listen on "
                                    f"{host}:{port} ({why})") from None
        self.host, self.port, self.app = host, self._socket.getsockname()[1], app
        config = uvicorn.Config(app, http=_TimedProtocol, loop="auto", lifespan="off",
                                log_level="warning", access_log=False,
                                timeout_keep_alive=KEEP_ALIVE,
                                limit_concurrency=MAX_CONNECTIONS,
                                proxy_headers=False)  # no proxy in front: trust no header
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def start(self):
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        end = time.monotonic() + 10
        while not self._server.started and self._thread.is_alive() and time.monotonic() < end:
            time.sleep(0.01)
        return self

    def serve_forever(self) -> None:
        self._server.run(sockets=[self._socket])

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._socket.close()

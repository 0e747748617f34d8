"""uvicorn for the HTTP surface, in the gRPC server's event loop, with the request-header timeout
uvicorn lacks and without signal handlers of its own (the server's stop stops it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import ssl
from collections.abc import Iterator, Sequence

import h11
import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.h11_impl import H11Protocol

from contextshift.api.config import ServerConfig
from contextshift.api.tls import Tls


class HeaderTimeoutH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol (h11), closing a connection whose request headers have not all
    arrived `header_timeout` seconds after it opened or after its last answer: uvicorn itself has
    no such limit (a header that never ends held a connection for as long as the client liked).
    A request begun and not finished gets a 408 with a google.rpc.Status body first; an idle
    connection is closed without a word, as a keep-alive timeout closes it."""

    header_timeout = 5.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]  # uvicorn narrows it
        # An answer goes in several writes (its head, then each chunk of its body): without
        # TCP_NODELAY, Nagle holds each small one until the last is acknowledged, which a client
        # delays by up to 40 ms. asyncio sets it only on sockets made with IPPROTO_TCP.
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the headers are in: a request is under way
            self._stop_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._await_headers()  # the next request's

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)

    def _await_headers(self) -> None:
        self._stop_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_timed_out)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:  # part of a request came
            message = f"the request's headers did not arrive within {self.header_timeout:g} s"
            body = json.dumps(
                {"error": {"code": 408, "status": "DEADLINE_EXCEEDED", "message": message, "details": []}}
            ).encode()
            head = (
                "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
            )
            self.transport.write(head.encode() + body)
        self.transport.close()


def header_timeout_protocol(seconds: float) -> type[HeaderTimeoutH11]:
    """`HeaderTimeoutH11` with this server's header timeout (uvicorn makes the protocol itself)."""
    return type("HeaderTimeoutH11", (HeaderTimeoutH11,), {"header_timeout": seconds})


class _Uvicorn(uvicorn.Server):
    """uvicorn without signal handlers of its own: the gRPC server's stop stops it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def start(
    app: Starlette, config: ServerConfig, sockets: Sequence[socket.socket], tls_files: Tls | None
) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    """uvicorn serving `app` on the listening `sockets`, once it is listening."""
    http = _Uvicorn(
        uvicorn.Config(
            app,
            http=header_timeout_protocol(config.http_header_timeout_seconds),
            ws="none",
            lifespan="off",
            log_config=None,
            access_log=False,  # each call is logged by `calls.end_call`
            server_header=False,
            timeout_graceful_shutdown=math.ceil(config.grace_seconds),  # uvicorn takes whole seconds
            ssl_certfile=tls_files.cert_file if tls_files else None,
            ssl_keyfile=tls_files.key_file if tls_files else None,
            ssl_ca_certs=tls_files.client_ca_file if tls_files else None,
            ssl_cert_reqs=tls_files.client_cert_reqs if tls_files else ssl.CERT_NONE,
        )
    )
    task = asyncio.create_task(http.serve(sockets=list(sockets)))
    while not http.started:  # serve() has no hook for "listening"
        if task.done():
            task.result()  # raises why it stopped
            raise RuntimeError("the HTTP server stopped while starting")
        await asyncio.sleep(0.005)
    return http, task

"""The gateway's HTTP/1.1 client (`gateway.http1`) against a raw server on 127.0.0.1 that answers
with the bytes each test gives, cut into the writes it gives: the framings (length, chunked with
extensions and trailers, to the close), interim answers, keep-alive and its refusal, the
errors as httpx's classes, and backpressure."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx
import pytest

from contextshift.api.gateway import http1

TIMEOUT = httpx.Timeout(connect=2.0, read=2.0, write=2.0, pool=2.0)


class Raw:
    """A server answering each request it reads with the next answer's writes (a write per item,
    a short pause between them; none: it waits a second); it counts the connections it accepted
    and keeps the requests."""

    def __init__(self, answers: Sequence[Sequence[bytes]]) -> None:
        self.answers = list(answers)
        self.connections = 0
        self.requests: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Raw:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions?x=1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.startswith(b"content-length")
                    ),
                    0,
                )
                self.requests.append(head + await reader.readexactly(length))
                writes = self.answers.pop(0)
                if not writes:  # no answer at all, for a while
                    await asyncio.sleep(1.0)
                for part in writes:
                    writer.write(part)
                    await writer.drain()
                    await asyncio.sleep(0.005)
                if writes and writes[-1] == b"":  # the answer ends with the close
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


async def _body(answer: http1.Answer) -> list[bytes]:
    try:
        return [piece async for piece in answer.aiter_raw()]
    finally:
        await answer.aclose()


async def _call(pool: http1.Pool, url: str, content: bytes = b'{"a": 1}') -> http1.Answer:
    return await pool.send("POST", url, [(b"authorization", b"Bearer k")], content, TIMEOUT)


def test_framings_interim_answers_and_keep_alive() -> None:
    async def run() -> None:
        pool = http1.Pool(8)
        chunked = [
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n",
            b"Content-Type: text/event-stream\r\n\r\n5;ext=1\r\nhel",
            b"lo\r\n",
            b"6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n",
        ]
        length = [b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\nX-Request-Id: r1\r\n\r\nab", b"cd"]
        to_close = [b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{}", b"[]", b""]
        async with Raw([chunked, length, to_close]) as server:
            first = await _call(pool, server.url)
            assert first.status_code == 200
            assert first.headers.get("content-type") == "text/event-stream"
            assert b"".join(await _body(first)) == b"hello world"
            second = await _call(pool, server.url)
            assert (second.headers.get("x-request-id"), second.headers.raw[-1]) == (
                "r1",
                (b"X-Request-Id", b"r1"),
            )
            assert b"".join(await _body(second)) == b"abcd"
            third = await _call(pool, server.url)
            assert b"".join(await _body(third)) == b"{}[]"
            assert server.connections == 1  # kept alive over the first two, the third read to the close
            sent = server.requests[0]
            assert sent.startswith(b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 127.0.0.1:")
            assert b"\r\nauthorization: Bearer k\r\ncontent-length: 8\r\n\r\n" + b'{"a": 1}' in sent
        await pool.aclose()

    asyncio.run(run())


def test_a_connection_close_or_an_unread_answer_is_not_reused() -> None:
    async def run() -> None:
        pool = http1.Pool(8)
        closing = [b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"]
        long = [b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 10]
        ok = [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
        async with Raw([closing, long, ok]) as server:
            assert b"".join(await _body(await _call(pool, server.url))) == b"ok"
            unread = await _call(pool, server.url)
            await unread.aclose()  # its body not read: the connection goes
            assert b"".join(await _body(await _call(pool, server.url))) == b"ok"
            await asyncio.sleep(0.05)
            assert server.connections == 3
        await pool.aclose()

    asyncio.run(run())


def test_errors_are_httpx_errors() -> None:
    async def run() -> None:
        pool = http1.Pool(8)
        async with Raw([[b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", b""]]) as server:
            answer = await _call(pool, server.url)
            with pytest.raises(httpx.RemoteProtocolError):
                await _body(answer)
        async with Raw([[b"SMTP ready\r\n\r\n"]]) as server:
            with pytest.raises(httpx.RemoteProtocolError):
                await _call(pool, server.url)
        async with Raw([[b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"]]) as server:
            answer = await _call(pool, server.url)
            with pytest.raises(httpx.RemoteProtocolError):
                await _body(answer)
        async with Raw([[]]) as server:  # never answers
            quick = httpx.Timeout(1.0, read=0.2)
            with pytest.raises(httpx.ReadTimeout):
                await pool.send("POST", server.url, [], b"{}", quick)
        async with Raw([]) as server:
            url = server.url
        with pytest.raises(httpx.ConnectError):
            await _call(pool, url)
        with pytest.raises(httpx.LocalProtocolError):
            await pool.send("POST", url, [(b"x-a", b"1\r\nx-b: 2")], b"{}", TIMEOUT)
        await pool.aclose()

    asyncio.run(run())


def test_a_caller_that_does_not_read_stops_the_reading() -> None:
    async def run() -> None:
        pool = http1.Pool(8)
        size = 4 * http1.MAX_BUFFERED
        answer_bytes = [b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size] + [b"y" * 65536] * (
            size // 65536
        )
        async with Raw([answer_bytes]) as server:
            answer = await _call(pool, server.url)
            await asyncio.sleep(0.3)  # the server writes what the connection takes
            connection = answer._connection
            assert connection is not None
            assert connection._paused and connection._buffered <= http1.MAX_BUFFERED + 65536
            assert sum(len(p) for p in await _body(answer)) == size
        await pool.aclose()

    asyncio.run(run())

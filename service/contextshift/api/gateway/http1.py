"""The gateway's HTTP/1.1 client for http:// upstreams: one asyncio protocol per connection, kept
alive in a pool per origin, nothing between the socket and the relay but the framing.

httpx (with httpcore and anyio under it) cost about 1 ms of the event loop per call to a local
upstream, more than the rest of a gateway call: its request and URL models, cookies, the pool's
check of every idle connection, anyio's stream wrappers. Here a call is the request's head written
with its body, the answer's head parsed when it has all come, and its body handed on as it arrives
(the chunked framing undone), in pieces of whatever one read brought: a stream's events that came
together leave together. While more than MAX_BUFFERED bytes wait for the caller, the connection
stops reading (backpressure).

Its errors are httpx's own classes (ConnectError, ConnectTimeout, ReadTimeout, RemoteProtocolError,
LocalProtocolError), so a call does not care which client served it; https:// upstreams keep
httpx, for HTTP/2 and TLS. A connection is reused only after an answer read to its end that did
not ask to close it; one that closed, or has bytes or an end waiting while idle, is dropped.
An answer closed before its end closes its connection at once (the caller went away: the
upstream sees it).
"""

from __future__ import annotations

import asyncio
import collections
import select
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx

# What one connection holds for the caller before it stops reading.
MAX_BUFFERED = 256 * 1024
# The most an answer's head may take.
MAX_HEAD = 64 * 1024
_NO_BODY = frozenset({204, 304})

Headers = Sequence[tuple[bytes, bytes]]


class AnswerHeaders:
    """An answer's headers as they came (`raw`), looked up by name without regard to case."""

    __slots__ = ("raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw

    def get(self, key: str, default: str | None = None) -> str | None:
        name = key.lower().encode("latin-1")
        for k, v in self.raw:
            if k.lower() == name:
                return v.decode("latin-1")
        return default


class _Connection(asyncio.Protocol):
    """One connection and the answer it is reading: its head (`head`, set when whole), then its
    body's pieces (`_pieces`) until `complete`."""

    def __init__(self, origin: tuple[str, int]) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.reusable = False
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray()
        self._head: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._pieces: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._error: Exception | None = None
        self._framing = ""  # "length", "chunked", "close", "none"
        self._left = 0  # a length's bytes still to come, or the current chunk's
        self._chunk_state = "size"  # "size", "data", "crlf", "trailer"
        self.complete = False
        self._keep_alive = True
        self._head_only = False

    # --- the protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self._head is None or self.complete:  # nothing asked for: the connection is not reused
            self.reusable = False
            self._keep_alive = False
            if self.transport is not None:
                self.transport.close()
            return
        if not self._head.done():
            self._buffer += data
            try:
                self._read_head()
            except httpx.RemoteProtocolError as e:
                self._fail(e)
            return
        self._body(data)

    def eof_received(self) -> bool | None:
        self._ended()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._ended()

    def _ended(self) -> None:
        """The upstream closed its side: the end of an answer read to the close, else an error."""
        self.reusable = False
        if self._head is None or self.complete:
            return
        if self._head.done() and self._framing == "close":
            self._finish()
            return
        where = "before its answer's head" if not self._head.done() else "before its answer's end"
        self._fail(httpx.RemoteProtocolError(f"the upstream closed the connection {where}"))

    # --- the answer -----------------------------------------------------------------------------

    def start(self, head_only: bool) -> asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]]:
        """A new answer's head, to come (`head_only`: an answer to HEAD, which has no body)."""
        self._head = self._loop.create_future()
        self._buffer.clear()
        self._pieces.clear()
        self._buffered = 0
        self._error = None
        self.complete = False
        self._keep_alive = True
        self._head_only = head_only
        return self._head

    def rest(self) -> None:
        """Idle in the pool: nothing asked for."""
        self._head = None

    def _read_head(self) -> None:
        assert self._head is not None
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD:
                    raise httpx.RemoteProtocolError("the upstream's answer head is too long")
                return
            lines = bytes(self._buffer[:end]).split(b"\r\n")
            rest = bytes(self._buffer[end + 4 :])
            del self._buffer[:]
            status_line = lines[0].split(b" ", 2)
            if (
                len(status_line) < 2
                or not status_line[0].startswith(b"HTTP/1.")
                or not status_line[1].isdigit()
            ):
                raise httpx.RemoteProtocolError("the upstream's answer is not HTTP/1.1")
            status = int(status_line[1])
            headers: list[tuple[bytes, bytes]] = []
            for line in lines[1:]:
                name, colon, value = line.partition(b":")
                if not colon or not name or name[-1:] in b" \t" or line[:1] in b" \t":
                    raise httpx.RemoteProtocolError("a malformed header in the upstream's answer")
                headers.append((name, value.strip(b" \t")))
            if 100 <= status < 200:  # an interim answer (100 Continue, 103 Early Hints): the next
                self._buffer += rest
                continue
            self._frame(status, headers, status_line[0] == b"HTTP/1.0")
            self._head.set_result((status, headers))
            if rest:
                self._body(rest)
            elif self._framing == "none" or (self._framing == "length" and self._left == 0):
                self._finish()
            return

    def _frame(self, status: int, headers: list[tuple[bytes, bytes]], http10: bool) -> None:
        """How the answer's body is delimited, and whether the connection may serve another."""
        length: int | None = None
        chunked = False
        close = http10
        for name, value in headers:
            lowered = name.lower()
            if lowered == b"content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise httpx.RemoteProtocolError("a bad content-length in the upstream's answer")
                length = int(value)
            elif lowered == b"transfer-encoding":
                chunked = value.lower().rsplit(b",", 1)[-1].strip() == b"chunked"
                if not chunked:
                    close = True
            elif lowered == b"connection":
                tokens = {t.strip() for t in value.lower().split(b",")}
                close = (close and b"keep-alive" not in tokens) or b"close" in tokens
        self._keep_alive = not close
        if self._head_only or status in _NO_BODY:
            self._framing = "none"
        elif chunked:
            self._framing, self._chunk_state = "chunked", "size"
        elif length is not None:
            self._framing, self._left = "length", length
        else:
            self._framing, self._keep_alive = "close", False

    def _body(self, data: bytes) -> None:
        if self._framing == "length":
            if len(data) > self._left:
                self._keep_alive = False  # bytes past the answer: the connection is not reused
                data = data[: self._left]
            self._left -= len(data)
            self._hand_on(data)
            if self._left == 0:
                self._finish()
        elif self._framing == "chunked":
            self._buffer += data
            try:
                self._dechunk()
            except (ValueError, httpx.RemoteProtocolError):
                self._fail(httpx.RemoteProtocolError("malformed chunked framing in the upstream's answer"))
        elif self._framing == "close":
            self._hand_on(data)
        else:
            self._keep_alive = False

    def _dechunk(self) -> None:
        """The chunked body's data in the buffer, handed on as one piece."""
        buffer = self._buffer
        out: list[bytes] = []
        at = 0
        while True:
            if self._chunk_state == "size":
                end = buffer.find(b"\r\n", at)
                if end < 0:
                    if len(buffer) - at > 1024:
                        raise httpx.RemoteProtocolError("a chunk size line is too long")
                    break
                size = int(bytes(buffer[at:end]).split(b";", 1)[0].strip(), 16)
                at = end + 2
                if size == 0:
                    self._chunk_state = "trailer"
                else:
                    self._chunk_state, self._left = "data", size
            elif self._chunk_state == "data":
                take = min(self._left, len(buffer) - at)
                if take == 0:
                    break
                out.append(bytes(buffer[at : at + take]))
                at += take
                self._left -= take
                if self._left == 0:
                    self._chunk_state = "crlf"
            elif self._chunk_state == "crlf":
                if len(buffer) - at < 2:
                    break
                if buffer[at : at + 2] != b"\r\n":
                    raise httpx.RemoteProtocolError("a chunk without its CRLF")
                at += 2
                self._chunk_state = "size"
            else:  # trailers, up to an empty line
                end = buffer.find(b"\r\n", at)
                if end < 0:
                    break
                empty = end == at
                at = end + 2
                if empty:
                    if at < len(buffer):
                        self._keep_alive = False
                    del buffer[:]
                    if out:
                        self._hand_on(b"".join(out))
                    self._finish()
                    return
        del buffer[:at]
        if out:
            self._hand_on(out[0] if len(out) == 1 else b"".join(out))

    def _hand_on(self, data: bytes) -> None:
        if not data:
            return
        self._pieces.append(data)
        self._buffered += len(data)
        if self._buffered > MAX_BUFFERED and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self.complete = True
        self.reusable = self._keep_alive and not self.lost
        self._wake()

    def _fail(self, error: Exception) -> None:
        self.reusable = False
        if self._error is None:
            self._error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        self._wake()
        if self.transport is not None:
            self.transport.close()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def piece(self, timeout: float | None) -> bytes | None:
        """The next piece of the body (None at its end); ReadTimeout after `timeout` seconds
        without one."""
        while not self._pieces:
            if self._error is not None:
                raise self._error
            if self.complete:
                return None
            self._waiter = self._loop.create_future()
            await _within(self._waiter, timeout, self._loop)
            self._waiter = None
        data = self._pieces.popleft()
        self._buffered -= len(data)
        if self._paused and self._buffered <= MAX_BUFFERED // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def idle_and_open(self) -> bool:
        """Whether an idle connection can take a request: open, nothing come since its answer."""
        if self.lost or not self.reusable or self.transport is None or self.transport.is_closing():
            return False
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return False
        poll = select.poll()
        poll.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        return not poll.poll(0)  # readable while idle: its end, or bytes nobody asked for

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()


async def _within(
    future: asyncio.Future[Any], timeout: float | None, loop: asyncio.AbstractEventLoop
) -> None:
    """Waits for `future`; after `timeout` seconds it fails with ReadTimeout."""
    if timeout is None:
        await future
        return

    def expire() -> None:
        if not future.done():
            future.set_exception(httpx.ReadTimeout("the upstream did not answer in time"))

    timer = loop.call_later(timeout, expire)
    try:
        await future
    finally:
        timer.cancel()


class Answer:
    """An upstream's answer: its status and headers, its body as it comes (`aiter_raw`); `aclose`
    gives its connection back to the pool when the body was read to its end, else closes it."""

    def __init__(
        self,
        pool: Pool,
        connection: _Connection,
        status: int,
        headers: list[tuple[bytes, bytes]],
        read_timeout: float | None,
    ) -> None:
        self.status_code = status
        self.headers = AnswerHeaders(headers)
        self._pool = pool
        self._connection: _Connection | None = connection
        self._read_timeout = read_timeout

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        connection = self._connection
        if connection is None:
            return
        while (data := await connection.piece(self._read_timeout)) is not None:
            yield data

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.release(connection)


class Pool:
    """Kept-alive connections per origin (host, port), at most `max_idle` idle ones each."""

    def __init__(self, max_idle: int) -> None:
        self._max_idle = max_idle
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()

    async def send(
        self, method: str, url: str, headers: Headers, content: bytes | None, timeout: httpx.Timeout
    ) -> Answer:
        """`method` on `url` (http://) with `headers` and `content`: the answer once its head came;
        httpx's errors when it cannot be had (ConnectError, ConnectTimeout, ReadTimeout,
        RemoteProtocolError, LocalProtocolError)."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or 80
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        authority = parts.netloc.rpartition("@")[2]  # never a URL's user and password
        head = [f"{method} {target} HTTP/1.1\r\nhost: {authority}\r\n".encode("latin-1")]
        for name, value in headers:
            if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name or b":" in name:
                raise httpx.LocalProtocolError("a header name or value the upstream cannot be sent")
            head += [name, b": ", value, b"\r\n"]
        if content is not None:
            head.append(b"content-length: %d\r\n" % len(content))
        head.append(b"\r\n")
        connection = await self._connection((host, port), timeout.connect)
        assert connection.transport is not None
        answer = connection.start(method == "HEAD")
        try:
            connection.transport.write(b"".join(head))
            if content:
                connection.transport.write(content)
            await _within(answer, timeout.read, asyncio.get_running_loop())
            status, answer_headers = answer.result()
        except BaseException:  # an error, a timeout, or the call cancelled: the connection goes
            self._drop(connection)
            raise
        return Answer(self, connection, status, answer_headers, timeout.read)

    async def _connection(self, origin: tuple[str, int], connect: float | None) -> _Connection:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if connection.idle_and_open():
                return connection
            self._drop(connection)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect):
                _, connection = await loop.create_connection(lambda: _Connection(origin), *origin)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"no connection to {origin[0]}:{origin[1]} in time") from None
        except OSError as e:
            raise httpx.ConnectError(f"no connection to {origin[0]}:{origin[1]}: {e.strerror or e}") from None
        self._open.add(connection)
        return connection

    def release(self, connection: _Connection) -> None:
        """An answer is closed: its connection kept for the next call, or closed."""
        idle = self._idle.setdefault(connection.origin, [])
        if connection.complete and connection.reusable and len(idle) < self._max_idle:
            connection.rest()
            idle.append(connection)
        else:
            self._drop(connection)

    def _drop(self, connection: _Connection) -> None:
        connection.close()
        self._open.discard(connection)

    async def aclose(self) -> None:
        for connection in list(self._open):
            connection.close()
        self._open.clear()
        self._idle.clear()

"""The gateway benchmark's fake provider: an OpenAI Chat Completions endpoint on 127.0.0.1, cheap
enough not to be what a benchmark measures (benchmarks/gateway_bench.py measures it directly first).

A bare asyncio protocol in a process of its own, HTTP/1.1 with keep-alive: it reads a request's
head and its `content-length` bytes of body, never parses the JSON, and answers with bytes made
once at start:
- a body asking for a stream (`"stream": true`): `--events` server-sent events, OpenAI's chat
  chunks, each written as its own chunk of the chunked body (one `send` each, as a provider
  flushes every event), the usage in the last one, then `data: [DONE]`; when the caller's socket
  is full it waits (backpressure), and every EVENTS_PER_TURN events it lets the other connections
  have the loop;
- any other: a chat.completion JSON of a few hundred bytes, in one write.
A request whose query has `record=1` has its body written to `--record` first (the benchmark checks
what the gateway sent upstream on one such call, never on a timed one).

    python benchmarks/gateway_provider.py --port PORT [--events 1000] [--record PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from pathlib import Path

EVENTS_PER_TURN = 32
MAX_HEAD = 64 * 1024
_STREAM_MARKS = (b'"stream":true', b'"stream": true')


def _head(status: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer(prompt_tokens: int = 1000) -> bytes:
    """A whole chat.completion answer, head and body."""
    body = json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-4o",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "The delta holds the river's sediment."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 9,
                "total_tokens": prompt_tokens + 9,
            },
        }
    ).encode()
    headers = [
        ("content-type", "application/json"),
        ("content-length", str(len(body))),
        ("x-request-id", "req_bench"),
    ]
    return _head("200 OK", headers) + body


def stream_parts(events: int, prompt_tokens: int = 1000) -> tuple[bytes, list[bytes]]:
    """A streamed answer's head and its chunks: `events` events in all (the text deltas, the
    finish, the usage and `[DONE]`), then the chunked body's end."""
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o"}

    def event(payload: dict[str, object]) -> bytes:
        data = b"data: " + json.dumps({**base, **payload}, separators=(",", ":")).encode() + b"\n\n"
        return b"%x\r\n%s\r\n" % (len(data), data)

    deltas = [
        event({"choices": [{"index": 0, "delta": {"content": f"word{n} "}, "finish_reason": None}]})
        for n in range(max(0, events - 3))
    ]
    finish = event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": events,
        "total_tokens": prompt_tokens + events,
    }
    last = event({"choices": [], "usage": usage})
    done = b"data: [DONE]\n\n"
    chunks = [*deltas, finish, last, b"%x\r\n%s\r\n" % (len(done), done), b"0\r\n\r\n"]
    headers = [
        ("content-type", "text/event-stream"),
        ("transfer-encoding", "chunked"),
        ("x-request-id", "req_bench"),
    ]
    return _head("200 OK", headers), chunks


class Provider(asyncio.Protocol):
    """One connection: its requests in turn."""

    def __init__(self, whole: bytes, stream: tuple[bytes, list[bytes]], record: Path | None) -> None:
        self._whole = whole
        self._stream_head, self._stream_chunks = stream
        self._record = record
        self._buffer = bytearray()
        self._busy = False  # a stream is being written: the next request waits
        self._writable = asyncio.Event()
        self._writable.set()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._busy:
            self._next()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._writable.set()

    def _next(self) -> None:
        """Answers the requests the buffer holds whole, until one streams."""
        transport = self._transport
        assert transport is not None
        while not self._busy:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD:
                    transport.close()
                return
            head = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self._buffer) < end + 4 + length:
                return
            body = bytes(self._buffer[end + 4 : end + 4 + length])
            del self._buffer[: end + 4 + length]
            target = head[0].split(" ")[1] if " " in head[0] else "/"
            if self._record is not None and "record=1" in target.partition("?")[2]:
                self._record.write_bytes(body)
            if any(mark in body for mark in _STREAM_MARKS):
                self._busy = True
                asyncio.get_running_loop().create_task(self._stream(transport))
            else:
                transport.write(self._whole)

    async def _stream(self, transport: asyncio.Transport) -> None:
        transport.write(self._stream_head)
        for n, chunk in enumerate(self._stream_chunks):
            if transport.is_closing():
                return
            transport.write(chunk)
            if not self._writable.is_set():
                await self._writable.wait()
            elif n % EVENTS_PER_TURN == EVENTS_PER_TURN - 1:
                await asyncio.sleep(0)
        self._busy = False
        self._next()


async def serve(port: int, events: int, record: Path | None) -> None:
    whole, stream = answer(), stream_parts(events)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Provider(whole, stream, record), "127.0.0.1", port, backlog=1024, reuse_address=True
    )
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--events", type=int, default=1000, help="events of a streamed answer")
    parser.add_argument("--record", type=Path, help="where a `record=1` request's body is written")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.events, args.record))


if __name__ == "__main__":
    main()

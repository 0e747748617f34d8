"""A real HTTP server on 127.0.0.1 that plays an OpenAI-compatible Chat Completions endpoint, for
the llm-compact and memory tests (stdlib `ThreadingHTTPServer` in a thread: a real socket, real
HTTP, no mock object). A test sets `mode` to choose how it answers and reads `requests` to see
what was asked."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

GOOD_ANSWER = "The user reported that the export fails; the agent found the cause and proposed a fix."

# How the fake answers:
MODES = (
    "good",  # 200, `answer` as the message, usage reported
    "slow",  # like good, after `delay` seconds
    "error",  # 500, with a body echoing the request's authorization header (a leaky upstream)
    "garbage",  # 200, a body that is not JSON
    "empty",  # 200, an empty message content
    "cut",  # 200, finish_reason "length" (cut at max_tokens)
    "no_usage",  # like good, without a usage object
)


@dataclass(frozen=True)
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def system_prompt(self) -> str:
        return str(self.body["messages"][0]["content"])

    @property
    def user_message(self) -> str:
        return str(self.body["messages"][1]["content"])


class FakeLlm:
    def __init__(self) -> None:
        self.mode = "good"
        self.answer = GOOD_ANSWER
        self.delay = 3.0
        self.prompt_tokens = 321
        self.completion_tokens = 45
        self.requests: list[Recorded] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length))
                headers = {k.lower(): v for k, v in self.headers.items()}
                fake.requests.append(Recorded(self.path, headers, body))
                fake._answer(self, body, headers)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: a test reads `requests`

        self._server = serve_in_thread(Handler)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        stop(self._server)

    def _answer(self, handler: BaseHTTPRequestHandler, body: dict[str, Any], headers: dict[str, str]) -> None:
        mode = self.mode
        if mode == "slow":
            time.sleep(self.delay)
        if mode == "error":
            payload = json.dumps({"error": f"upstream failed for {headers.get('authorization', '')}"})
            self._send(handler, 500, payload.encode())
            return
        if mode == "garbage":
            self._send(handler, 200, b'{"choices": [ this is not json')
            return
        answer = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "" if mode == "empty" else self.answer},
                    "finish_reason": "length" if mode == "cut" else "stop",
                }
            ],
        }
        if mode != "no_usage":
            answer["usage"] = {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            }
        self._send(handler, 200, json.dumps(answer).encode())

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, payload: bytes) -> None:
        try:
            handler.send_response(status)
            handler.send_header("content-type", "application/json")
            handler.send_header("content-length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)


def serve_in_thread(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A real HTTP server on 127.0.0.1 and a free port, serving `handler` from a thread of its own."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


def closed_port_url() -> str:
    """The URL of a port on 127.0.0.1 where nothing listens: connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"

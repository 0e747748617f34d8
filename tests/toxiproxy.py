"""Toxiproxy for the tests: `toxiproxy-server` (installed into .venv/bin by `make go-tools`, pinned
from the Go module proxy) on 127.0.0.1 on a free port, driven through its HTTP API: a proxy between
the server and PostgreSQL, and the faults ("toxics") set on it and taken off again. A `timeout`
toxic with timeout 0 is a network gone silent: Toxiproxy reads what is sent and drops it, nothing
is answered and nothing closed (the peer is Toxiproxy's own socket, so TCP keepalives and
`tcp_user_timeout` never fire against it: only the application's bound ends a call).

A missing binary fails the tests that need it (never a skip): run `make go-tools`.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

BINARY = Path(sys.executable).with_name("toxiproxy-server")
START_TIMEOUT = 10.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Proxy:
    """One proxy of a running Toxiproxy: `listen` forwards to `upstream`."""

    api: httpx.Client
    name: str
    port: int  # where it listens, on 127.0.0.1

    def add(self, toxic: str, kind: str, *, stream: str = "downstream", **attributes: Any) -> None:
        """Adds a toxic (`kind`: timeout, latency, reset_peer, limit_data...) to one direction of
        the proxy's traffic (`stream`: downstream, server to client; upstream, client to server):
        on its connections open now and those opened later."""
        body = {"name": toxic, "type": kind, "stream": stream, "toxicity": 1.0, "attributes": attributes}
        self.api.post(f"/proxies/{self.name}/toxics", json=body).raise_for_status()

    def silence(self) -> None:
        """The network goes silent both ways: every byte dropped, nothing closed."""
        self.add("silent-down", "timeout", stream="downstream", timeout=0)
        self.add("silent-up", "timeout", stream="upstream", timeout=0)

    def remove(self, toxic: str) -> None:
        self.api.delete(f"/proxies/{self.name}/toxics/{toxic}").raise_for_status()

    def clear(self) -> None:
        """Every toxic off: the network is back (connections that lost bytes stay broken)."""
        for toxic in self.api.get(f"/proxies/{self.name}/toxics").raise_for_status().json():
            self.remove(toxic["name"])

    def toxics(self) -> list[str]:
        return [t["name"] for t in self.api.get(f"/proxies/{self.name}/toxics").raise_for_status().json()]


@dataclass
class Toxiproxy:
    api: httpx.Client

    def proxy(self, name: str, upstream_port: int) -> Proxy:
        """A new proxy on a free port of 127.0.0.1 to 127.0.0.1:`upstream_port`."""
        port = _free_port()
        body = {"name": name, "listen": f"127.0.0.1:{port}", "upstream": f"127.0.0.1:{upstream_port}"}
        self.api.post("/proxies", json=body).raise_for_status()
        return Proxy(self.api, name, port)


def binary() -> Path:
    if not BINARY.exists():
        pytest.fail(
            f"{BINARY} not found: install it with `make go-tools` (Toxiproxy, pinned in the Makefile)",
            pytrace=False,
        )
    return BINARY


@contextlib.contextmanager
def running_toxiproxy() -> Iterator[Toxiproxy]:
    """A Toxiproxy server of its own, stopped at the end."""
    port = _free_port()
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(
            [str(binary()), "-host", "127.0.0.1", "-port", str(port)], stdout=log, stderr=subprocess.STDOUT
        )
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as api:
                deadline = time.monotonic() + START_TIMEOUT
                while True:
                    try:
                        api.get("/version").raise_for_status()
                        break
                    except httpx.TransportError:
                        if server.poll() is not None or time.monotonic() > deadline:
                            log.seek(0)
                            pytest.fail(
                                f"toxiproxy-server did not start: {log.read().decode()}", pytrace=False
                            )
                        time.sleep(0.05)
                yield Toxiproxy(api)
        finally:
            server.terminate()
            server.wait(10)

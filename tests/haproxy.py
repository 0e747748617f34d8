"""HAProxy for the tests and the benchmark: Debian's `haproxy` package (2.6; `.ci/run` installs it,
`tests/prerequisites.py` names it) run in the foreground with the shipped configuration,
deploy/haproxy/haproxy.cfg, as it is: its addresses and ports are environment variables, set here
to free ports on 127.0.0.1. Only a comparison run changes the file, and only its balance lines
(`balance`, e.g. `roundrobin`). Its stats page (CSV) says each worker's state as HAProxy sees it.

A missing binary fails the tests that need it (never a skip): `apt-get install -y haproxy`.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

BINARY = Path("/usr/sbin/haproxy")
CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "haproxy" / "haproxy.cfg"
HASHED = "balance hdr(x-chat-id)"
BACKENDS = ("contextshift_grpc", "contextshift_http")
START_TIMEOUT = 15.0


def consecutive_free_ports(count: int) -> int:
    """The first of `count` consecutive free ports on 127.0.0.1 (a worker port base)."""
    for _ in range(200):
        with contextlib.ExitStack() as stack:
            first = stack.enter_context(socket.socket())
            first.bind(("127.0.0.1", 0))
            base = int(first.getsockname()[1])
            if base + count > 65535:
                continue
            try:
                for port in range(base + 1, base + count):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise AssertionError(f"no {count} consecutive free ports")


@dataclass
class Balancer:
    """A running HAProxy: where callers reach it, and its stats page."""

    proc: subprocess.Popen[bytes]
    grpc_port: int
    http_port: int
    stats_port: int
    log_path: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def states(self) -> dict[tuple[str, str], str]:
        """(backend, server) -> status (UP, DOWN, UP 1/2, ...), from the stats CSV."""
        text = httpx.get(f"http://127.0.0.1:{self.stats_port}/;csv", timeout=5).text
        rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
        return {
            (row["pxname"], row["svname"]): row["status"]
            for row in rows
            if row["pxname"] in BACKENDS and row["svname"] not in {"FRONTEND", "BACKEND"}
        }

    def redispatched(self) -> int:
        """Calls HAProxy sent to another worker after the one chosen refused the connection."""
        text = httpx.get(f"http://127.0.0.1:{self.stats_port}/;csv", timeout=5).text
        rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
        return sum(
            int(row["wredis"] or 0)
            for row in rows
            if row["pxname"] in BACKENDS and row["svname"] == "BACKEND"
        )

    def wait_states(self, wanted: Mapping[str, str], timeout: float = START_TIMEOUT) -> None:
        """Until each server named in `wanted` (w0, w1) has that status in both backends."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.states()
            if all(states.get((b, s)) == status for b in BACKENDS for s, status in wanted.items()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"HAProxy's servers are {states}, not {dict(wanted)}")
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def running(
    tmp_path: Path,
    ports: tuple[int, int, int],
    worker_ports: list[int],
    worker_http_ports: list[int],
    *,
    balance: str | None = None,
) -> Iterator[Balancer]:
    """HAProxy with deploy/haproxy/haproxy.cfg on free `ports` (gRPC, HTTP, stats) in front of two
    workers on their own ports, once both are UP in both backends; stopped at the end. `balance`:
    another algorithm than hashing x-chat-id (a comparison)."""
    assert BINARY.exists(), "HAProxy is missing: as root, apt-get install -y haproxy"
    assert len(worker_ports) == len(worker_http_ports) == 2, "the shipped configuration lists two workers"
    config = CONFIG
    if balance is not None:
        text = CONFIG.read_text()
        assert text.count(HASHED) == len(BACKENDS)
        config = tmp_path / "haproxy.cfg"
        config.write_text(text.replace(HASHED, f"balance {balance}"))
    grpc_port, http_port, stats_port = ports
    env = os.environ | {
        "CS_GRPC_BIND": f"127.0.0.1:{grpc_port}",
        "CS_HTTP_BIND": f"127.0.0.1:{http_port}",
        "CS_STATS_BIND": f"127.0.0.1:{stats_port}",
        "CS_HOST": "127.0.0.1",
    }
    for i, (port, http) in enumerate(zip(worker_ports, worker_http_ports, strict=True)):
        env |= {f"CS_W{i}_PORT": str(port), f"CS_W{i}_HTTP_PORT": str(http)}
    log_path = tmp_path / f"haproxy-{grpc_port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(BINARY), "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT, env=env
        )
    balancer = Balancer(proc, grpc_port, http_port, stats_port, log_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _all_up(balancer):
            if proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {proc.returncode}:\n{balancer.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"HAProxy's workers not UP in {START_TIMEOUT} s:\n{balancer.log()}")
            time.sleep(0.05)
        yield balancer
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # a hard stop: the test's calls are done
        proc.wait(10)


def _all_up(balancer: Balancer) -> bool:
    try:
        states = balancer.states()
    except httpx.HTTPError:  # not listening yet
        return False
    return len(states) == 2 * len(BACKENDS) and set(states.values()) == {"UP"}

"""The real server as a subprocess on 127.0.0.1, on free ports, ready once it logs that it serves."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from contextshift.audit import default_url

START_TIMEOUT = 30.0


def free_ports(count: int) -> list[int]:
    """`count` different free ports: bound together, so the kernel cannot hand one out twice."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def free_port() -> int:
    return free_ports(1)[0]


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    port: int
    http_port: int
    log_path: Path
    store: str  # the store URL

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def log_lines(self) -> list[dict[str, Any]]:
        text = self.log_path.read_text()
        # Read while the workers write: a last line without its newline may be cut, so it waits.
        complete = text[: text.rfind("\n") + 1]
        return [json.loads(line) for line in complete.splitlines() if line.startswith("{")]

    def wait_serving(self, workers: int, timeout: float = 30.0) -> None:
        """Until `workers` processes listen: a connection made before the others listen can only
        reach the first."""
        deadline = time.monotonic() + timeout
        while sum(line.get("msg") == "serving" for line in self.log_lines()) < workers:
            if time.monotonic() > deadline:
                raise AssertionError(f"fewer than {workers} worker processes serving after {timeout} s")
            time.sleep(0.05)

    def until_every_worker_answers(self, call: Callable[[], object], method: str, bound: int = 200) -> int:
        """Runs `call` (which opens a new connection) until every serving worker process has logged
        an answer to `method`, at most `bound` times; returns how many calls it made. The kernel
        picks a worker per connection by a hash of its addresses, so any fixed number of
        connections may all reach one (200 all reaching one of two: about 2^-199). Call after
        `wait_serving`."""
        workers = {line["pid"] for line in self.log_lines() if line.get("msg") == "serving"}
        for made in range(1, bound + 1):
            call()
            # A call's line is written before its answer is sent; were it later, one more call.
            if {line["pid"] for line in self.log_lines() if line.get("method") == method} == workers:
                return made
        raise AssertionError(f"{bound} new connections did not reach all {len(workers)} workers")

    def terminate(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def health_status(address: str, service: str = "", timeout: float = 2.0) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=service)
        return int(stub.Check(request, timeout=timeout).status)  # type: ignore[attr-defined]  # stub lacks it


GATED_SERVER = Path(__file__).with_name("gated_server.py")


@dataclass
class Gate:
    """Holds every engine call (or store write of a shift, `at="record_shift"`) of a gated server
    (see gated_server.py) until opened."""

    path: Path
    at: str = "engine"

    def wait_entered(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.path.with_suffix(".entered").exists():
            if time.monotonic() > deadline:
                raise AssertionError("no call reached the engine")
            time.sleep(0.01)

    def open(self) -> None:
        self.path.touch()

    def close(self) -> None:
        """Holds the next calls again."""
        self.path.unlink(missing_ok=True)
        self.path.with_suffix(".entered").unlink(missing_ok=True)


def start_server(
    tmp_path: Path,
    *flags: str,
    port: int | None = None,
    http_port: int | None = None,
    wait: bool = True,
    env: dict[str, str] | None = None,
    gate: Gate | None = None,
    store: str | None = None,
    default_store: bool = False,
    cwd: Path | None = None,
) -> ServerProcess:
    """Start `contextshift serve` with `flags`, in `cwd` (default: this process's); the environment
    has no CONTEXTSHIFT_/LLM_ settings but `env`. The store is `store`, or a SQLite file of its own
    in `tmp_path`; with `default_store`, no --store at all (the server's default, in the data
    directory `env` names). With
    `gate`, every engine call waits for the gate to open."""
    # Chosen together: two separate picks can return the same port.
    chosen = iter(free_ports(2))
    port = next(chosen) if port is None else port
    http_port = next(chosen) if http_port is None else http_port
    if http_port == port:
        http_port = next(chosen)
    log_path = tmp_path / f"server-{port}-{time.monotonic_ns()}.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEXTSHIFT_", "LLM_"))}
    env = clean | (env or {})
    if default_store:
        store_flags: list[str] = []
        store = default_url(env)  # where the default puts it
    else:
        store = store or f"sqlite:///{tmp_path}/store-{port}.db"
        store_flags = ["--store", store]
    program = ["-m", "contextshift", "serve"]
    if gate is not None:
        env["CONTEXTSHIFT_TEST_GATE"] = str(gate.path)
        env["CONTEXTSHIFT_TEST_GATE_AT"] = gate.at
        program = [str(GATED_SERVER)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                *program,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--http-port",
                str(http_port),
                *store_flags,
                *flags,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
        )
    server = ServerProcess(proc, port, http_port, log_path, store)
    if wait:
        deadline = time.monotonic() + START_TIMEOUT
        # Logged once health is SERVING and both ports listen (plaintext or TLS, keys or not).
        while not any(line.get("msg") == "serving" for line in server.log_lines()):
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
            if time.monotonic() > deadline:
                server.terminate()
                raise RuntimeError(f"server not healthy in {START_TIMEOUT}s:\n{log_path.read_text()}")
            time.sleep(0.05)
    return server


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[ServerProcess, Gate]]:
    """A server of its own whose engine calls wait for the gate."""
    gate = Gate(tmp_path / "gate")
    running = start_server(tmp_path, "--drain-seconds", "0.2", gate=gate)
    yield running, gate
    gate.open()
    running.terminate()


@contextlib.contextmanager
def serving(tmp_path: Path, *flags: str, **options: Any) -> Iterator[ServerProcess]:
    """`start_server` for the length of a block; the server must stop cleanly after it."""
    running = start_server(tmp_path, *flags, **options)
    try:
        yield running
    finally:
        assert running.terminate() == 0


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One shared server: echo on, room for large requests."""
    with serving(
        tmp_path_factory.mktemp("server"), "--bench-echo", "--max-request-bytes", str(64 * 1024 * 1024)
    ) as running:
        yield running


@pytest.fixture(scope="session")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as chan:
        yield chan

"""Where the server's processes listen: the shared ports (`port`, `http_port`: every worker on both,
SO_REUSEPORT spreading connections over them), each worker's own ports (`worker_port_base + i`,
`worker_http_port_base + i`: a balancer that keeps a chat on one worker sends it there), and the
workers file that says which process is on which (`workers_file`), for a balancer's configuration.

A port that cannot be had fails the start loudly (`BindError`, naming the setting): one process
binds without SO_REUSEPORT; with several, the parent checks every port is free before it reserves
it with SO_REUSEPORT for the workers it forks (a port another SO_REUSEPORT listener holds, such as
another contextshift's worker, is refused too, not shared).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from contextshift.api.config import ServerConfig


class BindError(Exception):
    """A port the server cannot listen on, named with its setting."""

    def __init__(self, setting: str, host: str, port: int, why: str) -> None:
        super().__init__(f"cannot listen on {host}:{port} ({setting} {port}): {why}")
        self.fields = {"setting": setting, "host": host, "port": port, "error": str(self)}


def bind_error(setting: str, host: str, port: int, error: OSError) -> BindError:
    return BindError(setting, host, port, error.strerror or str(error))


def _socket(host: str) -> socket.socket:
    return socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)


def listen(setting: str, host: str, port: int, reuse_port: bool) -> socket.socket:
    """An HTTP listening socket, shared by the workers through SO_REUSEPORT as gRPC's is."""
    sock = _socket(host)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise bind_error(setting, host, port, e) from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


@contextlib.contextmanager
def reserved_port(setting: str, host: str, port: int, *, own: bool = False) -> Iterator[int]:
    """Hold host:port with SO_REUSEPORT while the workers run, so a port of 0 picks one port for
    all of them and another program without SO_REUSEPORT cannot take it meanwhile. An `own` port
    (one worker's) is first bound without SO_REUSEPORT, so one that anything listens on fails."""
    if own:
        with _socket(host) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed one's TIME_WAIT
            try:
                probe.bind((host, port))
            except OSError as e:
                raise bind_error(setting, host, port, e) from None
    with _socket(host) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            raise bind_error(setting, host, port, e) from None
        yield sock.getsockname()[1]


@dataclass(frozen=True)
class Worker:
    """One serving process: its index among the workers, and its own ports (None: none)."""

    index: int
    port: int | None
    http_port: int | None

    @classmethod
    def of(cls, config: ServerConfig, index: int) -> Worker:
        def own(base: int | None) -> int | None:
            return None if base is None else base + index

        return cls(index, own(config.worker_port_base), own(config.worker_http_port_base))

    def setting(self, surface: str) -> str:
        """The setting that gave its `port` or `http_port`, as an error names it."""
        base = "worker_port_base" if surface == "port" else "worker_http_port_base"
        return f"{base} + {self.index}" if self.index else base


@contextlib.contextmanager
def reserved_workers(config: ServerConfig) -> Iterator[None]:
    """Every worker's own ports held (see `reserved_port`) while the workers run."""
    with contextlib.ExitStack() as stack:
        for index in range(config.workers):
            worker = Worker.of(config, index)
            for surface, port in (("port", worker.port), ("http_port", worker.http_port)):
                if port is not None:
                    stack.enter_context(reserved_port(worker.setting(surface), config.host, port, own=True))
        yield


@dataclass(frozen=True)
class Running:
    """A started worker as the workers file lists it."""

    index: int
    pid: int
    port: int | None
    http_port: int | None


def write_workers_file(
    path: str, config: ServerConfig, port: int | None, http_port: int | None, workers: Sequence[Running]
) -> None:
    """The workers file (`workers_file`), replaced whole (a reader never sees half of it): host,
    the shared ports (null when off) and each live worker's index, pid and own ports."""
    status = {
        "host": config.host,
        "port": port,
        "http_port": http_port,
        "workers": [asdict(w) for w in sorted(workers, key=lambda w: w.index)],
    }
    target = Path(path)
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(status, out, indent=2)
            out.write("\n")
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise

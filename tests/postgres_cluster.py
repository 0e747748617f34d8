"""A throwaway PostgreSQL cluster for the tests: Debian's PostgreSQL server binaries (the newest
major version installed; 15 on Debian 12), a data directory in a temporary folder, listening on
127.0.0.1 on a free port, run by a dedicated non-root user (PostgreSQL refuses to run as root),
stopped and removed at the end of the session.

Missing binaries fail the tests that need them (never a skip): install the `postgresql` package
(`apt-get install -y postgresql`; `.ci/run` does).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

INSTALLED = Path("/usr/lib/postgresql")  # <major version>/bin/ per installed version
USER = "contextshift-pg"  # runs the cluster when the tests run as root
ADMIN = "postgres"  # the cluster's superuser (trust authentication, 127.0.0.1 only)


@dataclass(frozen=True)
class Cluster:
    port: int
    # The pg_ctl command (with its user and data directory) and the server options it starts with.
    control: tuple[str, ...]
    options: str
    log: Path

    def restart(self) -> None:
        """Stops the server (every session's connection closed) and starts it again on its port."""
        self._control("restart")

    def stop(self) -> None:
        """Stops the server: every session's connection closed, new ones refused."""
        self._control("stop")

    def start(self) -> None:
        """Starts the stopped server again on its port."""
        self._control("start")

    def _control(self, action: str) -> None:
        done = subprocess.run(
            [*self.control, "-o", self.options, "-l", str(self.log), "-m", "fast", "-w", "-t", "60", action],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, f"PostgreSQL did not {action}: {done.stdout}{done.stderr}"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{ADMIN}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """The URL of a new, empty database of its own."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_cluster_user() -> list[str]:
    """The command prefix that runs a command as the cluster's user: none unless root."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
            check=True,
            capture_output=True,
        )
    return ["runuser", "-u", USER, "--"]


def binaries() -> Path:
    found = sorted(
        INSTALLED.glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0
    )
    if not found or not found[-1].with_name("initdb").exists():
        pytest.fail(
            f"PostgreSQL server binaries not found in {INSTALLED}/<version>/bin: install the `postgresql` "
            "package (apt-get install -y postgresql), as .ci/run does",
            pytrace=False,
        )
    return found[-1].parent


@contextmanager
def running_cluster() -> Iterator[Cluster]:
    installed = binaries()
    initdb, pg_ctl = installed / "initdb", installed / "pg_ctl"
    prefix = _as_cluster_user()
    base = Path(tempfile.mkdtemp(prefix="contextshift-pg-"))
    if prefix:
        shutil.chown(base, USER, USER)
    data, log = base / "data", base / "server.log"
    port = _free_port()
    run = [*prefix, str(pg_ctl), "-D", str(data)]
    try:
        subprocess.run(
            [
                *prefix,
                str(initdb),
                "-D",
                str(data),
                "-U",
                ADMIN,
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
        )
        # A test cluster: no fsync (the tests check contextshift, not the disk), sockets only in
        # its own folder and on 127.0.0.1.
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={base} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        started = subprocess.run(
            [*run, "-o", options, "-l", str(log), "-w", "-t", "60", "start"], capture_output=True, text=True
        )
        if started.returncode != 0:
            server_log = log.read_text() if log.exists() else ""
            pytest.fail(
                f"PostgreSQL did not start: {started.stdout}{started.stderr}\n{server_log}", pytrace=False
            )
        yield Cluster(port, tuple(run), options, log)
    finally:
        subprocess.run([*run, "-m", "immediate", "-w", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)

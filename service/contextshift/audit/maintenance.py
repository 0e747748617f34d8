"""What an operator does to a store besides serving it (`contextshift store ...`): check it, and back
up and restore a SQLite one.

- `check`: the schema's version against this contextshift's, the database's own integrity check
  and the store's invariants (`Store.problems`), and what it holds. Never migrates, never creates.
- `backup`: SQLite's online backup API, in one step, so the copy is one consistent snapshot (a read
  transaction: in WAL mode the server's writers go on meanwhile), written to a temporary file next
  to the destination, checked, synced and renamed into place: a backup file is whole or absent.
- `restore`: the backup checked first, then copied into the store by the same API, in one write
  transaction (readers see the old store or the new one, never a mix; the WAL and its index are
  the database's own business, not files to copy or remove by hand).

PostgreSQL has its own tools for backups (pg_dump, base backups): see docs/operations.md.
"""

from __future__ import annotations

import os
import sqlite3
import time
from contextlib import closing
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from contextshift.audit.migrations import LATEST
from contextshift.audit.sqlite import SqliteStore
from contextshift.audit.store import Store, StoreError

BUSY_TIMEOUT_MS = 10_000


class MaintenanceError(StoreError):
    """What an operator asked for cannot be done (the message says why and what to do)."""


@dataclass(frozen=True)
class Checked:
    """What `check` found."""

    store: str
    schema_version: int
    latest_schema: int
    problems: list[str] = field(default_factory=list)
    data_bytes: int | None = None
    chats: int | None = None
    disk_free_bytes: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def check(store: Store) -> Checked:
    """The store's schema version, problems and contents (see the module's doc)."""
    _require_existing(store)
    version = store.schema_version()
    if version == 0:
        return Checked(store.description, 0, LATEST, ["no contextshift schema: not a store, or never served"])
    if version > LATEST:
        problem = (
            f"schema version {version} is newer than this contextshift knows ({LATEST}): upgrade contextshift"
        )
        return Checked(store.description, version, LATEST, [problem])
    if version < LATEST:
        # The invariants read tables of the latest schema; the server migrates at its start.
        problem = f"schema version {version}: this contextshift migrates it to {LATEST} when it serves it"
        return Checked(store.description, version, LATEST, [problem])
    usage = store.usage()
    return Checked(
        store.description,
        version,
        LATEST,
        store.problems(),
        usage.data_bytes,
        usage.chats,
        usage.disk_free_bytes,
    )


@dataclass(frozen=True)
class Copied:
    """A backup or restore done: where to, how big, how long, and the copy's check."""

    path: str
    bytes: int
    seconds: float
    checked: Checked

    def as_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "checked": self.checked.as_json(),
        }


def backup(store: Store, destination: Path) -> Copied:
    """A consistent copy of a SQLite store at `destination` (a new file), checked."""
    source_path = _sqlite_path(store, "backup")
    _require_existing(store)
    if destination.exists():
        raise MaintenanceError(f"{destination} exists: back up to a new path")
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(f".{destination.name}.partial-{os.getpid()}")
    start = time.perf_counter()
    try:
        _copy(source_path, partial)
        checked = _checked_file(partial)
        if not checked.ok:
            raise MaintenanceError(
                f"the copy of {store.description} failed its check: {'; '.join(checked.problems)}"
            )
        _sync(partial)
        partial.rename(destination)
        _sync(destination.parent)
    finally:
        for leftover in (partial, Path(f"{partial}-wal"), Path(f"{partial}-shm")):
            leftover.unlink(missing_ok=True)
    size = destination.stat().st_size
    return Copied(
        str(destination), size, time.perf_counter() - start, replace(checked, store=f"sqlite {destination}")
    )


def restore(store: Store, source: Path, *, overwrite: bool = False) -> Copied:
    """The SQLite store made a copy of the backup at `source` (checked first). A store that holds
    chats is replaced only with `overwrite`."""
    target_path = _sqlite_path(store, "restore")
    if not source.is_file():
        raise MaintenanceError(f"{source}: no such backup file")
    checked = _checked_file(source)
    if not checked.ok:
        raise MaintenanceError(f"{source} failed its check, nothing restored: {'; '.join(checked.problems)}")
    if target_path.exists() and not overwrite:
        current = check(store)
        if current.chats:
            raise MaintenanceError(
                f"{store.description} holds {current.chats} chats: add --overwrite to replace them with the backup's"
            )
    start = time.perf_counter()
    target_path.parent.mkdir(parents=True, exist_ok=True)
    _copy(source, target_path)
    return Copied(str(target_path), target_path.stat().st_size, time.perf_counter() - start, check(store))


def _copy(source: Path, target: Path) -> None:
    """The whole database at `source` into `target`, one snapshot read in one step and written in
    one transaction (SQLite's backup API)."""
    with closing(_connect(source)) as reader, closing(_connect(target)) as writer:
        reader.backup(writer, pages=-1)


def _connect(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return connection


def _checked_file(path: Path) -> Checked:
    """`check` of the SQLite file at `path`, closed again (its WAL folded back into it)."""
    copy = SqliteStore(path)
    try:
        return check(copy)
    finally:
        copy.close()


def _sqlite_path(store: Store, what: str) -> Path:
    if not isinstance(store, SqliteStore):
        raise MaintenanceError(
            f"contextshift store {what} copies SQLite stores; {store.description} is PostgreSQL: use its own "
            "tools (pg_dump and pg_restore, or base backups), as docs/operations.md shows"
        )
    return store.path


def _require_existing(store: Store) -> None:
    if isinstance(store, SqliteStore) and not store.path.is_file():
        raise MaintenanceError(f"{store.path}: no such store file")


def _sync(path: Path) -> None:
    """Makes what was written to the file (or a folder's entries) durable."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)

"""The audit store: generations and their audits, calibrations, stored chat history, model
configurations. One URL picks the backend:

- `sqlite:///<path>` (`sqlite:////abs/path.db` for an absolute path), or the path alone, with
  optional `?synchronous=normal|full&busy_timeout_ms=5000`: embedded, created on first use, shared by
  the worker processes of one machine (see `sqlite.py`); the default is `default_url()`, in the
  user's data directory;
- `postgresql://user:password@host:port/database` (also `postgres://`, and any libpq parameters):
  shared by any number of replicas (see `postgres.py`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qsl

from contextshift.audit.store import Store, StoreConfigError, redacted

SQLITE_PREFIX = "sqlite:///"
POSTGRES_PREFIXES = ("postgresql://", "postgres://")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def default_url(env: Mapping[str, str] | None = None) -> str:
    """The default store: a SQLite file in the user's data directory (`$XDG_DATA_HOME`, else
    `~/.local/share`), `contextshift/contextshift.db`. Not the working directory: a server started
    in a project's checkout would leave an untracked database there, and would find its chats,
    audits and model configurations only when started from the same folder again."""
    env = os.environ if env is None else env
    data = env.get("XDG_DATA_HOME", "")
    if not os.path.isabs(data):  # the XDG spec: a relative path is to be ignored
        data = os.path.join(env.get("HOME") or str(Path.home()), ".local", "share")
    return f"{SQLITE_PREFIX}{os.path.join(data, 'contextshift', 'contextshift.db')}"


def open_store(
    url: str,
    *,
    pool_size: int = 4,
    max_bytes: int | None = None,
    reserve_bytes: int = 0,
    timeout_ms: int | None = None,
) -> Store:
    """The store `url` names, not connected yet (each process connects on first use), refusing new
    data past `max_bytes` of it and, for SQLite, with less than `reserve_bytes` free on its disk
    (see `Store`), every call ended past `timeout_ms` (None: unbounded; see `audit.bounds`).
    Raises StoreConfigError for an unknown scheme or a malformed URL. A path without a scheme
    (`contextshift.db`, `/var/lib/contextshift/store.db`) is a SQLite file."""
    bound = None if timeout_ms is None else timeout_ms / 1e3
    if not _SCHEME.match(url):
        url = SQLITE_PREFIX + os.path.expanduser(url)
    if url.startswith(POSTGRES_PREFIXES):
        from contextshift.audit.postgres import PostgresStore  # psycopg loads only for PostgreSQL

        _check_postgres_url(url)
        return PostgresStore(url, pool_size=pool_size, max_bytes=max_bytes, store_timeout=bound)
    if url.startswith(SQLITE_PREFIX):
        from contextshift.audit.sqlite import DEFAULT_BUSY_TIMEOUT_MS, SqliteStore

        path, _, query = url.removeprefix(SQLITE_PREFIX).partition("?")
        if not path or path == ":memory:":
            raise StoreConfigError(
                f"store URL {url!r}: name a database file, e.g. sqlite:///./contextshift.db"
            )
        options = dict(parse_qsl(query, keep_blank_values=True))
        unknown = sorted(set(options) - {"synchronous", "busy_timeout_ms"})
        if unknown:
            raise StoreConfigError(
                f"store URL {url!r}: unknown options {', '.join(unknown)} (known: synchronous, busy_timeout_ms)"
            )
        timeout = options.get("busy_timeout_ms", str(DEFAULT_BUSY_TIMEOUT_MS))
        if not timeout.isdigit():
            raise StoreConfigError(f"store URL {url!r}: busy_timeout_ms must be a number of milliseconds")
        return SqliteStore(
            Path(path),
            synchronous=options.get("synchronous", "normal").lower(),
            busy_timeout_ms=int(timeout),
            max_bytes=max_bytes,
            reserve_bytes=reserve_bytes,
            store_timeout=bound,
        )
    scheme = url.partition(":")[0] if ":" in url else url
    raise StoreConfigError(
        f"store URL {redacted(url)!r}: unknown scheme {scheme!r}; use a file path, sqlite:///<path> "
        "or postgresql://<host>/<database>"
    )


def _check_postgres_url(url: str) -> None:
    """Raises StoreConfigError for a URL libpq cannot parse, or with a port that is no port: found
    at start as a configuration error, not later as a database that cannot be reached."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError as e:
        # libpq quotes what it could not parse, which may be the whole URL or the password.
        reason = str(e).strip().replace(f'"{url}"', f'"{redacted(url)}"')
        password = re.search(r"://[^/:@]*:([^/@]+)@", url)
        if password:
            reason = reason.replace(f'"{password.group(1)}"', '"***"')
        raise StoreConfigError(f"store URL {redacted(url)!r}: {reason}") from None
    for port in str(params.get("port", "")).split(","):  # one per host; empty: the default
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise StoreConfigError(f"store URL {redacted(url)!r}: port {port!r} is not a port number")

"""API keys and tenants, the same on both surfaces (`authorization: Bearer <key>`, as an HTTP
header or gRPC metadata).

Each key belongs to a tenant. Keys are kept only as SHA-256 digests and a presented key's digest is
compared with every stored one by `hmac.compare_digest` (no early exit, so the time taken says
nothing about which key, or how much of one, matched). A server without keys serves every caller
as the tenant "" and asks for no key.

The tenant of the call being served is `current_tenant()`, set for the call's task before the
servicer runs: whatever a servicer stores per chat is keyed by (tenant, chat_id), so one tenant
never reads, finishes or deletes another's chat, whatever ids the two choose. Work handed to
another thread does not see the context variable: read the tenant on the event loop and pass it.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

from google.rpc import code_pb2

from contextshift.api.config import ConfigError
from contextshift.api.service.rpc_status import RequestError

NO_TENANT = ""  # every caller's tenant when the server has no keys
MIN_KEY_LENGTH = 16
_TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

_tenant: contextvars.ContextVar[str] = contextvars.ContextVar("contextshift_tenant", default=NO_TENANT)


def current_tenant() -> str:
    """The tenant of the call being served (NO_TENANT when the server has no keys)."""
    return _tenant.get()


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class ApiKeys:
    """The keys a server accepts, as digests, each with its tenant."""

    def __init__(self, keys: Iterable[tuple[str, str]]) -> None:
        """`keys`: (tenant, key) pairs; a tenant may have several keys (rotation)."""
        entries: dict[bytes, str] = {}
        for tenant, key in keys:
            if not _TENANT_NAME.fullmatch(tenant):
                raise ConfigError(
                    f"tenant {tenant!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
                )
            if len(key) < MIN_KEY_LENGTH or key != key.strip():
                raise ConfigError(
                    f"a key of tenant {tenant!r}: at least {MIN_KEY_LENGTH} characters, no surrounding spaces"
                )
            digest = _digest(key)
            if entries.get(digest, tenant) != tenant:
                raise ConfigError(f"one key is given to two tenants: {entries[digest]!r} and {tenant!r}")
            entries[digest] = tenant
        self._entries = list(entries.items())

    def __len__(self) -> int:
        return len(self._entries)

    def tenant_of(self, authorization: str | None) -> str:
        """The tenant whose key an `authorization` value carries; UNAUTHENTICATED otherwise (the
        message never repeats what was sent)."""
        if not authorization:
            raise RequestError(
                code_pb2.UNAUTHENTICATED,
                "this server needs an API key: send `authorization: Bearer <key>`",
            )
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise RequestError(code_pb2.UNAUTHENTICATED, "authorization must be `Bearer <key>`")
        presented = _digest(key.strip())
        found = None
        for digest, tenant in self._entries:  # all of them, whatever matches
            if hmac.compare_digest(digest, presented):
                found = tenant
        if found is None:
            raise RequestError(code_pb2.UNAUTHENTICATED, "the API key is not valid")
        return found


def authenticate(keys: ApiKeys | None, authorization: str | None) -> str:
    """Sets the current call's tenant from its `authorization` (no keys: NO_TENANT) and returns it."""
    tenant = NO_TENANT if keys is None else keys.tenant_of(authorization)
    _tenant.set(tenant)
    return tenant


def _key_lines(text: str, source: str) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        tenant, sep, key = line.partition(":")
        if not sep:
            raise ConfigError(f"{source}:{number}: expected `tenant:key`")
        pairs.append((tenant.strip(), key.strip()))
    return pairs


def _key_table(table: Mapping[str, object], source: str) -> list[tuple[str, str]]:
    tenants = table.get("tenants")
    if not isinstance(tenants, dict) or set(table) != {"tenants"}:
        raise ConfigError(
            f'{source}: expected only a [tenants] table of `name = "key"` or `name = ["key", ...]`'
        )
    pairs: list[tuple[str, str]] = []
    for tenant, keys in tenants.items():
        listed = [keys] if isinstance(keys, str) else keys
        if not isinstance(listed, list) or not all(isinstance(k, str) for k in listed):
            raise ConfigError(f"{source}: tenants.{tenant}: expected a key or a list of keys")
        pairs.extend((tenant, key) for key in listed)
    return pairs


def load_keys(file: str | None, listed: str | None) -> ApiKeys | None:
    """The keys of the `api_keys_file` and `api_keys` settings; None when neither gives any."""
    pairs: list[tuple[str, str]] = []
    if file is not None:
        path = Path(file)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"api_keys_file: {e}") from None
        if path.suffix == ".toml":
            try:
                pairs += _key_table(tomllib.loads(text), file)
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"{file}: {e}") from None
        else:
            pairs += _key_lines(text, file)
    if listed:
        pairs += _key_lines(listed.replace(",", "\n"), "api_keys")
    return ApiKeys(pairs) if pairs else None

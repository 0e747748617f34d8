"""API keys: where they come from, what is kept of them, and who they say the caller is."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.rpc import code_pb2

from contextshift.api.auth import ApiKeys, load_keys
from contextshift.api.config import ConfigError
from contextshift.api.service.rpc_status import RequestError

KEY_A = "a-key-of-tenant-a-0123456789"
KEY_A2 = "a-second-key-of-tenant-a-4567"
KEY_B = "a-key-of-tenant-b-0123456789"


def unauthenticated(keys: ApiKeys, authorization: str | None) -> str:
    with pytest.raises(RequestError) as caught:
        keys.tenant_of(authorization)
    assert caught.value.code == code_pb2.UNAUTHENTICATED
    return str(caught.value)


def test_lines_toml_and_the_environment_give_the_same_keys(tmp_path: Path) -> None:
    lines = tmp_path / "keys.txt"
    lines.write_text(f"# tenant:key\nacme:{KEY_A}\n\nacme:{KEY_A2}\nglobex : {KEY_B}\n")
    table = tmp_path / "keys.toml"
    table.write_text(f'[tenants]\nacme = ["{KEY_A}", "{KEY_A2}"]\nglobex = "{KEY_B}"\n')
    listed = f"acme:{KEY_A},acme:{KEY_A2},globex:{KEY_B}"
    for keys in (load_keys(str(lines), None), load_keys(str(table), None), load_keys(None, listed)):
        assert keys is not None and len(keys) == 3
        assert keys.tenant_of(f"Bearer {KEY_A}") == keys.tenant_of(f"bearer {KEY_A2}") == "acme"
        assert keys.tenant_of(f"Bearer {KEY_B}") == "globex"
    combined = load_keys(str(lines), "initech:another-key-for-initech-01")
    assert combined is not None and combined.tenant_of("Bearer another-key-for-initech-01") == "initech"
    assert load_keys(None, None) is None and load_keys(None, "") is None


def test_only_digests_are_kept() -> None:
    keys = ApiKeys([("acme", KEY_A)])
    assert KEY_A not in repr(vars(keys)) and KEY_A.encode() not in repr(vars(keys)).encode()


def test_who_is_refused_and_what_they_are_told() -> None:
    keys = ApiKeys([("acme", KEY_A)])
    assert "send `authorization: Bearer <key>`" in unauthenticated(keys, None)
    assert "must be `Bearer <key>`" in unauthenticated(keys, f"Basic {KEY_A}")
    assert "must be `Bearer <key>`" in unauthenticated(keys, "Bearer ")
    message = unauthenticated(keys, f"Bearer {KEY_A}x")
    assert message == "the API key is not valid"  # never echoes the key


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"acme {KEY_A}", "expected `tenant:key`"),
        ("acme:short", "at least 16 characters"),
        (f"a/b:{KEY_A}", "tenant 'a/b'"),
        (f"acme:{KEY_A}\nglobex:{KEY_A}", "one key is given to two tenants"),
    ],
)
def test_malformed_key_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "keys.txt"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_keys(str(path), None)


def test_malformed_toml_and_missing_files(tmp_path: Path) -> None:
    table = tmp_path / "keys.toml"
    table.write_text('[tenant]\nacme = "x"\n')
    with pytest.raises(ConfigError, match=r"expected only a \[tenants\] table"):
        load_keys(str(table), None)
    table.write_text("[tenants]\nacme = 3\n")
    with pytest.raises(ConfigError, match=r"tenants\.acme: expected a key or a list of keys"):
        load_keys(str(table), None)
    with pytest.raises(ConfigError, match=r"api_keys_file: .*No such file"):
        load_keys(str(tmp_path / "missing.txt"), None)

"""Server settings: flags > environment > TOML file > defaults, with errors that say where."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from contextshift.api import config
from contextshift.api.service.blocks import typed_field
from contextshift.api.service.ids import uuid7


def test_defaults_cover_every_field() -> None:
    settings = config.load({}, env={})
    fields = {f.name for f in dataclasses.fields(settings)}
    assert fields == {s.name for s in config.SETTINGS} | set(config.FILE_ONLY)
    assert (settings.host, settings.port, settings.workers) == ("127.0.0.1", 50051, 1)


def test_precedence(tmp_path: Path) -> None:
    toml = tmp_path / "contextshift.toml"
    toml.write_text('port = 7000\nworkers = 3\nhost = "0.0.0.0"\nbench_echo = true\n')
    env = {"CONTEXTSHIFT_PORT": "8000", "CONTEXTSHIFT_CONFIG": str(toml), "LLM_CONTEXT_SIZE": "32000"}
    settings = config.load({"port": "9000"}, env=env)
    assert settings.port == 9000  # flag over env over file
    assert settings.workers == 3 and settings.host == "0.0.0.0" and settings.bench_echo  # file
    assert settings.context_size == 32000  # docs/design.md's env name
    assert config.load({}, env=env).port == 8000


@pytest.mark.parametrize(
    ("flags", "env", "toml", "message"),
    [
        ({"workers": "0"}, {}, "", "--workers: must be >= 1"),
        ({}, {"CONTEXTSHIFT_PORT": "http"}, "", "$CONTEXTSHIFT_PORT: expected int"),
        ({}, {}, "workers = 2.5\n", "workers: expected int"),
        ({}, {}, "colour = 1\n", "unknown settings colour"),
        ({}, {}, "port = \n", "contextshift.toml"),
        ({}, {"CONTEXTSHIFT_BENCH_ECHO": "maybe"}, "", "expected bool"),
    ],
)
def test_errors_name_the_source(
    tmp_path: Path, flags: dict[str, str], env: dict[str, str], toml: str, message: str
) -> None:
    path = tmp_path / "contextshift.toml"
    path.write_text(toml)
    with pytest.raises(config.ConfigError, match=message.replace("$", r"\$")):
        config.load(flags, env=env, config_file=path)


def test_typed_field_paths() -> None:
    assert typed_field("blocks[2].content[1].tool_use_id") == "blocks[2].parts[1].tool_result.tool_call_id"
    assert typed_field("blocks[2].content[0].image_url.detail") == "blocks[2].parts[0].image.detail"
    assert typed_field("blocks[2].content[3].type") == "blocks[2].parts[3].type"
    assert typed_field("blocks[0].role") == "blocks[0].role"
    assert typed_field("items[4].role", ".block") == "items[4].block.role"
    assert typed_field("items[4]", ".block") == "items[4].block"
    assert typed_field("blocks_json") == "blocks_json"


def test_uuid7_is_version_7_and_time_ordered() -> None:
    import time
    import uuid

    first = uuid7()
    time.sleep(0.002)
    second = uuid7()
    assert uuid.UUID(first).version == 7 and uuid.UUID(first).variant == uuid.RFC_4122
    assert first < second

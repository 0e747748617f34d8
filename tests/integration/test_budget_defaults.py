"""The library, the CLI and the server resolve a window the same way (docs/design.md §5): what
the request gives, then the environment (LLM_CONTEXT_SIZE, LLM_MAX_OUTPUT_TOKENS), the model
registry, 128000 / 64000, a reserve found after the context limit at most a quarter of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import contextshift
from contextshift.budget import Budget, environment_window, resolve_window

from .conftest import serving

BLOCKS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]

# (model, context_limit, response_reserve, environment) -> the budget, and no floor warning.
CASES = [
    ("", 8000, None, {}, 6000),  # the README's grpcurl call: 8000 - 8000 // 4
    ("", None, None, {}, 64_000),  # 128000 - 64000
    ("", 8000, 1000, {}, 7000),  # the request's reserve as given
    ("gpt-4o", 8000, None, {}, 6000),  # the registry's 16384 is for gpt-4o's 128000, not 8000
    ("gpt-4o", None, None, {}, 128_000 - 16_384),  # the registry's window and reserve together
    ("", None, None, {"LLM_CONTEXT_SIZE": "20000"}, 15_000),  # the built-in 64000, capped at 5000
    ("", None, None, {"LLM_CONTEXT_SIZE": "20000", "LLM_MAX_OUTPUT_TOKENS": "2000"}, 18_000),
    ("", 9000, None, {"LLM_MAX_OUTPUT_TOKENS": "4000"}, 6750),  # the environment's, capped at 2250
]


def library(model: str, limit: int | None, reserve: int | None) -> contextshift.ShiftResult:
    return contextshift.shift_context(BLOCKS, budget=Budget(limit, reserve), model=model or None)


def cli(model: str, limit: int | None, reserve: int | None, env: dict[str, str], server: str = "") -> int:
    flags = [*(["--model", model] if model else []), *(["--context-limit", str(limit)] if limit else [])]
    flags += ["--response-reserve", str(reserve)] if reserve is not None else []
    flags += ["--server", server] if server else []
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LLM_")}
    done = subprocess.run(
        [sys.executable, "-m", "contextshift", "preview", "-", "--json", *flags],
        input=json.dumps(BLOCKS),
        capture_output=True,
        text=True,
        timeout=60,
        env=clean | env,
        check=True,
    )
    out = json.loads(done.stdout)
    assert not [w for w in out["warnings"] if "floor" in w], out["warnings"]
    return int(out["budget"])


@pytest.mark.parametrize(("model", "limit", "reserve", "env", "budget"), CASES)
def test_library_cli_and_server_give_the_same_budget(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    limit: int | None,
    reserve: int | None,
    env: dict[str, str],
    budget: int,
) -> None:
    for name in ("LLM_CONTEXT_SIZE", "LLM_MAX_OUTPUT_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = library(model, limit, reserve)
    assert (result.budget, result.warnings) == (budget, [])
    assert cli(model, limit, reserve, env) == budget
    with serving(tmp_path, env=env) as running:
        assert cli(model, limit, reserve, {}, server=running.address) == budget
        with contextshift.Client(running.address) as client:
            remote = client.preview_context(BLOCKS, budget=Budget(limit, reserve), model=model)
        assert remote.budget == budget and not [w for w in remote.warnings if "floor" in w]


def test_a_figure_given_is_never_capped() -> None:
    assert resolve_window(Budget(8000, 7000)).response_reserve == 7000
    # Limit and reserve from the same source (a stored configuration, the registry) stand together.
    assert resolve_window(Budget(), Budget(10_000, 9_000)).response_reserve == 9_000


def test_a_malformed_environment_names_the_variable() -> None:
    with pytest.raises(contextshift.InvalidOptions) as caught:
        environment_window({"LLM_CONTEXT_SIZE": "lots", "LLM_MAX_OUTPUT_TOKENS": "-1"})
    assert [v.field for v in caught.value.violations] == ["LLM_CONTEXT_SIZE", "LLM_MAX_OUTPUT_TOKENS"]

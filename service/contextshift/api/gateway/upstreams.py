"""Upstreams: the providers the gateway forwards to, from the settings only. A request never names
where it goes (no open proxy): it names a model, and the endpoint it calls says the format.

Three sources, read once at start:
- `upstream_openai` / `upstream_anthropic` (flag, env CONTEXTSHIFT_UPSTREAM_OPENAI /
  CONTEXTSHIFT_UPSTREAM_ANTHROPIC, or the config file's key): a base URL as the provider's SDK takes
  it (OpenAI's ends in `/v1`, Anthropic's has no `/v1`), for every model of that format;
- `[[upstreams]]` tables in the config file, for more:

      [[upstreams]]
      name = "local-vllm"                  # required: unique; the audit's provider
      base_url = "http://127.0.0.1:8000/v1"
      format = "openai"                    # or "anthropic"
      model_prefixes = ["llama-", "qwen"]  # default: every model
      connect_timeout_seconds = 10         # default: upstream_connect_timeout_seconds
      read_timeout_seconds = 600           # default: upstream_read_timeout_seconds
      api_key_env = "VLLM_KEY"             # the NAME of an env var holding a key of the server's own
      strategy = "summarize"               # the default strategy of its requests (default truncate)

A request goes to the upstream of its endpoint's format whose longest model prefix begins its model
(one without prefixes takes any model); ties go to the one listed first, the setting's before the
tables'. A key from `api_key_env` replaces the caller's `authorization` / `x-api-key`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from contextshift.api.config_tables import table_problem
from contextshift.options import Secret

Format = Literal["openai", "anthropic"]
FORMATS: tuple[Format, ...] = ("openai", "anthropic")
# The setting that names each format's upstream, for errors that say what to set.
SETTING = {"openai": "upstream_openai", "anthropic": "upstream_anthropic"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_KEYS = {
    "name",
    "base_url",
    "format",
    "model_prefixes",
    "connect_timeout_seconds",
    "read_timeout_seconds",
    "api_key_env",
    "strategy",
}


class UpstreamConfigError(ValueError):
    """A bad upstream setting or table; the message names it."""


@dataclass(frozen=True)
class Upstream:
    """One provider endpoint. `key` is the server's own key (a Secret: no repr shows it), read
    from `api_key_env` at start; None: the caller's key goes upstream."""

    name: str
    base_url: str
    format: Format
    model_prefixes: tuple[str, ...] = ()
    connect_timeout_seconds: float | None = None  # None: the server's setting
    read_timeout_seconds: float | None = None
    api_key_env: str | None = None
    strategy: str = ""
    key: Secret | None = field(default=None, compare=False)

    def url(self, path: str) -> str:
        """The upstream URL of a gateway path (`/v1/chat/completions`): OpenAI's base URL ends in
        `/v1`, Anthropic's does not."""
        base = self.base_url.rstrip("/")
        return base + (path.removeprefix("/v1") if self.format == "openai" else path)

    def match(self, model: str) -> int | None:
        """How well this upstream matches `model`: its longest prefix that begins it (0 for an
        upstream without prefixes), None when none does."""
        if not self.model_prefixes:
            return 0
        lengths = [len(p) for p in self.model_prefixes if model.startswith(p)]
        return max(lengths) if lengths else None


def _url_problem(url: str) -> str | None:
    from contextshift.summarizer.llm import url_problem

    return url_problem(url)


def _number(table: Mapping[str, Any], key: str, where: str) -> float | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise UpstreamConfigError(f"{where}.{key}: expected a number of seconds > 0, got {value!r}")
    return float(value)


def _table(table: Any, where: str) -> Upstream:
    problem = table_problem(table, _KEYS)
    if problem:
        raise UpstreamConfigError(f"{where}: {problem}")
    name, base_url, kind = table.get("name"), table.get("base_url"), table.get("format")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UpstreamConfigError(f"{where}.name: required, 1-64 letters, digits, '.', '_' or '-'")
    if not isinstance(base_url, str):
        raise UpstreamConfigError(f"{where}.base_url: required, a URL")
    problem = _url_problem(base_url)
    if problem:
        raise UpstreamConfigError(f"{where}.base_url: {problem}")
    if kind not in FORMATS:
        raise UpstreamConfigError(f'{where}.format: "openai" or "anthropic", got {kind!r}')
    prefixes = table.get("model_prefixes", [])
    if not isinstance(prefixes, list) or not all(isinstance(p, str) and p for p in prefixes):
        raise UpstreamConfigError(f"{where}.model_prefixes: expected a list of non-empty strings")
    key_env = table.get("api_key_env")
    if key_env is not None and (not isinstance(key_env, str) or not _ENV_NAME.fullmatch(key_env)):
        raise UpstreamConfigError(f"{where}.api_key_env: the name of an environment variable")
    strategy = table.get("strategy", "")
    if not isinstance(strategy, str):
        raise UpstreamConfigError(f"{where}.strategy: expected a strategy's name")
    return Upstream(
        name=name,
        base_url=base_url,
        format=kind,
        model_prefixes=tuple(prefixes),
        connect_timeout_seconds=_number(table, "connect_timeout_seconds", where),
        read_timeout_seconds=_number(table, "read_timeout_seconds", where),
        api_key_env=key_env,
        strategy=strategy,
    )


def read(settings: Mapping[str, str | None], tables: Any) -> tuple[Upstream, ...]:
    """The upstreams of the `upstream_openai` / `upstream_anthropic` settings and the config
    file's `[[upstreams]]` tables (`tables`: what the file holds under `upstreams`, [] when none),
    checked; their keys are read later (`with_keys`). UpstreamConfigError names what is wrong."""
    found: list[Upstream] = []
    for kind in FORMATS:
        url = settings.get(SETTING[kind])
        if url:
            problem = _url_problem(url)
            if problem:
                raise UpstreamConfigError(f"{SETTING[kind]}: {problem}")
            found.append(Upstream(name=kind, base_url=url, format=kind))
    if not isinstance(tables, list):
        raise UpstreamConfigError("upstreams: expected [[upstreams]] tables")
    for i, table in enumerate(tables):
        upstream = _table(table, f"upstreams[{i}]")
        if any(u.name == upstream.name for u in found):
            raise UpstreamConfigError(f"upstreams[{i}].name: {upstream.name!r} is taken")
        found.append(upstream)
    return tuple(found)


def with_keys(upstreams: Sequence[Upstream], env: Mapping[str, str] | None = None) -> tuple[Upstream, ...]:
    """`upstreams` with the keys their `api_key_env` names read from the environment;
    UpstreamConfigError for a variable that is not set (its name, never a value)."""
    env = os.environ if env is None else env
    keyed = []
    for upstream in upstreams:
        if upstream.api_key_env is None:
            keyed.append(upstream)
            continue
        value = env.get(upstream.api_key_env, "").strip()
        if not value:
            raise UpstreamConfigError(
                f"upstream {upstream.name!r}: api_key_env names ${upstream.api_key_env}, which is not set"
            )
        keyed.append(Upstream(**{**upstream.__dict__, "key": Secret(value)}))
    return tuple(keyed)


class NoUpstream(Exception):
    """No upstream of a format takes a model: the message says what to set. `configured`: whether
    the format has upstreams at all (then none takes the model)."""

    def __init__(self, message: str, *, configured: bool) -> None:
        super().__init__(message)
        self.configured = configured


def choose(upstreams: Sequence[Upstream], kind: Format, model: str) -> Upstream:
    """Where a request of format `kind` for `model` goes (see the module's doc)."""
    best: Upstream | None = None
    best_score = -1
    for upstream in upstreams:
        if upstream.format != kind:
            continue
        score = upstream.match(model)
        if score is not None and score > best_score:
            best, best_score = upstream, score
    if best is None:
        mine = [u for u in upstreams if u.format == kind]
        if mine:
            raise NoUpstream(
                f"no {kind} upstream of this gateway takes model {model!r} (their model_prefixes: "
                + "; ".join(f"{u.name}: {', '.join(u.model_prefixes)}" for u in mine)
                + ")",
                configured=True,
            )
        raise NoUpstream(
            f"this gateway has no {kind} upstream: start it with --{SETTING[kind].replace('_', '-')} URL "
            f"(env CONTEXTSHIFT_{SETTING[kind].upper()}), or add an [[upstreams]] table with "
            f'format = "{kind}" to its config file',
            configured=False,
        )
    return best

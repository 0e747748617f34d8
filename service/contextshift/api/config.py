"""Server settings: command-line flags, then environment variables, then an optional TOML file,
then defaults (first match wins). One table defines each setting once; the CLI builds its flags
from it and docs/configuration.md documents it."""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contextshift import audit
from contextshift.api.config_tables import table_problem
from contextshift.api.gateway import upstreams as gateway_upstreams
from contextshift.api.gateway.upstreams import Upstream
from contextshift.summarizer.llm import url_problem

CONFIG_ENV = "CONTEXTSHIFT_CONFIG"
# Keys of the config file that are no flag and no variable: the gateway's [[upstreams]] tables.
FILE_ONLY = ("upstreams",)


@dataclass(frozen=True)
class Setting:
    name: str  # the TOML key and the ServerConfig field; the flag is --name-with-dashes
    kind: type[Any]
    default: Any
    env: str
    help: str
    minimum: float | None = None
    # What the default is, where it is computed when the settings are read (default None).
    computed_default: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def default_text(self) -> str:
        """The default as `serve --help` and docs/configuration.md show it."""
        if self.computed_default:
            return self.computed_default
        if self.default is None:
            return "none"
        if self.kind is bool:
            return "on" if self.default else "off"
        return str(self.default)


SETTINGS = [
    Setting("host", str, "127.0.0.1", "CONTEXTSHIFT_HOST", "address to listen on"),
    Setting("port", int, 50051, "CONTEXTSHIFT_PORT", "port to listen on (0: any free port)", 0),
    Setting(
        "http_port",
        int,
        8080,
        "CONTEXTSHIFT_HTTP_PORT",
        "port of the HTTP/JSON API, the preview page and /metrics (0: any free port, logged)",
        0,
    ),
    Setting(
        "workers",
        int,
        1,
        "CONTEXTSHIFT_WORKERS",
        "server processes sharing the ports with SO_REUSEPORT (one process: SO_REUSEPORT off, so a taken port fails loudly)",
        1,
    ),
    Setting(
        "worker_port_base",
        int,
        None,
        "CONTEXTSHIFT_WORKER_PORT_BASE",
        "worker i (from 0) also serves gRPC on its own port, worker_port_base + i, for a balancer "
        "that keeps each chat on one worker (deploy/haproxy); none: no own ports",
        1,
    ),
    Setting(
        "worker_http_port_base",
        int,
        None,
        "CONTEXTSHIFT_WORKER_HTTP_PORT_BASE",
        "worker i also serves HTTP (and /readyz, the balancer's health check) on worker_http_port_base + i",
        1,
    ),
    Setting(
        "shared_ports",
        bool,
        True,
        "CONTEXTSHIFT_SHARED_PORTS",
        "serve on port and http_port, shared by the workers (off: each worker on its own ports only, "
        "which needs worker_port_base and worker_http_port_base)",
    ),
    Setting(
        "workers_file",
        str,
        None,
        "CONTEXTSHIFT_WORKERS_FILE",
        "a JSON file written once the workers are started: host, the shared ports, and each worker's "
        "index, pid and own ports, to make a balancer's configuration from; rewritten when a worker "
        "exits, removed when the server stops",
    ),
    Setting(
        "max_concurrent_rpcs",
        int,
        256,
        "CONTEXTSHIFT_MAX_CONCURRENT_RPCS",
        "calls in flight per process, on each surface; more get RESOURCE_EXHAUSTED (HTTP 429)",
        1,
    ),
    Setting(
        "max_request_bytes",
        int,
        16 * 1024 * 1024,
        "CONTEXTSHIFT_MAX_REQUEST_BYTES",
        "largest request message or HTTP body; larger get RESOURCE_EXHAUSTED (HTTP 413)",
        1024,
    ),
    Setting(
        "http_header_timeout_seconds",
        float,
        5.0,
        "CONTEXTSHIFT_HTTP_HEADER_TIMEOUT_SECONDS",
        "an HTTP connection whose request headers have not all arrived this long after it opened "
        "(or after its last answer) is closed, with a 408 when a request had begun",
        0.001,
    ),
    Setting(
        "engine_threads", int, 4, "CONTEXTSHIFT_ENGINE_THREADS", "threads per process running the engine", 1
    ),
    Setting(
        "inline_request_bytes",
        int,
        256 * 1024,  # the thread hop costs more than the shift below this (benchmarks/grpc_bench.py)
        "CONTEXTSHIFT_INLINE_REQUEST_BYTES",
        "shift and count requests up to this size that need nothing stored run on the event loop "
        "once their profile is loaded, where the thread hop would cost more than their engine work "
        "(0: every call on the engine threads)",
        0,
    ),
    Setting(
        "drain_seconds",
        float,
        1.0,
        "CONTEXTSHIFT_DRAIN_SECONDS",
        "on SIGTERM: time between health NOT_SERVING (and /readyz 503) and refusing new calls",
        0,
    ),
    Setting(
        "grace_seconds",
        float,
        10.0,
        "CONTEXTSHIFT_GRACE_SECONDS",
        "on SIGTERM: time in-flight calls get to finish before they are cancelled",
        0,
    ),
    Setting("log_level", str, "INFO", "CONTEXTSHIFT_LOG_LEVEL", "DEBUG, INFO, WARNING or ERROR"),
    Setting(
        "context_size",
        int,
        None,
        "LLM_CONTEXT_SIZE",
        "context window when a request gives none (before the model registry; default 128000)",
        1,
    ),
    Setting(
        "max_output_tokens",
        int,
        None,
        "LLM_MAX_OUTPUT_TOKENS",
        "response reserve when a request gives none (before the model registry; default 64000)",
        0,
    ),
    Setting(
        "tls_cert",
        str,
        None,
        "CONTEXTSHIFT_TLS_CERT",
        "PEM certificate (chain) file: serve gRPC and HTTP over TLS only (with tls_key)",
    ),
    Setting("tls_key", str, None, "CONTEXTSHIFT_TLS_KEY", "PEM private key file of tls_cert"),
    Setting(
        "tls_client_ca",
        str,
        None,
        "CONTEXTSHIFT_TLS_CLIENT_CA",
        "PEM file of the CAs that sign client certificates: every client must present one (mutual TLS)",
    ),
    Setting(
        "api_keys_file",
        str,
        None,
        "CONTEXTSHIFT_API_KEYS_FILE",
        "file of API keys, each owned by a tenant: lines `tenant:key`, or TOML `[tenants]` with "
        '`name = "key"` or a list of keys; with keys, every call but health needs one',
    ),
    Setting(
        "api_keys",
        str,
        None,
        "CONTEXTSHIFT_API_KEYS",
        "API keys as `tenant:key,tenant:key` (added to api_keys_file's)",
    ),
    Setting(
        "store",
        str,
        None,
        "CONTEXTSHIFT_STORE",
        "the store of audits, generations, calibrations, chat history and model configurations: "
        "a SQLite file, as its path or sqlite:///<path> (one machine; ?synchronous=full for "
        "durability against power loss), or postgresql://user:password@host:port/database (replicas)",
        computed_default="$XDG_DATA_HOME/contextshift/contextshift.db (XDG_DATA_HOME: ~/.local/share)",
    ),
    Setting(
        "store_timeout_ms",
        int,
        2000,
        "CONTEXTSHIFT_STORE_TIMEOUT_MS",
        "the longest a store call may take (or the call's own deadline, when sooner): past it the "
        "call answers UNAVAILABLE (HTTP 503, with a retry delay) and the connection it waited on is "
        "dropped; while the store does not answer within it, /readyz answers 503 and gRPC health "
        "NOT_SERVING",
        1,
    ),
    Setting(
        "audit_messages",
        bool,
        True,
        "CONTEXTSHIFT_AUDIT_MESSAGES",
        "store the final provider messages in audits (off: ids, tokens and reasons only, no text)",
    ),
    Setting(
        "model_config_file",
        str,
        None,
        "CONTEXTSHIFT_MODEL_CONFIG_FILE",
        "TOML file of model configurations loaded into the store at start (server-wide defaults)",
    ),
    Setting(
        "store_cache_seconds",
        float,
        2.0,
        "CONTEXTSHIFT_STORE_CACHE_SECONDS",
        "how long a process keeps the model configurations and calibrations it read, so requests "
        "naming a model run on the event loop; another worker's or replica's changes show after it "
        "(0: read the store every time)",
        0,
    ),
    Setting(
        "generation_retention_hours",
        int,
        24,
        "CONTEXTSHIFT_GENERATION_RETENTION_HOURS",
        "how long FinishGeneration can find a generation that is no chat's current audit",
        1,
    ),
    Setting(
        "max_store_bytes",
        int,
        None,
        "CONTEXTSHIFT_MAX_STORE_BYTES",
        "the most data the store may hold (SQLite: its pages in use; PostgreSQL: its audits' and "
        "history blocks' bytes): past it, new audits and appended blocks are refused with "
        "RESOURCE_EXHAUSTED (HTTP 507) until chats are deleted (none: no limit)",
        1,
    ),
    Setting(
        "store_reserve_bytes",
        int,
        64 * 1024 * 1024,
        "CONTEXTSHIFT_STORE_RESERVE_BYTES",
        "SQLite: disk space kept free under the store for deletions, reports and the journal: new "
        "audits and appended blocks are refused when they would leave less free (0: none kept)",
        0,
    ),
    Setting(
        "chat_retention_days",
        float,
        None,
        "CONTEXTSHIFT_CHAT_RETENTION_DAYS",
        "chats neither shifted nor appended to for this long are deleted in the background, each "
        "as DeleteChat deletes it (none: kept until deleted)",
        0.00001,
    ),
    Setting(
        "bench_echo", bool, False, "CONTEXTSHIFT_BENCH_ECHO", "also serve the benchmark-only EchoService"
    ),
    # LLM compaction (strategy llm-compact): an OpenAI-compatible Chat Completions endpoint.
    Setting(
        "compact_url",
        str,
        None,
        "CONTEXTSHIFT_COMPACT_URL",
        "base URL of the OpenAI-compatible API llm-compact calls, e.g. https://api.openai.com/v1 "
        "(none: llm-compact shifts as truncate, with a warning)",
    ),
    Setting("compact_model", str, None, "CONTEXTSHIFT_COMPACT_MODEL", "llm-compact's main model"),
    Setting(
        "compact_fast_model",
        str,
        None,
        "CONTEXTSHIFT_COMPACT_FAST_MODEL",
        "llm-compact's fast model, which a request picks with compact_model fast",
    ),
    Setting(
        "compact_api_key",
        str,
        None,
        "CONTEXTSHIFT_COMPACT_API_KEY",
        "the endpoint's API key (sent as a bearer token; never logged; prefer the environment to a flag)",
    ),
    Setting(
        "compact_timeout_ms",
        int,
        30_000,
        "CONTEXTSHIFT_COMPACT_TIMEOUT_MS",
        "time limit of one compaction call; past it the shift falls back to truncate",
        1,
    ),
    # The gateway (api/gateway): provider-compatible endpoints on the HTTP port.
    Setting(
        "upstream_openai",
        str,
        None,
        "CONTEXTSHIFT_UPSTREAM_OPENAI",
        "the gateway's OpenAI-compatible upstream, its base URL as the OpenAI SDK takes it (ending in "
        "/v1), for /v1/chat/completions, /v1/responses and /v1/models (more: [[upstreams]] in the config file)",
    ),
    Setting(
        "upstream_anthropic",
        str,
        None,
        "CONTEXTSHIFT_UPSTREAM_ANTHROPIC",
        "the gateway's Anthropic upstream, its base URL as the Anthropic SDK takes it (no /v1), for "
        "/v1/messages",
    ),
    Setting(
        "upstream_max_concurrent",
        int,
        256,
        "CONTEXTSHIFT_UPSTREAM_MAX_CONCURRENT",
        "gateway calls to upstreams in flight per process, answers streaming included; more get 429 "
        "with Retry-After",
        1,
    ),
    Setting(
        "upstream_connect_timeout_seconds",
        float,
        10.0,
        "CONTEXTSHIFT_UPSTREAM_CONNECT_TIMEOUT_SECONDS",
        "the gateway's time limit to connect to an upstream (past it: 504)",
        0.001,
    ),
    Setting(
        "upstream_read_timeout_seconds",
        float,
        600.0,
        "CONTEXTSHIFT_UPSTREAM_READ_TIMEOUT_SECONDS",
        "the gateway's longest wait for an upstream's next bytes, its answer's first included (past "
        "it: 504, or a stream ended)",
        0.001,
    ),
    Setting(
        "io_threads",
        int,
        16,
        "CONTEXTSHIFT_IO_THREADS",
        "threads per process for shifts whose strategy waits on I/O or plugins (llm-compact, plugin "
        "strategies), so they never hold the engine threads",
        1,
    ),
]


@dataclass(frozen=True)
class ServerConfig:
    """Resolved settings (see SETTINGS for meaning and defaults)."""

    host: str
    port: int
    http_port: int
    workers: int
    worker_port_base: int | None
    worker_http_port_base: int | None
    shared_ports: bool
    workers_file: str | None
    max_concurrent_rpcs: int
    max_request_bytes: int
    http_header_timeout_seconds: float
    engine_threads: int
    inline_request_bytes: int
    drain_seconds: float
    grace_seconds: float
    log_level: str
    context_size: int | None
    max_output_tokens: int | None
    tls_cert: str | None
    tls_key: str | None
    tls_client_ca: str | None
    api_keys_file: str | None
    api_keys: str | None
    store: str
    store_timeout_ms: int
    audit_messages: bool
    model_config_file: str | None
    store_cache_seconds: float
    generation_retention_hours: int
    max_store_bytes: int | None
    store_reserve_bytes: int
    chat_retention_days: float | None
    bench_echo: bool
    compact_url: str | None
    compact_model: str | None
    compact_fast_model: str | None
    compact_api_key: str | None = field(repr=False)
    compact_timeout_ms: int
    io_threads: int
    upstream_openai: str | None
    upstream_anthropic: str | None
    upstream_max_concurrent: int
    upstream_connect_timeout_seconds: float
    upstream_read_timeout_seconds: float
    # The gateway's upstreams: the two settings above and the config file's [[upstreams]] tables.
    upstreams: tuple[Upstream, ...] = ()


class ConfigError(ValueError):
    """A setting has a value of the wrong type or range; the message names where it came from."""


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; unset flags stay None so the environment and file can apply."""
    parser.add_argument(
        "--config", type=Path, help=f"TOML file with settings (default: none; env {CONFIG_ENV})"
    )
    for s in SETTINGS:
        if s.kind is bool:
            parser.add_argument(
                s.flag, action=argparse.BooleanOptionalAction, default=None, help=_flag_help(s)
            )
        else:
            parser.add_argument(s.flag, default=None, help=_flag_help(s))


def _flag_help(setting: Setting) -> str:
    # argparse expands % in help texts.
    return f"{setting.help} (default {setting.default_text}; env {setting.env})".replace("%", "%%")


def _convert(setting: Setting, value: Any, source: str) -> Any:
    try:
        if setting.kind is bool:
            if isinstance(value, str):
                if value.lower() not in {"1", "true", "yes", "0", "false", "no"}:
                    raise ValueError(value)
                value = value.lower() in {"1", "true", "yes"}
            elif not isinstance(value, bool):
                raise ValueError(value)
            return value
        if setting.kind is int and isinstance(value, bool | float):
            raise ValueError(value)
        converted = setting.kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: expected {setting.kind.__name__}, got {value!r}") from None
    if setting.minimum is not None and converted < setting.minimum:
        raise ConfigError(f"{source}: must be >= {setting.minimum:g}, got {converted!r}")
    return converted


def load(
    flags: Mapping[str, Any], env: Mapping[str, str] | None = None, config_file: Path | None = None
) -> ServerConfig:
    """Resolve every setting: flags > environment > TOML file > default."""
    env = os.environ if env is None else env
    path = config_file or (Path(env[CONFIG_ENV]) if env.get(CONFIG_ENV) else None)
    file_values: dict[str, Any] = {}
    if path is not None:
        try:
            file_values = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"{path}: {e}") from None
        problem = table_problem(file_values, {s.name for s in SETTINGS} | set(FILE_ONLY), "settings")
        if problem:
            raise ConfigError(f"{path}: {problem}")
    values: dict[str, Any] = {}
    for s in SETTINGS:
        if flags.get(s.name) is not None:
            values[s.name] = _convert(s, flags[s.name], s.flag)
        elif env.get(s.env):
            values[s.name] = _convert(s, env[s.env], f"${s.env}")
        elif s.name in file_values:
            values[s.name] = _convert(s, file_values[s.name], f"{path}: {s.name}")
        else:
            values[s.name] = s.default
    if values["store"] is None:
        values["store"] = audit.default_url(env)
    _check_compaction(values)
    try:
        values["upstreams"] = gateway_upstreams.read(values, file_values.get("upstreams", []))
    except gateway_upstreams.UpstreamConfigError as e:
        raise ConfigError(f"{path}: {e}" if path and "upstreams[" in str(e) else str(e)) from None
    settings = ServerConfig(**values)
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise ConfigError("tls_cert and tls_key: set both or neither")
    if settings.tls_client_ca is not None and settings.tls_cert is None:
        raise ConfigError("tls_client_ca: mutual TLS needs tls_cert and tls_key too")
    _check_ports(settings)
    return settings


def _check_compaction(values: Mapping[str, Any]) -> None:
    if values["compact_url"] is None:
        return
    problem = url_problem(values["compact_url"])
    if problem is not None:
        raise ConfigError(f"compact_url: {problem}")
    if not values["compact_model"]:
        raise ConfigError("compact_model: required with compact_url")


def _check_ports(settings: ServerConfig) -> None:
    """The ports the workers listen on: some for each surface, each a port, no two the same."""
    if not settings.shared_ports and None in (settings.worker_port_base, settings.worker_http_port_base):
        raise ConfigError(
            "shared_ports off: set worker_port_base and worker_http_port_base (each worker's own ports)"
        )
    ports: list[tuple[str, int]] = []
    if settings.shared_ports:
        ports += [("port", settings.port), ("http_port", settings.http_port)]
    for name in ("worker_port_base", "worker_http_port_base"):
        base = getattr(settings, name)
        if base is None:
            continue
        if base + settings.workers - 1 > 65535:
            raise ConfigError(f"{name}: {base} + {settings.workers - 1} (the last worker's) is past 65535")
        ports += [(f"{name} + {i}" if i else name, base + i) for i in range(settings.workers)]
    taken: dict[int, str] = {}
    for name, port in ports:
        if port in taken and port != 0:  # 0: any free port, a different one each
            raise ConfigError(f"{taken[port]} and {name} are both port {port}")
        taken[port] = name

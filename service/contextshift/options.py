"""Per-request shift options, validated with errors that name the option.

Every strategy takes the common options (`COMMON`); a strategy adds its own (`OptionSpec`s it
declares in the registry). An option the chosen strategy does not take is unknown.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contextshift.errors import InvalidOptions
from contextshift.presets import PRESETS

MIN_BLOCK_CHARS = 64  # room for the "[Truncated]" suffix and some text; the core agrees


class Secret:
    """A secret option's value (an API key): kept for the call that needs it, never shown by
    `repr`/`str`, so it cannot reach a log line, a diagnostic or an error message by accident."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "Secret('***')" if self.value else "Secret('')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)


# What each kind accepts; the names are what ListStrategies reports as an option's type.
def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": ("a finite number", _finite),
    "bool": ("a boolean", lambda v: isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "secret": ("a string", lambda v: isinstance(v, str)),
    "list[str]": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
    "list[float]": ("a list of finite numbers", lambda v: isinstance(v, list) and all(map(_finite, v))),
}


@dataclass(frozen=True)
class OptionSpec:
    """One option: its name, type (a key of `_KINDS`), default, meaning, and bounds for numbers
    (`minimum` inclusive; `maximum` inclusive; `above` exclusive lower bound; `off`, a value
    accepted outside the bounds that turns the option off). `choices` lists a string option's
    values. A `library_only` option is refused over gRPC (it names something a request must not
    choose, such as a URL the server would fetch); a `secret` one is held as a `Secret`."""

    name: str
    kind: str
    default: Any
    description: str
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    off: float | None = None
    choices: tuple[str, ...] | None = None
    library_only: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"option {self.name!r}: unknown kind {self.kind!r} (known: {', '.join(_KINDS)})")

    def problem(self, value: Any) -> str | None:
        """Why `value` is not acceptable, or None."""
        expected, accepts = _KINDS[self.kind]
        if not accepts(value):
            shown = type(value).__name__ if self.kind == "secret" else repr(value)
            return f"must be {expected}, got {shown}"
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(self.choices)}, got {value!r}"
        if isinstance(value, int | float) and value != self.off:
            if self.minimum is not None and value < self.minimum:
                return f"must be >= {self.minimum:g}, got {value!r}"
            if self.maximum is not None and value > self.maximum:
                return f"must be <= {self.maximum:g}, got {value!r}"
            if self.above is not None and value <= self.above:
                return f"must be > {self.above:g}, got {value!r}"
        return None


COMMON: tuple[OptionSpec, ...] = (
    OptionSpec(
        "max_block_chars",
        "int",
        50_000,
        "a block with more characters of text is cut, ending with [Truncated]",
        minimum=MIN_BLOCK_CHARS,
    ),
    OptionSpec(
        "tool_result_max_chars",
        "int",
        0,
        "a tool result (a block answering a tool call) with more characters of text is cut, ending "
        "with [Truncated], when this is below max_block_chars (0: off)",
        minimum=MIN_BLOCK_CHARS,
        off=0,
    ),
    OptionSpec(
        "pinned_cap",
        "float",
        0.5,
        "share of the budget pinned blocks may take; beyond it the oldest injected pins lose their pin",
        minimum=0,
        maximum=1,
    ),
    OptionSpec(
        "start_on_user",
        "bool",
        True,
        "once history is removed, a history that would begin with an assistant turn loses it",
    ),
    OptionSpec("protect_current_input", "bool", True, "the last user block is protected (never dropped)"),
    OptionSpec(
        "target_ratio",
        "float",
        1.0,
        "hysteresis: once a shift is needed, shift down to this share of the budget so the next "
        "turns keep the provider's cached prefix (default 1.0; 0.8 for a cache-stable shift: one "
        "given the chat's previous prompt, on a server one naming a chat_id)",
        maximum=1,
        above=0,
    ),
    OptionSpec(
        "cache_stable",
        "bool",
        True,
        "given the chat's previous prompt (a server: the chat's last audit), leave out again what it "
        "left out while its blocks are unchanged, so the provider's cached prefix holds",
    ),
    OptionSpec(
        "plugin_timeout_ms",
        "int",
        1000,
        "a plugin strategy or interceptor that runs longer falls back (truncate, or its input kept)",
        minimum=1,
    ),
    OptionSpec(
        "keep_reasoning_turns",
        "int",
        0,
        "once blocks must go, first leave out the reasoning of turns before the last N tool-use turns, "
        "where the provider accepts it missing (Anthropic thinking, Qwen reasoning_content; never a "
        "Responses reasoning item), before any block is dropped (0: off)",
        minimum=1,
        off=0,
    ),
    OptionSpec(
        "preset",
        "str",
        "",
        "an agent-loop preset setting several options in one word (contextshift.presets); options "
        "given beside it win",
        choices=("", *PRESETS),
    ),
)


@dataclass(frozen=True)
class ShiftOptions:
    """The common options, typed, and the chosen strategy's own (`strategy`, by name)."""

    # Every one given by `from_mapping`; the defaults live in COMMON alone.
    max_block_chars: int
    tool_result_max_chars: int
    pinned_cap: float
    start_on_user: bool
    protect_current_input: bool
    target_ratio: float
    cache_stable: bool
    plugin_timeout_ms: int
    keep_reasoning_turns: int
    preset: str
    strategy: Mapping[str, Any]
    # The preset's options the chosen strategy does not take (so not applied), with their values.
    preset_unapplied: tuple[tuple[str, Any], ...]
    # The options given, or set by the preset (the others have their defaults).
    given: frozenset[str] = frozenset()

    @classmethod
    def from_mapping(
        cls, options: Mapping[str, Any] | None, strategy_specs: Sequence[OptionSpec] = ()
    ) -> ShiftOptions:
        """Validates `options` against the common options and `strategy_specs`; every problem is
        one violation naming `options.<key>`. A known `preset` fills in the options it sets that
        were not given (those of other strategies are left out). Missing options take their
        defaults; secret ones are held as `Secret`s."""
        if options is not None and not isinstance(options, Mapping):
            raise InvalidOptions([("options", f"must be a mapping, got {type(options).__name__}")])
        given = dict(options or {})
        specs = {s.name: s for s in (*COMMON, *strategy_specs)}
        name = given.get("preset", "")
        preset = PRESETS.get(name, {}) if isinstance(name, str) else {}  # a bad one is reported below
        unapplied = tuple((k, v) for k, v in preset.items() if k not in specs and k not in given)
        given = {**{k: v for k, v in preset.items() if k in specs}, **given}
        violations: list[tuple[str, str]] = []
        for key, value in given.items():
            spec = specs.get(key)
            if spec is None:
                violations.append((f"options.{key}", f"unknown option (known: {', '.join(sorted(specs))})"))
            elif (problem := spec.problem(value)) is not None:
                violations.append((f"options.{key}", problem))
        if violations:
            raise InvalidOptions(violations)
        common = {s.name: given.get(s.name, s.default) for s in COMMON}
        own = {
            s.name: Secret(given.get(s.name, s.default))
            if s.kind == "secret"
            else given.get(s.name, s.default)
            for s in strategy_specs
        }
        return cls(**common, strategy=own, preset_unapplied=unapplied, given=frozenset(given))

    def get(self, name: str) -> Any:
        """The chosen strategy's option `name` (given, or its default)."""
        return self.strategy[name]

    def preset_warnings(self, strategy: str) -> list[str]:
        """What the caller must hear about the preset under `strategy`: the options it sets that
        this strategy does not take, so the preset does less than its name says."""
        if not self.preset_unapplied:
            return []
        shown = ", ".join(f"{k} {v!r}" for k, v in self.preset_unapplied)
        them = "them" if len(self.preset_unapplied) > 1 else "it"
        return [f"preset {self.preset}: {shown} not applied (strategy {strategy} does not take {them})"]

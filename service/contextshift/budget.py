"""Budget resolution (docs/design.md, Budget): where a window's figures come from when a request
leaves them out, and the token budget they give. The library, the CLI and the server resolve the
same way, through `resolve_window`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from contextshift.errors import InvalidOptions

FLOOR_CAP = 4000
# Token figures beyond this are certainly mistakes (and would overflow the core's u64 sums).
MAX_TOKENS = 2**53
# The built-in defaults, last in the order of `resolve_window`.
DEFAULT_CONTEXT_LIMIT = 128_000
DEFAULT_RESPONSE_RESERVE = 64_000
# A reserve found after the context limit takes at most 1 / this of it (`resolve_window`).
DEFAULT_RESERVE_SHARE = 4
CONTEXT_SIZE_ENV = "LLM_CONTEXT_SIZE"
MAX_OUTPUT_ENV = "LLM_MAX_OUTPUT_TOKENS"


@dataclass(frozen=True)
class Budget:
    """A model's window and reserves; resolved to a token budget with a floor. A figure left out
    (None) comes from the defaults (`resolve_window`)."""

    context_limit: int | None = None
    response_reserve: int | None = None
    system_reserve: int | None = None


@dataclass(frozen=True)
class Window:
    """A window with every figure resolved (`resolve_window`)."""

    context_limit: int
    response_reserve: int
    system_reserve: int

    def as_budget(self) -> Budget:
        return Budget(self.context_limit, self.response_reserve, self.system_reserve)


@dataclass(frozen=True)
class ResolvedBudget:
    tokens: int
    warnings: list[str]


def _int_field(value: object, field: str, minimum: int) -> list[tuple[str, str]]:
    if isinstance(value, bool) or not isinstance(value, int):
        return [(field, f"must be an integer, got {type(value).__name__}")]
    if not minimum <= value <= MAX_TOKENS:
        return [(field, f"must be between {minimum} and {MAX_TOKENS}, got {value}")]
    return []


def _checked(budget: Budget) -> None:
    """Every figure given is an integer in range; errors name `budget.<figure>`."""
    minimums = {"context_limit": 1, "response_reserve": 0, "system_reserve": 0}
    violations = [
        violation
        for name, minimum in minimums.items()
        if (value := getattr(budget, name)) is not None
        for violation in _int_field(value, f"budget.{name}", minimum)
    ]
    if violations:
        raise InvalidOptions(violations)


def environment_window(env: Mapping[str, str] | None = None) -> Budget:
    """The deployment's window from `LLM_CONTEXT_SIZE` and `LLM_MAX_OUTPUT_TOKENS` (unset or empty:
    left out). A value that is no integer is `InvalidOptions` naming the variable."""
    env = os.environ if env is None else env
    figures: list[int | None] = []
    violations: list[tuple[str, str]] = []
    for variable, minimum in ((CONTEXT_SIZE_ENV, 1), (MAX_OUTPUT_ENV, 0)):
        text = env.get(variable, "").strip()
        try:
            value = int(text) if text else None
        except ValueError:
            violations.append((variable, f"must be an integer, got {text!r}"))
            value = None
        if value is not None:
            violations += _int_field(value, variable, minimum)
        figures.append(value)
    if violations:
        raise InvalidOptions(violations)
    return Budget(*figures)


def resolve_window(given: Budget, *layers: Budget) -> Window:
    """A complete window: each figure from the first of `given` (the request), then `layers` in
    their order (a server: the model's stored configuration, its settings or environment, the
    model registry; the library and the CLI: the environment, the registry), then 128000 / 64000
    and a system reserve of 0. A response reserve found after the context limit (the limit from
    the request, the reserve from anywhere else; the limit from the environment, the reserve from
    the registry or the built-in default) takes at most a quarter of that limit: a reserve meant for
    another window (the registry's 16384 for gpt-4o's 128000, the built-in 64000) would leave a
    small window nothing."""
    _checked(given)
    sources = (given, *layers, Budget(DEFAULT_CONTEXT_LIMIT, DEFAULT_RESPONSE_RESERVE, 0))

    def first(name: str) -> tuple[int, int]:
        """The figure and the index of the source it came from."""
        return next((getattr(s, name), at) for at, s in enumerate(sources) if getattr(s, name) is not None)

    context_limit, limit_from = first("context_limit")
    response_reserve, reserve_from = first("response_reserve")
    if reserve_from > limit_from:
        response_reserve = min(response_reserve, context_limit // DEFAULT_RESERVE_SHARE)
    return Window(context_limit, response_reserve, first("system_reserve")[0])


def resolve_in_process(given: Budget, registry: Budget) -> Window:
    """`resolve_window` as the library and the CLI resolve: the request, the environment, the
    model registry (`registry`), the built-in defaults. A complete window reads nothing."""
    if given.context_limit is None or given.response_reserve is None or given.system_reserve is None:
        return resolve_window(given, environment_window(), registry)
    _checked(given)
    return Window(given.context_limit, given.response_reserve, given.system_reserve)


def resolve_budget(budget: int | Window) -> ResolvedBudget:
    """An int is used as is; a window is `context_limit - reserves`, floored at
    `min(4000, context_limit // 2)` so reserves never swallow the whole window."""
    if isinstance(budget, Window):
        raw = budget.context_limit - budget.response_reserve - budget.system_reserve
        floor = min(FLOOR_CAP, budget.context_limit // 2)
        if raw < floor:
            warning = f"budget floor applied: {raw} < min(4000, context_limit // 2) = {floor}; using {floor}"
            return ResolvedBudget(floor, [warning])
        return ResolvedBudget(raw, [])
    violations = _int_field(budget, "budget", 0)
    if violations:
        raise InvalidOptions(violations)
    return ResolvedBudget(budget, [])

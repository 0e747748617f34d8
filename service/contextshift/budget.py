"""Budget resolution (DESIGN.md §5)."""

from __future__ import annotations

from dataclasses import dataclass

from contextshift.errors import InvalidOptions

FLOOR_CAP = 4000
# Token figures beyond this are certainly mistakes (and would overflow the core's u64 sums).
MAX_TOKENS = 2**53


@dataclass(frozen=True)
class Budget:
    """A model's window and reserves; resolved to a token budget with a floor."""

    context_limit: int
    response_reserve: int = 0
    system_reserve: int = 0


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


def resolve_budget(budget: int | Budget) -> ResolvedBudget:
    """An int is used as is; a `Budget` is `context_limit - reserves`, floored at
    `min(4000, context_limit // 2)` so reserves never swallow the whole window."""
    if isinstance(budget, Budget):
        violations = (
            _int_field(budget.context_limit, "budget.context_limit", 1)
            + _int_field(budget.response_reserve, "budget.response_reserve", 0)
            + _int_field(budget.system_reserve, "budget.system_reserve", 0)
        )
        if violations:
            raise InvalidOptions(violations)
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

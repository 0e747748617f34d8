"""Errors of the library API. The gRPC layer maps each to a status with details."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class ContextShiftError(Exception):
    """Base of every error contextshift raises on purpose."""


@dataclass(frozen=True)
class FieldViolation:
    """One thing wrong with the input: `field` is a path such as `blocks[3].role`."""

    field: str
    description: str


class InvalidInput(ContextShiftError, ValueError):
    """The request is malformed; `violations` names every offending field."""

    def __init__(self, violations: Iterable[FieldViolation | tuple[str, str]]) -> None:
        self.violations = [v if isinstance(v, FieldViolation) else FieldViolation(*v) for v in violations]
        super().__init__("; ".join(f"{v.field}: {v.description}" for v in self.violations))


class InvalidBlocks(InvalidInput):
    """A block is malformed (wrong type, unknown role, duplicate id, ...)."""


class InvalidOptions(InvalidInput):
    """The budget, profile, strategy or an option is malformed or unknown."""


class InvalidTools(InvalidInput):
    """A tool definition is malformed (`tools[2].function.name`, `tools_json[0].input_schema`)."""


class TokenBudgetExceeded(ContextShiftError):
    """Protected blocks (with the tool definitions sent alongside) do not fit the budget: no prompt
    can be built."""

    code = "TOKEN_BUDGET_EXCEEDED"

    def __init__(self, protected_tokens: int, budget: int, tools_tokens: int = 0) -> None:
        self.protected_tokens = protected_tokens
        self.budget = budget
        self.tools_tokens = tools_tokens
        tools = f" and tool definitions {tools_tokens}" if tools_tokens else ""
        super().__init__(
            f"{self.code}: protected blocks take {protected_tokens} tokens{tools}, over the budget of {budget}"
        )


class InternalError(ContextShiftError, RuntimeError):
    """A bug inside contextshift (including a Rust panic); the request itself may be fine."""

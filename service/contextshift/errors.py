"""Errors of the library API. The service answers each with a status whose ErrorInfo reason is
the error's `code`, and `contextshift.Client` raises the same error from that reason."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar


class ErrorReason(StrEnum):
    """The ErrorInfo reasons of the service's errors (domain `contextshift.v1`): stable, so a
    caller tells errors apart by them, never by their messages."""

    # The library's errors (`code` of each class below).
    TOKEN_BUDGET_EXCEEDED = "TOKEN_BUDGET_EXCEEDED"
    INVALID_INPUT = "INVALID_INPUT"
    INVALID_BLOCKS = "INVALID_BLOCKS"
    INVALID_OPTIONS = "INVALID_OPTIONS"
    INVALID_TOOLS = "INVALID_TOOLS"
    # The store's, of a server.
    STALE_GENERATION = "STALE_GENERATION"
    GENERATION_ALREADY_FINISHED = "GENERATION_ALREADY_FINISHED"
    GENERATION_ID_IN_USE = "GENERATION_ID_IN_USE"
    MODEL_ROLE_NOT_CONFIGURED = "MODEL_ROLE_NOT_CONFIGURED"
    STORE_FULL = "STORE_FULL"


class ContextShiftError(Exception):
    """Base of every error contextshift raises on purpose."""


@dataclass(frozen=True)
class FieldViolation:
    """One thing wrong with the input: `field` is a path such as `blocks[3].role`."""

    field: str
    description: str


class InvalidInput(ContextShiftError, ValueError):
    """The request is malformed; `violations` names every offending field."""

    code: ClassVar[ErrorReason] = ErrorReason.INVALID_INPUT

    def __init__(self, violations: Iterable[FieldViolation | tuple[str, str]]) -> None:
        self.violations = [v if isinstance(v, FieldViolation) else FieldViolation(*v) for v in violations]
        super().__init__("; ".join(f"{v.field}: {v.description}" for v in self.violations))


class InvalidBlocks(InvalidInput):
    """A block is malformed (wrong type, unknown role, duplicate id, ...)."""

    code = ErrorReason.INVALID_BLOCKS


class InvalidOptions(InvalidInput):
    """The budget, profile, strategy or an option is malformed or unknown."""

    code = ErrorReason.INVALID_OPTIONS


class InvalidTools(InvalidInput):
    """A tool definition is malformed (`tools[2].function.name`, `tools_json[0].input_schema`)."""

    code = ErrorReason.INVALID_TOOLS


class TokenBudgetExceeded(ContextShiftError):
    """Protected blocks (with the tool definitions sent alongside) do not fit the budget: no prompt
    can be built."""

    code: ClassVar[ErrorReason] = ErrorReason.TOKEN_BUDGET_EXCEEDED

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

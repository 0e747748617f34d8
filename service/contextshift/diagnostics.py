"""Diagnostics: what the strategy host, plugins and interceptors did to a shift that the caller
should be able to see (a fallback to truncate, a rejected plan, a group extended, tokens an
interceptor added). They travel in `ShiftResult.diagnostics`, `ContextPlan.diagnostics` and the
audit."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Diagnostic:
    # Who: "host", "strategy:<name>", "interceptor:<name>".
    source: str
    # What happened, a stable code such as "FALLBACK_TO_TRUNCATE" or "GROUP_EXTENDED".
    event: str
    # A sentence for people; never message content.
    detail: str
    # Tokens involved, when the event has a size (tokens added, tokens cleared, ...).
    tokens: int | None = None

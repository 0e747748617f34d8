"""Diagnostics: what the strategy host, plugins and interceptors did to a shift that the caller
should be able to see (a fallback to truncate, a rejected plan, a group extended, tokens an
interceptor added), and what an LLM compaction spent. They travel in `ShiftResult.diagnostics`
(`.compaction_usage`), `ContextPlan.diagnostics` (`.compaction_usage`) and the audit."""

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


@dataclass(frozen=True, slots=True)
class CompactionUsage:
    """The tokens an LLM compaction spent, as its endpoint reported them (None: not reported)."""

    model: str
    prompt_tokens: int | None
    completion_tokens: int | None

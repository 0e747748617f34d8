"""Diagnostics: what the strategy host, plugins and interceptors did to a shift that the caller
should be able to see (a fallback to truncate, a rejected plan, a group extended, tokens an
interceptor added), and what an LLM compaction spent. They travel in `ShiftResult.diagnostics`
(`.compaction_usage`), `ContextPlan.diagnostics` (`.compaction_usage`) and the audit."""

from __future__ import annotations

from dataclasses import dataclass

# The events of a shift whose strategy failed and that fell back to truncate: llm-compact's LLM
# failed (strategies/llm_compact.py), or a plugin strategy raised, ran past its time limit, was not
# run because too many hung plugin calls still run, or returned a plan the host refused
# (plugins.py). The metrics count these as fallbacks (`is_fallback`).
FALLBACK_EVENTS = frozenset(
    {"LLM_FALLBACK", "PLUGIN_ERROR", "PLUGIN_TIMEOUT", "PLUGINS_SATURATED", "PLAN_REJECTED", "PLAN_INVALID"}
)


@dataclass(frozen=True, slots=True)
class Diagnostic:
    # Who: "host", "strategy:<name>", "interceptor:<name>".
    source: str
    # What happened, a stable code such as "LLM_FALLBACK" or "GROUP_EXTENDED".
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


def is_fallback(diagnostic: Diagnostic) -> bool:
    """Whether `diagnostic` says its shift's strategy fell back to truncate (an interceptor skipped
    for the same reason, `PLUGINS_SATURATED` from an interceptor, is no strategy's fallback)."""
    return diagnostic.event in FALLBACK_EVENTS and not diagnostic.source.startswith("interceptor:")

"""`llm-compact`: the oldest compactable history is summarized by an LLM behind an
OpenAI-compatible endpoint (contextshift.summarizer.llm), with the system prompt of the `hint`.

Compaction starts when the plain plan must leave history out for the budget, or once the prompt
passes `compact_above_tokens`. Compactable blocks are history (kind `message` or an earlier
`summary`) in unprotected, non-orphan tool-call groups; the latest `keep_recent` of them stay
verbatim, with their whole groups, and every other compactable group is summarized (with an
assistant turn the history would otherwise start with, which the leading-assistant repair would
drop unsummarized). The summary is one system block `[Conversation summary] …` (id `summary`,
kind `summary`, reason SUMMARY) where the summarized history began; the summarized blocks say
SUMMARIZED. The plan is made with the summary's tokens taken off the budget, so the summary always
fits, and truncate goes on oldest-first if the result is still over.

Any failure of the LLM (see summarizer/llm.py) falls back to truncate without failing the shift:
a diagnostic `LLM_FALLBACK` gives the cause. Without an endpoint (the server's `compact_url`
setting, or the library's `compact_base_url` option) the strategy is truncate, with a warning.
"""

from __future__ import annotations

import logging

from contextshift.diagnostics import Diagnostic
from contextshift.errors import InvalidOptions
from contextshift.options import OptionSpec, Secret
from contextshift.reasons import Reason
from contextshift.strategies.context import Outcome, StrategyContext, Summary
from contextshift.strategies.registry import StrategyInfo
from contextshift.strategies.summarize import (
    SUMMARY_MAX_TOKENS,
    reserve_plan,
    summarized_blocks,
    summary_id,
    summary_message,
    summary_size,
)
from contextshift.summarizer import extractive, llm

log = logging.getLogger("contextshift.strategies")

NAME = "llm-compact"
COMPACTABLE_KINDS = frozenset({"message", "summary"})
NO_ENDPOINT = (
    "llm-compact: no compaction endpoint configured (server setting compact_url, or the option "
    "compact_base_url in the library): shifted as truncate"
)


def divider(count: int) -> str:
    return f"Earlier context ({count} messages) was summarized by AI."


def _endpoint(ctx: StrategyContext) -> tuple[llm.Endpoint, llm.Transport] | None:
    """The endpoint the options or the server's settings name; None when there is none."""
    options = ctx.options
    url: str = options.get("compact_base_url")
    model: str = options.get("compact_model")
    key: Secret = options.get("compact_api_key")
    if url:
        problems = [("options.compact_base_url", problem)] if (problem := llm.url_problem(url)) else []
        if not model:
            problems.append(("options.compact_model", "required with compact_base_url"))
        if problems:
            raise InvalidOptions(problems)
        return llm.Endpoint(url, model, key, options.get("compact_timeout_ms")), llm.BLOCKING
    if key.value:
        raise InvalidOptions([("options.compact_api_key", "only with compact_base_url")])
    configured = llm.configured()
    if configured is None:
        return None
    endpoint = configured.endpoint(model)
    if endpoint is None:
        offered = configured.offered()
        raise InvalidOptions([("options.compact_model", f"not a configured model; choose one of {offered}")])
    return endpoint, configured.transport


def compacted_blocks(ctx: StrategyContext) -> list[int]:
    """The blocks to summarize, in order: every compactable group but those of the latest
    `keep_recent` compactable blocks, whole groups only, and the assistant turns the history
    would then start with (start_on_user)."""
    layout = ctx.layout
    groups = layout.groups
    blocked = {
        groups[i]
        for i in range(len(groups))
        if layout.group_protected[i] or layout.orphan[i] or layout.kinds[i] not in COMPACTABLE_KINDS
    }
    compactable = [i for i in range(len(groups)) if groups[i] not in blocked]
    keep: int = ctx.options.get("keep_recent")
    verbatim = {groups[i] for i in compactable[max(0, len(compactable) - keep) :]} if keep else set()
    chosen = {groups[i] for i in compactable if groups[i] not in verbatim}
    if chosen and ctx.options.start_on_user:
        # As the core's repair reads history: the first kept message that is not a system one.
        for i, kind in enumerate(layout.kinds):
            dropped = groups[i] in chosen or (layout.orphan[i] and not layout.group_protected[i])
            if dropped or kind != "message" or layout.roles[i] == "system":
                continue
            if layout.roles[i] != "assistant" or groups[i] in blocked:
                break
            chosen.add(groups[i])
    return [i for i in compactable if groups[i] in chosen]


def _turns(ctx: StrategyContext, blocks: list[int]) -> list[extractive.Turn]:
    """The blocks as turns, with the names of the tools they call (what an agent did matters)."""
    layout = ctx.layout
    turns = []
    for i, text in zip(blocks, ctx.conversation.texts(blocks), strict=True):
        calls = ", ".join(name for _, name in layout.calls[i])
        turns.append(extractive.Turn(layout.roles[i], f"{text}\n[called {calls}]".strip() if calls else text))
    return turns


def llm_compact(ctx: StrategyContext) -> Outcome:
    plain = ctx.plan()
    resolved = _endpoint(ctx)
    if resolved is None:
        return Outcome(plain, ctx.counts, warnings=[NO_ENDPOINT])
    above: int = ctx.options.get("compact_above_tokens")
    if not summarized_blocks(ctx, plain) and not (above and plain.total > above):
        return Outcome(plain, ctx.counts)  # nothing had to go, and under the threshold
    source = f"strategy:{ctx.name}"
    blocks = compacted_blocks(ctx)
    if not blocks:
        keep = ctx.options.get("keep_recent")
        note = Diagnostic(source, "COMPACTION_SKIPPED", f"no compactable blocks older than the latest {keep}")
        return Outcome(plain, ctx.counts, diagnostics=[note])
    max_tokens = summary_size(ctx, sum(ctx.counts.tokens[i] for i in blocks))
    reserved = reserve_plan(ctx, max_tokens)
    if reserved is None:
        note = Diagnostic(source, "SUMMARY_SKIPPED", "no room for a summary beside the protected blocks")
        return Outcome(plain, ctx.counts, diagnostics=[note])
    limit = min(reserved[1], max_tokens)
    block_id = summary_id(ctx.layout.ids)

    def tokens(text: str) -> int:
        return ctx.block_tokens([summary_message(block_id, text)])[0]

    endpoint, transport = resolved
    hint: str = ctx.options.get("hint")
    try:
        made = llm.summarize(_turns(ctx, blocks), endpoint, hint, tokens, limit, transport)
    except llm.CompactionFailed as failed:
        fields = {"strategy": ctx.name, "model": endpoint.model, "cause": failed.cause}
        log.warning("llm compaction fell back to truncate", extra={"fields": fields})
        note = Diagnostic(source, "LLM_FALLBACK", f"{failed.cause}; fell back to truncate")
        return Outcome(plain, ctx.counts, diagnostics=[note], compaction_usage=failed.usage)

    message = summary_message(block_id, made.text)
    size = tokens(made.text)
    plan = ctx.plan(
        forced=[(i, Reason.SUMMARIZED) for i in blocks],
        budget=ctx.budget - size,
        target=ctx.target() - size,
        # Compaction may bring a needed shift under the budget, not under the target: go on there.
        needed=ctx.needs_shift,
    )
    # Where the summarized history began: before the first block kept after its first block.
    before = next((k for k in plan.kept if k > blocks[0]), None)
    kept_facts = ctx.facts_kept(plan, made.facts, made.text)
    summary = Summary(message, size, before, len(blocks), kept_facts, len(made.facts), divider(len(blocks)))
    detail = f"{len(blocks)} blocks summarized by {endpoint.model} (hint {hint})"
    note = Diagnostic(source, "LLM_COMPACTED", detail, size)
    return Outcome(
        plan,
        ctx.counts,
        summary=summary,
        diagnostics=[note],
        compaction_usage=made.usage,
        warnings=extractive.unread_warning(made.unread_chars),
    )


INFO = StrategyInfo(
    NAME,
    "summarize the oldest history with an LLM (OpenAI-compatible endpoint, prompt by hint), the latest "
    "blocks verbatim; any LLM failure falls back to truncate",
    (
        OptionSpec(
            "hint",
            "str",
            llm.DEFAULT_HINT,
            f"what the summary keeps: {', '.join(llm.HINTS)}",
            choices=llm.HINTS,
        ),
        SUMMARY_MAX_TOKENS,
        OptionSpec(
            "keep_recent",
            "int",
            4,
            "the latest compactable blocks kept verbatim (whole tool groups)",
            minimum=0,
        ),
        OptionSpec(
            "compact_above_tokens",
            "int",
            0,
            "also compact once the prompt passes this many tokens, within the budget (0: only when over it)",
            minimum=0,
        ),
        OptionSpec(
            "compact_model",
            "str",
            "",
            "the model: on a server a configured one, by name or role (main, fast; default main); in the "
            "library the model at compact_base_url",
        ),
        OptionSpec(
            "compact_base_url",
            "str",
            "",
            "library only: the OpenAI-compatible API's base URL (a server uses its compact_url setting)",
            library_only=True,
        ),
        OptionSpec(
            "compact_api_key", "secret", "", "library only: the endpoint's API key", library_only=True
        ),
        OptionSpec(
            "compact_timeout_ms",
            "int",
            llm.DEFAULT_TIMEOUT_MS,
            "library only: the whole call's time limit",
            minimum=1,
            library_only=True,
        ),
    ),
    llm_compact,
    builtin=True,
)

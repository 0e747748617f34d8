"""What a built-in strategy works with (`StrategyContext`) and what it returns (`Outcome`).

A strategy never changes the engine's state: it asks the core for plans (`StrategyContext.plan`,
with groups it excludes whatever the budget, groups it removes first, a lower target, or counts
of blocks it rewrote) and returns one of them with what it changed around it: rewritten blocks,
reasons relabelled, one summary block. The core enforces the promises on every plan: protected
blocks are never excluded, groups go whole, and a plan over its budget is an error.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contextshift import engine
from contextshift.diagnostics import CompactionUsage, Diagnostic
from contextshift.errors import TokenBudgetExceeded
from contextshift.options import ShiftOptions
from contextshift.reasons import Reason

Blocks = Sequence[Mapping[str, Any]] | str | bytes
# A budget no prompt reaches: a plan against it removes only orphans and carried blocks.
UNBOUNDED = 2**62


@dataclass(frozen=True)
class Rewrite:
    """A kept block sent with other content than given (a cleared tool result, a plugin's
    replacement): its message as sent now, its tokens before and after, and how (a stable code)."""

    message: Mapping[str, Any]
    tokens_before: int
    tokens_after: int
    how: Reason


@dataclass(frozen=True)
class Summary:
    """One inserted system block (id `summary` unless taken) standing for blocks left out.
    `before` is the index of the kept block it goes right before (None: at the end)."""

    message: Mapping[str, Any]
    tokens: int
    before: int | None
    summarized: int  # blocks it stands for
    facts_kept: int
    facts_total: int
    divider_text: str

    @property
    def id(self) -> str:
        return str(self.message["id"])

    @property
    def text(self) -> str:
        return str(self.message["content"])


@dataclass(frozen=True)
class Relevance:
    """A block a relevance-aware strategy scored: its score and where the score came from
    (`given`, `embedding` or `bm25`)."""

    id: str
    score: float
    source: str


@dataclass
class Outcome:
    """A strategy's result: the core's plan (made with `counts`) and what the strategy changed
    around it."""

    plan: engine.Plan
    counts: engine.Counts
    rewrites: dict[int, Rewrite] = field(default_factory=dict)
    # Excluded blocks whose reason the strategy refines (e.g. BUDGET_OLDEST_FIRST → SUMMARIZED).
    relabel: dict[int, Reason] = field(default_factory=dict)
    summary: Summary | None = None
    relevance: list[Relevance] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    # Things the caller should know about the strategy's set-up (no compaction endpoint, ...).
    warnings: list[str] = field(default_factory=list)
    # What an LLM the strategy called spent.
    compaction_usage: CompactionUsage | None = None


def excluded_for(plan: engine.Plan, groups: Sequence[int], reasons: frozenset[Reason]) -> list[int]:
    """The blocks a plan left out whose group went for one of `reasons` (the reason its earliest
    excluded member carries; the others say TOOL_GROUP), in order."""
    lead: dict[int, str] = {}
    out = []
    for i, decision in zip(plan.excluded, plan.excluded_decisions, strict=True):
        reason = lead.setdefault(groups[i], decision.reason)
        if reason in reasons:
            out.append(i)
    return out


@dataclass
class StrategyContext:
    """A parsed, counted conversation and the budget to fit, as a strategy sees it."""

    name: str  # the strategy's, for diagnostics
    blocks: Blocks  # the input as given: dicts, or JSON text
    conversation: engine.Conversation
    counts: engine.Counts
    budget: int  # raw tokens (an approximate profile's calibration already applied)
    unpinned: list[int]
    options: ShiftOptions
    # Blocks the chat's previous prompt left out, to leave out again (contextshift.cache_stable).
    carried: Sequence[tuple[int, Reason]] = ()
    # Blocks rewritten before the strategy runs (old reasoning left out, contextshift.reasoning):
    # `counts` already has their tokens, and `message` gives them as rewritten.
    rewritten: Mapping[int, Rewrite] = field(default_factory=dict)
    # A shift was found needed before the strategy ran (the rewrites above were made for it): it
    # goes down to the target even when they brought the prompt under the budget.
    shift_needed: bool = False

    @property
    def profile(self) -> str:
        return self.counts.profile

    def target(self, budget: int | None = None) -> int:
        """Where a needed shift goes down to: `target_ratio` of the budget."""
        budget = self.budget if budget is None else budget
        return math.floor(self.options.target_ratio * budget)

    @functools.cached_property
    def whole_plan(self) -> engine.Plan:
        """The plan that leaves out only what goes whatever the budget: orphans, blocks whose
        reasoning is over the char cap, and the carried blocks."""
        return self.plan(budget=UNBOUNDED, target=UNBOUNDED)

    @property
    def whole_total(self) -> int:
        """The prompt's tokens with only what `whole_plan` leaves out left out."""
        return self.whole_plan.total

    @functools.cached_property
    def needs_shift(self) -> bool:
        """Whether a shift is needed (the whole prompt is over the budget): then it goes down to
        the target (`target_ratio`), whatever brought it under the budget on the way."""
        return self.shift_needed or self.whole_total > self.budget

    @functools.cached_property
    def layout(self) -> engine.Layout:
        return self.conversation.layout(
            self.unpinned, protect_current_input=self.options.protect_current_input
        )

    @functools.cached_property
    def current_input(self) -> int | None:
        """The last block with role user, protected or not: the turn being answered."""
        roles = self.layout.roles
        return next((i for i in range(len(roles) - 1, -1, -1) if roles[i] == "user"), None)

    @functools.cached_property
    def current_text(self) -> str:
        """The current input's text ("" without one): what relevance and summaries are scored by."""
        return "" if self.current_input is None else self.conversation.texts([self.current_input])[0]

    def plan(
        self,
        counts: engine.Counts | None = None,
        *,
        budget: int | None = None,
        target: int | None = None,
        forced: Sequence[tuple[int, Reason]] = (),
        ranked: Sequence[tuple[int, Reason]] = (),
        needed: bool = False,
    ) -> engine.Plan:
        """The core's plan (see `engine.Conversation.plan`) with this context's pins and options;
        `budget` defaults to the context's, `target` to `target_ratio` of the budget. `needed`
        (a shift was needed: `needs_shift`) makes the plan go down to the target even when the
        rewritten counts or the forced groups already bring it under the budget (or as low as it
        can when the target is out of reach). Raises `TokenBudgetExceeded` when protected blocks
        alone exceed the budget."""
        budget = self.budget if budget is None else budget
        needed = needed or self.shift_needed
        # A reserve (a summary's room) may exceed the target: then the shift goes as low as it can.
        target = max(0, self.target(budget) if target is None else target)
        counts = self.counts if counts is None else counts
        forced = [*self.carried, *forced]

        def core(limit: int, goal: int) -> engine.Plan:
            return self.conversation.plan(
                counts,
                budget=limit,
                unpinned=self.unpinned,
                protect_current_input=self.options.protect_current_input,
                start_on_user=self.options.start_on_user,
                target=goal,
                forced=forced,
                ranked=ranked,
            )

        if needed and target < budget:
            # The core cuts to the target only while its total is over the budget; with the
            # target as the budget it cuts there in the same order.
            try:
                return core(target, target)
            except TokenBudgetExceeded as e:
                if e.protected_tokens <= budget:  # out of reach: everything removable goes
                    return core(e.protected_tokens, 0)
        return core(budget, target)

    @functools.cached_property
    def _cut_messages(self) -> dict[int, Mapping[str, Any]]:
        return {index: message for index, *_, message in self.conversation.cuts(self.counts)}

    def message(self, index: int) -> Mapping[str, Any]:
        """Block `index` as it would be sent: the caller's dict (JSON input: parsed), with the
        char cap's cut or an earlier rewrite in place."""
        if index in self.rewritten:
            return self.rewritten[index].message
        if index in self._cut_messages:
            return self._cut_messages[index]
        if isinstance(self.blocks, str | bytes):
            return self.conversation.json_messages([index])[0]
        return self.blocks[index]

    def facts_kept(self, plan: engine.Plan, facts: Sequence[str], summary: str) -> int:
        """How many of `facts` (values of the left-out text's facts) the final prompt holds
        verbatim: the summary or a block `plan` keeps (the plan's `facts_kept`)."""
        return sum(self.conversation.found_in(plan.kept, facts, [summary])) if facts else 0

    def block_tokens(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Block tokens of new blocks (a summary) under this context's profile."""
        return engine.count_items(messages, self.profile)

    def rewritten_tokens(self, messages: Mapping[int, Mapping[str, Any]]) -> dict[int, int]:
        """Block tokens of rewritten blocks (`{index: message}`), each counted as its block is
        (its reasoning by the same rule)."""
        counted = self.conversation.count_rewrites(self.counts, list(messages.items()))
        return dict(zip(messages, counted, strict=True))

"""`truncate`: drop the oldest unprotected group until the prompt fits (down to `target_ratio` of
the budget once a shift is needed); orphan tool results always go."""

from __future__ import annotations

from contextshift.strategies.context import Outcome, StrategyContext
from contextshift.strategies.registry import StrategyInfo


def truncate(ctx: StrategyContext) -> Outcome:
    return Outcome(ctx.plan(), ctx.counts)


INFO = StrategyInfo(
    "truncate",
    "drop the oldest unprotected tool-call groups until the prompt fits",
    (),
    truncate,
    builtin=True,
    local=True,
)

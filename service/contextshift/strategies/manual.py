"""`manual`: blocks the caller flagged with `meta.manualExcluded: true` go first, with their whole
tool group, even when everything fits; then truncate if still over."""

from __future__ import annotations

from contextshift.errors import InvalidOptions
from contextshift.reasons import Reason
from contextshift.strategies.context import Outcome, StrategyContext
from contextshift.strategies.registry import StrategyInfo


def manual(ctx: StrategyContext) -> Outcome:
    layout = ctx.layout
    flagged = [i for i, flag in enumerate(layout.manual_excluded) if flag]
    # A protected block cannot be left out: say so rather than keep it silently.
    violations = []
    for i in flagged:
        if layout.protection[i]:
            why = f"is protected ({layout.protection[i]})"
        elif layout.group_protected[i]:
            why = "is in a tool-call group with a protected block"
        else:
            continue
        violations.append((f"blocks[{i}].meta.manualExcluded", f"block {layout.ids[i]!r} {why}"))
    if violations:
        raise InvalidOptions(violations)
    return Outcome(ctx.plan(forced=[(i, Reason.MANUAL_EXCLUDED) for i in flagged]), ctx.counts)


INFO = StrategyInfo(
    "manual",
    "leave out the blocks flagged meta.manualExcluded (with their tool groups), then truncate",
    (),
    manual,
    builtin=True,
    local=True,
)

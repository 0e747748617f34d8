"""Cache-stable shifts: a new shift of a chat starts from the cut its last prompt was made with.

Providers cache a prompt's prefix. A stateless shift of the whole history re-plans from scratch
each turn, so once a chat is over its budget it cuts a little more every turn and the prefix
changes every turn. Given the previous prompt (`PreviousPrompt`: what the chat's last shift kept,
with tokens, and left out, with reasons), a shift whose blocks still carry that prompt unchanged
(every block it kept, with the same tokens, in the same order, and every block it left out)
leaves out again what it left out, and cuts further only when it is over the budget — down to
`target_ratio` of it, so the next turns grow again on the same prefix. When the prefix changed
(an edited or removed block), the shift plans afresh and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contextshift import engine, reasons
from contextshift.diagnostics import Diagnostic
from contextshift.reasons import Reason

SOURCE = "host"


# The default `target_ratio` of a cache-stable shift: without room to grow, a chat over its budget
# cuts again at every turn and its prefix changes as often as without cache-stable shifts. Chosen
# by replaying real chats through the server (benchmarks/hysteresis.py; docs/benchmarks.md has the numbers).
TARGET_RATIO = 0.8


@dataclass(frozen=True)
class PreviousPrompt:
    """The last prompt of a chat: the blocks it kept, in order, with their tokens (the summary block
    left out), and the blocks it left out, with their reasons. Empty: a chat's first shift."""

    kept: Sequence[tuple[str, int]] = ()
    excluded: Sequence[tuple[str, str]] = ()


@dataclass(frozen=True)
class Carried:
    """What a shift takes over from the previous prompt: the blocks to leave out again (index,
    reason), and a diagnostic saying what happened (none when there was nothing to carry)."""

    forced: list[tuple[int, Reason]]
    diagnostic: Diagnostic | None


def _same(counts: engine.Counts, i: int, before: int) -> bool:
    """Block `i` costs what it cost in the previous prompt, or that less its reasoning, which the
    provider no longer keeps once a new turn began (the block itself is unchanged)."""
    now = counts.tokens[i]
    return now == before or (not counts.reasoning_counted[i] and now + counts.reasoning[i] == before)


# A carried block goes again for the budget: a summary made this time covers it afresh.
_CARRIED_AS = {Reason.SUMMARIZED: Reason.BUDGET_OLDEST_FIRST}


def carried(previous: PreviousPrompt, layout: engine.Layout, counts: engine.Counts) -> Carried:
    """The previous prompt's cut (it left something out), if this conversation still carries that
    prompt unchanged."""
    position = {block_id: i for i, block_id in enumerate(layout.ids)}
    kept_at = [position.get(block_id, -1) for block_id, _ in previous.kept]
    unchanged = (
        -1 not in kept_at
        and kept_at == sorted(kept_at)
        and all(_same(counts, i, before) for i, (_, before) in zip(kept_at, previous.kept, strict=True))
        and all(block_id in position for block_id, _ in previous.excluded)
    )
    if not unchanged:
        detail = "the last prompt's blocks changed (edited, removed or reordered): planned afresh"
        return Carried([], Diagnostic(SOURCE, "CACHE_STABLE_RESET", detail))
    # A group goes by its earliest member; orphans go anyway; blocks protected since stay.
    excluded = [(position[block_id], Reason(code)) for block_id, code in previous.excluded]
    forced = [
        (i, _CARRIED_AS.get(reason, reason))
        for i, reason in excluded
        if reason not in reasons.NOT_CARRIED and not layout.group_protected[i]
    ]
    detail = f"kept the last prompt's cut: {len(previous.excluded)} blocks left out as before"
    return Carried(forced, Diagnostic(SOURCE, "CACHE_STABLE", detail))

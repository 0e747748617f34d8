"""The stable codes of a shift: why a block was kept or left out, and how a block was cut
(docs/design.md §6). One vocabulary with the Rust core's `Reason` (rust_ext/core/src/plan.rs),
which `tests/test_reasons.py` holds this enum to, member for member and in order.

Members are `str`s equal to their codes, so they compare with, serialize (JSON, protobuf) and store
as the codes themselves; a typo is an AttributeError where it is written (and a mypy error), not a
code nobody knows at run time."""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """A decision's reason, or a truncation's how (`Truncation.how`)."""

    PROTECTED_SYSTEM = "PROTECTED_SYSTEM"
    PINNED = "PINNED"
    MANDATORY = "MANDATORY"
    FITS = "FITS"
    BUDGET_OLDEST_FIRST = "BUDGET_OLDEST_FIRST"
    TOOL_GROUP = "TOOL_GROUP"
    MANUAL_EXCLUDED = "MANUAL_EXCLUDED"
    LOW_RELEVANCE = "LOW_RELEVANCE"
    ORPHAN_TOOL_RESULT = "ORPHAN_TOOL_RESULT"
    LEADING_ASSISTANT = "LEADING_ASSISTANT"
    ANCHOR_USER_TURN = "ANCHOR_USER_TURN"
    SUMMARIZED = "SUMMARIZED"
    CHAR_CAP = "CHAR_CAP"
    UNPINNED_BY_CAP = "UNPINNED_BY_CAP"
    PLUGIN_EXCLUDED = "PLUGIN_EXCLUDED"
    REASONING_OVER_CAP = "REASONING_OVER_CAP"
    SUMMARY = "SUMMARY"
    TOOL_RESULT_CLEARED = "TOOL_RESULT_CLEARED"
    TOOL_INPUT_CLEARED = "TOOL_INPUT_CLEARED"
    PLUGIN_REPLACED = "PLUGIN_REPLACED"
    REASONING_CLEARED = "REASONING_CLEARED"


# What a kept block's reason can be.
KEPT = frozenset(
    {
        Reason.PROTECTED_SYSTEM,
        Reason.MANDATORY,
        Reason.PINNED,
        Reason.FITS,
        Reason.TOOL_GROUP,
        Reason.ANCHOR_USER_TURN,
        Reason.SUMMARY,
    }
)
# What a left-out block's reason can be (TOOL_GROUP: a group's later members).
EXCLUDED = frozenset(
    {
        Reason.BUDGET_OLDEST_FIRST,
        Reason.TOOL_GROUP,
        Reason.MANUAL_EXCLUDED,
        Reason.LOW_RELEVANCE,
        Reason.ORPHAN_TOOL_RESULT,
        Reason.LEADING_ASSISTANT,
        Reason.SUMMARIZED,
        Reason.UNPINNED_BY_CAP,
        Reason.PLUGIN_EXCLUDED,
        Reason.REASONING_OVER_CAP,
    }
)
# How a block can be cut (`Truncation.how`).
TRUNCATIONS = frozenset(
    {
        Reason.CHAR_CAP,
        Reason.TOOL_RESULT_CLEARED,
        Reason.TOOL_INPUT_CLEARED,
        Reason.PLUGIN_REPLACED,
        Reason.REASONING_CLEARED,
    }
)
# Kept reasons of blocks nothing after the plan may drop (an interceptor's change is refused).
PROTECTED = frozenset(
    {Reason.PROTECTED_SYSTEM, Reason.MANDATORY, Reason.PINNED, Reason.TOOL_GROUP, Reason.SUMMARY}
)
# What the engine's own cut for the budget leaves out (the summary strategies fold these in).
BUDGET_CUT = frozenset({Reason.BUDGET_OLDEST_FIRST, Reason.LEADING_ASSISTANT, Reason.UNPINNED_BY_CAP})
# What a final shift of the host leaves out (not the repair after a plugin's own exclusions).
FINAL_SHIFT = frozenset({Reason.BUDGET_OLDEST_FIRST, Reason.UNPINNED_BY_CAP})
# Reasons a cache-stable shift does not carry over by themselves: a group's later members go with
# its first, orphans go anyway.
NOT_CARRIED = frozenset({Reason.TOOL_GROUP, Reason.ORPHAN_TOOL_RESULT})

"""One vocabulary of reason codes: Python's `Reason` is the core's list, member for member and in
order (as pydantic-core holds its Python error types to its Rust ones), and its named subsets
cover it."""

from __future__ import annotations

import contextshift
from contextshift import _core, reasons
from contextshift.reasons import Reason


def test_the_enum_is_the_cores_list() -> None:
    assert [reason.value for reason in Reason] == list(_core.REASONS)
    assert all(reason.name == reason.value for reason in Reason)


def test_every_code_is_a_decisions_or_a_truncations() -> None:
    assert set(Reason) == reasons.KEPT | reasons.EXCLUDED | reasons.TRUNCATIONS
    assert reasons.PROTECTED <= reasons.KEPT
    assert reasons.BUDGET_CUT | reasons.FINAL_SHIFT | reasons.NOT_CARRIED <= reasons.EXCLUDED


def test_codes_compare_and_serialize_as_the_strings_they_are() -> None:
    result = contextshift.shift_context([{"role": "system", "content": "s"}], budget=100)
    [decision] = result.kept
    assert decision.reason == Reason.PROTECTED_SYSTEM
    assert type(decision.reason) is str  # the core's decisions hold plain strs
    assert f"{Reason.PINNED}" == "PINNED"
    assert contextshift.Reason is Reason


def test_the_core_refuses_a_code_it_does_not_know() -> None:
    conversation = contextshift.engine.Conversation([{"role": "user", "content": "u"}], 50_000, None)
    counts = conversation.count("heuristic")
    plan = conversation.plan(
        counts, budget=100, protect_current_input=False, forced=[(0, Reason.MANUAL_EXCLUDED)]
    )
    assert plan.excluded_decisions[0].reason == Reason.MANUAL_EXCLUDED
    try:
        conversation.plan(counts, budget=100, protect_current_input=False, forced=[(0, "NOT_A_REASON")])  # type: ignore[list-item]
    except ValueError as e:
        assert "unknown reason" in str(e)
    else:
        raise AssertionError("an unknown reason was taken")

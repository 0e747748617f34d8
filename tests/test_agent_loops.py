"""Agent loops under every built-in strategy, in the OpenAI Chat, OpenAI Responses and Anthropic
shapes (tests/agent_loops.py): the stage-5 repair keeps the user's task as the anchor instead of
removing every tool call the history would start with (DESIGN §6, stage 5), so a loop shifted to
30% of its size keeps a prompt of at least half its budget, and a warning says when the repair
removed more than a quarter of what the cut kept."""

from __future__ import annotations

from typing import Any

import pytest
from agent_loops import SHAPES, agent_loop, log_steps
from fake_llm import FakeLlm

import contextshift
from contextshift.provider_messages import to_anthropic_messages, to_openai_chat

PROFILE = "o200k_base"
LOCAL_STRATEGIES = ["truncate", "summarize", "vector-recall", "manual", "clear-tool-results"]


def shift(
    blocks: list[dict[str, Any]], budget: int, strategy: str, **options: Any
) -> contextshift.ShiftResult:
    return contextshift.shift_context(
        blocks, budget=budget, profile=PROFILE, strategy=strategy, options=options or None
    )


def thirty_percent(blocks: list[dict[str, Any]]) -> int:
    return sum(contextshift.count_tokens(blocks, PROFILE)) * 3 // 10


def history_ids(result: contextshift.ShiftResult) -> list[str]:
    """The kept blocks' ids after the system prompt."""
    return [d.id for d in result.kept if d.id != "sys"]


def starts_on_a_user_turn(result: contextshift.ShiftResult) -> bool:
    """The first kept block after the system prompt (and a summary) is the task or the question."""
    first = next(d for d in result.kept if d.id not in {"sys", "summary"})
    return first.id in {"task", "question"}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("strategy", LOCAL_STRATEGIES)
def test_an_agent_loop_keeps_its_task_and_half_its_budget(shape: str, strategy: str) -> None:
    # The loop: [system, task, (call, result) x 21, answer, question] at 30% of its size.
    blocks = agent_loop(shape, log_steps(21))
    budget = thirty_percent(blocks)
    result = shift(blocks, budget, strategy)
    reason = {d.id: d.reason for d in result.kept}
    assert reason["task"] == "ANCHOR_USER_TURN" or (strategy == "clear-tool-results" and "task" in reason)
    assert starts_on_a_user_turn(result)
    assert {"answer", "question"} <= set(reason)
    assert budget // 2 <= result.prompt_tokens <= budget
    # The latest steps stay with their results; the oldest went for the budget.
    assert "r20" in reason and "a20" in reason
    assert "ANCHOR_USER_TURN" not in {d.reason for d in result.excluded}


@pytest.mark.parametrize("shape", SHAPES)
def test_without_start_on_user_the_cut_keeps_the_same_steps(shape: str) -> None:
    # The anchor's tokens come out of the oldest steps the cut kept: a few, not all of them.
    blocks = agent_loop(shape, log_steps(21))
    budget = thirty_percent(blocks)
    plain = shift(blocks, budget, "truncate", start_on_user=False)
    repaired = shift(blocks, budget, "truncate")
    kept_plain = {d.id for d in plain.kept}
    kept_repaired = {d.id for d in repaired.kept}
    assert kept_repaired - kept_plain == {"task"}
    lost = kept_plain - kept_repaired
    assert len(lost) <= 4  # at most two steps paid for the task
    assert repaired.warnings == []  # under a quarter of what the cut kept


@pytest.mark.parametrize("shape", SHAPES)
def test_a_task_too_large_to_anchor_empties_the_loop_with_a_warning(shape: str) -> None:
    # The task alone is over what the budget leaves beside the system prompt and the question:
    # the repair removes the leading steps as before, and says how much that was.
    blocks = agent_loop(shape, log_steps(6), task="Read this spec first. " + "spec line " * 3000)
    steps = sum(contextshift.count_tokens(blocks[2:-2], PROFILE))
    budget = steps // 2
    result = shift(blocks, budget, "truncate")
    assert history_ids(result) == ["question"]
    [warning] = result.warnings
    assert warning.startswith("start_on_user: removed ")
    assert warning.endswith("tokens the cut kept so the history starts on a user turn")


def test_a_mid_loop_anthropic_prompt_keeps_the_task_before_its_calls() -> None:
    # Anthropic mid-run: the current input is the last tool_result (a user block, protected with
    # its call); no other user turn is left after the cut, so the task is the anchor.
    blocks = agent_loop("anthropic", log_steps(12), answer=None, question=None)
    budget = thirty_percent(blocks)
    result = shift(blocks, budget, "truncate")
    ids = [d.id for d in result.kept]
    assert ids[:2] == ["sys", "task"] and ids[-2:] == ["a11", "r11"]
    assert len(ids) > 4  # steps between the task and the current call stay
    assert result.prompt_tokens >= budget // 2


@pytest.mark.parametrize("shape", SHAPES)
def test_llm_compact_summary_stands_where_the_loop_began(shape: str, fake_llm: FakeLlm) -> None:
    # llm-compact summarizes the task with the old steps; the summary goes where they were, so
    # the provider's history starts on the question, never on a tool call.
    blocks = agent_loop(shape, log_steps(21))
    budget = thirty_percent(blocks)
    options = {"compact_base_url": fake_llm.url, "compact_model": "m1"}
    result = shift(blocks, budget, "llm-compact", **options)
    assert result.summary is not None
    ids = [d.id for d in result.kept]
    assert ids[:2] == ["sys", "summary"]
    assert ids[-1] == "question"
    assert result.prompt_tokens <= budget


@pytest.mark.parametrize("shape", SHAPES)
def test_the_provider_messages_start_on_the_task(shape: str) -> None:
    # The provider messages (Anthropic and OpenAI) begin with the user's task after the system.
    blocks = agent_loop(shape, log_steps(21))
    result = shift(blocks, thirty_percent(blocks), "truncate")
    _, messages = to_anthropic_messages(result.messages)
    assert messages[0]["role"] == "user" and "nightly export" in str(messages[0]["content"])
    chat = to_openai_chat(result.messages)
    assert [m["role"] for m in chat[:2]] == ["system", "user"]

"""`llm-compact` against a real HTTP server on 127.0.0.1 playing the LLM (tests/fake_llm.py): a
good answer, a slow one past the timeout, HTTP 500, garbage JSON, an empty answer, an answer cut
at max_tokens or over summary_max_tokens, a refused connection, an answer in another language;
what is asked (hint prompt, model, language instruction, key); where the summary goes and what
stays verbatim; presets and the tool-result cap; the server's configured endpoint reached through
its event loop; and the API key never in a log, a repr or a diagnostic."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fake_llm import GOOD_ANSWER, FakeLlm, closed_port_url
from test_strategies import FILLER, early_fact_chat, kept_ids, long_chat, reasons, turn

import contextshift
from contextshift.options import Secret, ShiftOptions
from contextshift.strategies import llm_compact
from contextshift.summarizer import facts, llm

KEY = "sk-test-KEY-7f3a9c1e5b2d"
LANGUAGE_RULE = "Write the summary in the same language as the conversation."


def compact(blocks: Any, fake: FakeLlm | str, budget: int = 700, **options: Any) -> contextshift.ShiftResult:
    url = fake if isinstance(fake, str) else fake.url
    given = {"compact_base_url": url, "compact_model": "m1", "compact_api_key": KEY, **options}
    return contextshift.shift_context(blocks, budget=budget, strategy="llm-compact", options=given)


def truncated(blocks: Any, budget: int = 700) -> contextshift.ShiftResult:
    return contextshift.shift_context(blocks, budget=budget)


def events(result: contextshift.ShiftResult) -> list[tuple[str, str]]:
    return [(d.source, d.event) for d in result.diagnostics]


# --- a good answer ------------------------------------------------------------------------------


def test_a_good_answer_becomes_the_summary_where_the_history_was(fake_llm: FakeLlm) -> None:
    blocks = long_chat(12)
    result = compact(blocks, fake_llm)
    summary = result.summary
    assert summary is not None and summary.id == "summary"
    # Placed where the summarized history began (after the system prompt); the latest 4
    # compactable blocks verbatim; everything older summarized.
    assert kept_ids(result) == ["sys", "summary", "u10", "a10", "u11", "a11", "now"]
    # The audit's order: the summary right after the blocks it stands for.
    ordered = [d.id for d, _ in result.ordered_decisions()]
    assert ordered[ordered.index("a9") + 1 : ordered.index("a9") + 3] == ["summary", "u10"]
    assert {reasons(result)[d.id] for d in result.excluded} == {"SUMMARIZED"}
    assert summary.summarized == len(result.excluded) == 20
    assert reasons(result)["summary"] == "SUMMARY"
    assert summary.message == {"id": "summary", "role": "system", "kind": "summary", "content": summary.text}
    assert result.messages[1] == summary.message
    assert summary.text.startswith(f"[Conversation summary]\n{GOOD_ANSWER}\nFacts: ")
    assert summary.divider_text == "Earlier context (20 messages) was summarized by AI."
    # Counted, within summary_max_tokens and the budget.
    assert summary.tokens == contextshift.count_tokens([dict(summary.message)])[0] <= 512
    assert result.prompt_tokens == sum(d.tokens for d in result.kept) <= 700
    # The tokens spent, as the endpoint reported them, and what was done.
    assert result.compaction_usage == contextshift.CompactionUsage("m1", 321, 45)
    assert events(result) == [("strategy:llm-compact", "LLM_COMPACTED")]
    assert result.diagnostics[0].detail == "20 blocks summarized by m1 (hint general)"
    assert result.warnings == []


def test_the_facts_the_answer_left_out_go_on_a_facts_line(fake_llm: FakeLlm) -> None:
    blocks = long_chat(12)
    fake_llm.answer = "Invoices INV-1000 and INV-1001 were discussed; see /srv/billing/run_0.log."
    result = compact(blocks, fake_llm)
    assert result.summary is not None
    answer, facts_line = result.summary.text.removeprefix("[Conversation summary]\n").split("\nFacts: ")
    assert answer == fake_llm.answer
    summarized = [b["content"] for b in blocks if b["id"] in {d.id for d in result.excluded}]
    every = facts.distinct(f for text in summarized for f in facts.extract(text))
    in_answer = {f for f in every if f in answer}
    assert in_answer == {"INV-1000", "INV-1001", "/srv/billing/run_0.log"}
    assert facts_line.split("; ") == [f for f in reversed(every) if f not in in_answer]  # newest first
    assert result.summary.facts_kept == result.summary.facts_total == len(every)


def test_facts_older_than_the_transcript_sent_are_counted_and_kept(fake_llm: FakeLlm) -> None:
    # The endpoint sees only the latest 256 KiB; the facts line reads every summarized block.
    blocks = early_fact_chat()
    result = compact(blocks, fake_llm, budget=20_000)
    summary = result.summary
    assert summary is not None
    assert "/srv/early/report_0.csv" not in fake_llm.requests[0].user_message
    assert summary.text.endswith("\nFacts: OPS-4711; /srv/early/report_0.csv")  # newest first
    assert (summary.facts_kept, summary.facts_total) == (2, 2)


def test_facts_that_do_not_fit_keep_the_most_recent(fake_llm: FakeLlm) -> None:
    result = compact(long_chat(30), fake_llm, budget=900, summary_max_tokens=80)
    summary = result.summary
    assert summary is not None and summary.tokens <= 80
    assert 0 < summary.facts_kept < summary.facts_total
    assert "INV-1027" in summary.text and "INV-1000" not in summary.text  # the latest summarized ones


def test_what_is_asked_hint_prompt_model_language_key_and_size(fake_llm: FakeLlm) -> None:
    compact(long_chat(12), fake_llm, hint="react_iteration", summary_max_tokens=300)
    [asked] = fake_llm.requests
    assert asked.path == "/v1/chat/completions"
    assert asked.headers["authorization"] == f"Bearer {KEY}"
    assert asked.body["model"] == "m1"
    assert asked.system_prompt == llm.PROMPTS["react_iteration"]
    assert asked.system_prompt.endswith(LANGUAGE_RULE)
    assert all(prompt.endswith(LANGUAGE_RULE) for prompt in llm.PROMPTS.values())
    assert set(llm.PROMPTS) == {"react_iteration", "planner_input", "step_dependency", "general"}
    # The summarized turns, oldest first, and nothing kept verbatim; within the summary's room.
    user = asked.user_message
    assert user.startswith(f"Summarize this conversation in at most {asked.body['max_tokens']} tokens.")
    assert "user: Question 0:" in user and "assistant: Answer 9:" in user
    assert "Question 10:" not in user and "So what about" not in user
    assert 0 < asked.body["max_tokens"] < 300


def test_an_answer_in_another_language_than_asked_is_used_as_it_is(fake_llm: FakeLlm) -> None:
    blocks = [turn("sys", "system", "Du bist ein hilfreicher Assistent.")]
    for n in range(8):
        blocks.append(turn(f"u{n}", "user", f"Frage {n}: Die Rechnung RE-{200 + n} ist falsch. " * 6))
        blocks.append(turn(f"a{n}", "assistant", f"Antwort {n}: Ich prüfe die Rechnung gleich. " * 4))
    blocks.append(turn("now", "user", "Und wie steht es um RE-203?"))
    fake_llm.answer = "The user complained about several wrong invoices."  # English, not German
    result = compact(blocks, fake_llm, budget=500, hint="planner_input")
    [asked] = fake_llm.requests
    assert asked.system_prompt == llm.PROMPTS["planner_input"]
    assert asked.system_prompt.endswith(LANGUAGE_RULE)  # the conversation's language was asked for
    assert "Frage 0" in asked.user_message
    # Not a failure: contextshift cannot judge a language, the caller sees the summary.
    assert result.summary is not None and fake_llm.answer in result.summary.text
    assert events(result) == [("strategy:llm-compact", "LLM_COMPACTED")]


# --- failures fall back to truncate -------------------------------------------------------------


FAILURES = [
    ("slow", "no answer within compact_timeout_ms (300 ms)"),
    ("error", "the endpoint answered HTTP 500"),
    ("garbage", "the answer is not JSON"),
    ("empty", "the answer is empty"),
    ("cut", "the answer was cut at max_tokens: over the summary's limit"),
]


@pytest.mark.parametrize(("mode", "cause"), FAILURES)
def test_every_failure_falls_back_to_truncate_with_its_cause(
    fake_llm: FakeLlm, mode: str, cause: str
) -> None:
    blocks = long_chat(12)
    fake_llm.mode = mode
    result = compact(blocks, fake_llm, compact_timeout_ms=300)
    plain = truncated(blocks)
    assert result.summary is None
    assert (result.kept, result.excluded) == (plain.kept, plain.excluded)
    assert result.messages == plain.messages
    [note] = result.diagnostics
    assert (note.source, note.event) == ("strategy:llm-compact", "LLM_FALLBACK")
    assert note.detail == f"{cause}; fell back to truncate"
    # What the endpoint reported spending is there even when its answer was not used.
    reported = mode in {"empty", "cut"}
    assert result.compaction_usage == (contextshift.CompactionUsage("m1", 321, 45) if reported else None)


def test_a_refused_connection_falls_back(fake_llm: FakeLlm) -> None:
    blocks = long_chat(12)
    result = compact(blocks, closed_port_url())
    assert kept_ids(result) == kept_ids(truncated(blocks))
    [note] = result.diagnostics
    assert note.event == "LLM_FALLBACK"
    assert note.detail == "could not connect to the endpoint (refused or unreachable); fell back to truncate"
    assert result.compaction_usage is None


def test_an_answer_over_summary_max_tokens_falls_back_with_its_usage(fake_llm: FakeLlm) -> None:
    fake_llm.answer = "A long answer that goes on and on. " * 60
    result = compact(long_chat(12), fake_llm, summary_max_tokens=100)
    [note] = result.diagnostics
    assert note.event == "LLM_FALLBACK"
    assert note.detail.startswith("the answer takes ") and "over the limit of 100" in note.detail
    assert result.summary is None and result.compaction_usage == contextshift.CompactionUsage("m1", 321, 45)


def test_an_answer_without_usage_reports_none(fake_llm: FakeLlm) -> None:
    fake_llm.mode = "no_usage"
    result = compact(long_chat(12), fake_llm)
    assert result.summary is not None
    assert result.compaction_usage == contextshift.CompactionUsage("m1", None, None)


# --- what is compacted ----------------------------------------------------------------------------


def agent_loop(steps: int, output: str = FILLER * 3) -> list[dict[str, Any]]:
    blocks = [turn("sys", "system", "You are an agent."), turn("task", "user", "Audit the repository.")]
    for n in range(steps):
        call = {"id": f"c{n}", "type": "function", "function": {"name": "grep", "arguments": f'{{"n": {n}}}'}}
        blocks.append({"id": f"call{n}", "role": "assistant", "content": "", "tool_calls": [call]})
        blocks.append(turn(f"out{n}", "tool", f"match {n}: src/mod_{n}.py line {100 + n}. " + output))
        blocks[-1]["tool_call_id"] = f"c{n}"
    return blocks


def test_the_verbatim_tail_never_splits_a_tool_group(fake_llm: FakeLlm) -> None:
    blocks = agent_loop(10)
    result = compact(blocks, fake_llm, budget=500, keep_recent=3)
    # The latest 3 compactable blocks are out8, call9, out9: call8 goes with out8, verbatim.
    assert kept_ids(result) == ["sys", "task", "summary", "call8", "out8", "call9", "out9"]
    excluded = reasons(result)
    assert [excluded[f"call{n}"] for n in range(8)] == ["SUMMARIZED"] * 8
    assert [excluded[f"out{n}"] for n in range(8)] == ["TOOL_GROUP"] * 8
    # The agent's tool calls are named to the LLM.
    assert "[called grep]" in fake_llm.requests[0].user_message


def test_an_assistant_turn_the_history_would_start_with_is_summarized_not_lost(fake_llm: FakeLlm) -> None:
    blocks = long_chat(12)
    result = compact(blocks, fake_llm, keep_recent=3)
    # The tail a10, u11, a11 would start with an assistant turn: a10 is summarized with the rest.
    assert kept_ids(result) == ["sys", "summary", "u11", "a11", "now"]
    assert reasons(result)["a10"] == "SUMMARIZED"
    assert "Answer 10:" in fake_llm.requests[0].user_message


def test_still_over_the_budget_truncate_goes_on(fake_llm: FakeLlm) -> None:
    blocks = long_chat(12)
    result = compact(blocks, fake_llm, budget=300, summary_max_tokens=150)
    assert result.summary is not None and result.prompt_tokens <= 300
    assert "BUDGET_OLDEST_FIRST" in {reasons(result)[i] for i in ("u10", "a10")}
    assert kept_ids(result)[:2] == ["sys", "summary"] and kept_ids(result)[-1] == "now"


def test_a_compaction_that_fits_the_budget_goes_on_down_to_the_target(fake_llm: FakeLlm) -> None:
    blocks = long_chat(12)
    at_one = compact(blocks, fake_llm)
    assert at_one.summary is not None and at_one.excluded != []
    # A target a little under what compaction alone gives (within the budget).
    ratio = (at_one.prompt_tokens - 40) / 700
    target = math.floor(ratio * 700)
    assert at_one.prompt_tokens > target
    result = compact(blocks, fake_llm, target_ratio=ratio)
    assert result.summary is not None and result.prompt_tokens <= target
    # The summary where the history began, then truncate from the oldest verbatim blocks.
    assert kept_ids(result)[:2] == ["sys", "summary"] and kept_ids(result)[-1] == "now"
    assert reasons(result)["u10"] == "BUDGET_OLDEST_FIRST"


def test_nothing_to_do_calls_no_llm(fake_llm: FakeLlm) -> None:
    fits = compact(long_chat(2), fake_llm, budget=10_000)
    assert fits.summary is None and fits.excluded == [] and fits.diagnostics == []
    assert fake_llm.requests == []
    few = compact([*long_chat(2)[:4], turn("now", "user", FILLER * 3)], fake_llm, budget=150)
    assert few.summary is None and [d.event for d in few.diagnostics] == ["COMPACTION_SKIPPED"]
    assert fake_llm.requests == []


def test_compact_above_tokens_compacts_within_the_budget(fake_llm: FakeLlm) -> None:
    blocks = long_chat(12)
    total = truncated(blocks, 100_000).prompt_tokens
    below = compact(blocks, fake_llm, budget=100_000, compact_above_tokens=total)
    assert below.summary is None and fake_llm.requests == []
    above = compact(blocks, fake_llm, budget=100_000, compact_above_tokens=total - 1)
    assert above.summary is not None and above.prompt_tokens < total
    assert kept_ids(above) == ["sys", "summary", "u10", "a10", "u11", "a11", "now"]


def test_an_earlier_summary_is_summarized_again_without_its_header(fake_llm: FakeLlm) -> None:
    first = compact(long_chat(12), fake_llm)
    assert first.summary is not None
    later = [dict(m) for m in first.messages] + [
        turn(f"x{n}", "user" if n % 2 == 0 else "assistant", f"More {n}. " + FILLER * 3) for n in range(10)
    ]
    fake_llm.requests.clear()
    second = compact(later, fake_llm, budget=600)
    assert second.summary is not None and second.summary.id == "summary-1"  # the id is taken
    assert reasons(second)["summary"] == "SUMMARIZED"
    asked = fake_llm.requests[0].user_message
    assert "system: " + GOOD_ANSWER in asked and "[Conversation summary]" not in asked
    assert second.summary.text.count("[Conversation summary]") == 1


def test_the_json_route_gives_the_same_plan(fake_llm: FakeLlm) -> None:
    blocks = long_chat(12)
    from_dicts = compact(blocks, fake_llm)
    from_json = compact(json.dumps(blocks), fake_llm)
    assert (from_json.kept, from_json.excluded) == (from_dicts.kept, from_dicts.excluded)
    assert json.loads(from_json.messages_json()) == json.loads(from_dicts.messages_json())


# --- set-up and options -------------------------------------------------------------------------


def test_without_an_endpoint_it_is_truncate_with_a_warning() -> None:
    blocks = long_chat(12)
    result = contextshift.shift_context(blocks, budget=700, strategy="llm-compact")
    plain = truncated(blocks)
    assert (result.kept, result.excluded) == (plain.kept, plain.excluded)
    assert result.warnings == [llm_compact.NO_ENDPOINT]
    assert result.summary is None and result.diagnostics == [] and result.compaction_usage is None


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"hint": "poetry"}, "options.hint"),
        ({"compact_base_url": "ftp://127.0.0.1/v1", "compact_model": "m"}, "options.compact_base_url"),
        ({"compact_base_url": "http://u:p@127.0.0.1/v1", "compact_model": "m"}, "options.compact_base_url"),
        ({"compact_base_url": "http://127.0.0.1:9/v1"}, "options.compact_model"),
        ({"compact_api_key": KEY}, "options.compact_api_key"),
        ({"compact_timeout_ms": 0}, "options.compact_timeout_ms"),
        ({"keep_recent": -1}, "options.keep_recent"),
        ({"preset": "dag"}, "options.preset"),
        ({"tool_result_max_chars": 10}, "options.tool_result_max_chars"),
    ],
)
def test_bad_options_name_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(contextshift.InvalidOptions) as caught:
        contextshift.shift_context(long_chat(12), budget=700, strategy="llm-compact", options=options)
    assert [v.field for v in caught.value.violations] == [field]
    assert KEY not in str(caught.value)


def test_a_key_that_is_not_a_string_is_not_echoed() -> None:
    with pytest.raises(contextshift.InvalidOptions) as caught:
        contextshift.shift_context(
            long_chat(2), budget=700, strategy="llm-compact", options={"compact_api_key": [KEY]}
        )
    assert str(caught.value) == "options.compact_api_key: must be a string, got list"


def test_the_strategy_is_listed_as_built_in_but_not_local() -> None:
    info = contextshift.strategies.strategy_named("llm-compact")
    assert info.builtin and not info.local
    assert not contextshift.strategies.runs_inline("llm-compact")
    assert contextshift.strategies.runs_inline("summarize")
    options = {o.name: o for o in info.options}
    assert options["hint"].default == "general" and options["hint"].choices == llm.HINTS
    assert {n for n, o in options.items() if o.library_only} == {
        "compact_base_url",
        "compact_api_key",
        "compact_timeout_ms",
    }


# --- presets and the tool-result cap ------------------------------------------------------------


def test_presets_set_their_options_and_given_options_win() -> None:
    specs = contextshift.strategies.strategy_named("llm-compact").options
    react = ShiftOptions.from_mapping({"preset": "react"}, specs)
    assert (react.get("hint"), react.max_block_chars) == ("react_iteration", 50_000)
    planner = ShiftOptions.from_mapping({"preset": "dag_planner"}, specs)
    assert (planner.get("hint"), planner.get("compact_above_tokens")) == ("planner_input", 16_000)
    step = ShiftOptions.from_mapping({"preset": "dag_step"}, specs)
    assert (step.get("hint"), step.tool_result_max_chars) == ("step_dependency", 50_000)
    assert ShiftOptions.from_mapping({"preset": "dag_analyzer"}, specs).tool_result_max_chars == 10_000
    assert ShiftOptions.from_mapping({"preset": "dag_replan"}, specs).tool_result_max_chars == 500
    overridden = ShiftOptions.from_mapping(
        {"preset": "dag_step", "hint": "general", "tool_result_max_chars": 900}, specs
    )
    assert (overridden.get("hint"), overridden.tool_result_max_chars) == ("general", 900)
    # A strategy without llm-compact's options takes the preset's caps only.
    truncate = ShiftOptions.from_mapping({"preset": "dag_step"})
    assert truncate.tool_result_max_chars == 50_000 and truncate.strategy == {}


@pytest.mark.parametrize(
    ("preset", "strategy", "warning"),
    [
        (
            "dag_planner",
            "truncate",
            "preset dag_planner: hint 'planner_input', compact_above_tokens 16000 not applied "
            "(strategy truncate does not take them)",
        ),
        (
            "react",
            "summarize",
            "preset react: hint 'react_iteration' not applied (strategy summarize does not take it)",
        ),
        (
            "dag_step",
            "clear-tool-results",
            "preset dag_step: hint 'step_dependency' not applied (strategy clear-tool-results does not take it)",
        ),
    ],
)
def test_a_preset_that_cannot_apply_to_the_strategy_says_so(preset: str, strategy: str, warning: str) -> None:
    blocks = long_chat(3)
    result = contextshift.shift_context(blocks, budget=10_000, strategy=strategy, options={"preset": preset})
    assert result.warnings == [warning]


def test_a_preset_that_applies_whole_gives_no_warning(fake_llm: FakeLlm) -> None:
    blocks = long_chat(3)
    assert contextshift.shift_context(blocks, budget=10_000, options={"preset": "dag_replan"}).warnings == []
    assert compact(blocks, fake_llm, budget=10_000, preset="dag_planner").warnings == []
    # An option given beside the preset is the caller's, not the preset's: nothing to warn about.
    given = compact(blocks, fake_llm, budget=10_000, preset="react", hint="general")
    assert given.warnings == []


def test_dag_planner_compacts_past_16000_tokens_with_the_planner_prompt(fake_llm: FakeLlm) -> None:
    blocks = long_chat(200)
    total = truncated(blocks, 1_000_000).prompt_tokens
    assert total > 16_000
    result = compact(blocks, fake_llm, budget=1_000_000, preset="dag_planner")
    assert result.summary is not None and result.prompt_tokens < 16_000
    assert fake_llm.requests[0].system_prompt == llm.PROMPTS["planner_input"]
    small = compact(long_chat(20), fake_llm, budget=1_000_000, preset="dag_planner")
    assert small.summary is None and small.excluded == [] and len(fake_llm.requests) == 1


def test_dag_replan_caps_every_step_result_not_other_blocks() -> None:
    blocks = agent_loop(3, FILLER * 8)
    blocks.insert(2, turn("long", "user", "x" * 900))
    result = contextshift.shift_context(blocks, budget=100_000, options={"preset": "dag_replan"})
    cut = {t.id: t for t in result.truncated}
    assert set(cut) == {"out0", "out1", "out2"}  # tool results only; the long user turn stays whole
    assert all(t.how == "CHAR_CAP" for t in cut.values())
    messages = {m["id"]: m for m in result.messages}
    assert len(messages["out0"]["content"]) == 500 and messages["out0"]["content"].endswith("[Truncated]")
    assert messages["long"]["content"] == "x" * 900
    # The same on the JSON route, and in Anthropic's shape (a tool_result part answers the call).
    from_json = contextshift.shift_context(
        json.dumps(blocks), budget=100_000, options={"preset": "dag_replan"}
    )
    assert [t.id for t in from_json.truncated] == [t.id for t in result.truncated]
    anthropic = [
        {"id": "q", "role": "user", "content": "go"},
        {
            "id": "use",
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
        },
        {
            "id": "res",
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "y" * 700}],
        },
    ]
    capped = contextshift.shift_context(anthropic, budget=100_000, options={"tool_result_max_chars": 100})
    assert [t.id for t in capped.truncated] == ["res"]
    assert capped.messages[2]["content"][0]["content"] == "y" * 89 + "[Truncated]"


# --- the server's endpoint, through its event loop -------------------------------------------------


@pytest.fixture
def server_endpoint(fake_llm: FakeLlm) -> Iterator[llm.LoopTransport]:
    """A configured endpoint as the server sets it up: a LoopTransport on an event loop running in
    its own thread (the server's loop), main and fast models."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def make() -> llm.LoopTransport:
        return llm.LoopTransport.on_running_loop()

    transport = asyncio.run_coroutine_threadsafe(make(), loop).result(10)
    llm.configure(
        llm.ConfiguredEndpoint(fake_llm.url, {"main": "big", "fast": "small"}, Secret(KEY), 2000, transport)
    )
    yield transport
    llm.configure(None)
    asyncio.run_coroutine_threadsafe(transport.aclose(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_the_configured_endpoint_by_role_or_name(
    fake_llm: FakeLlm, server_endpoint: llm.LoopTransport
) -> None:
    blocks = long_chat(12)
    for requested, model in [("", "big"), ("main", "big"), ("fast", "small"), ("small", "small")]:
        options = {"compact_model": requested} if requested else {}
        result = contextshift.shift_context(blocks, budget=700, strategy="llm-compact", options=options)
        assert result.summary is not None and result.compaction_usage is not None
        assert result.compaction_usage.model == model
        assert fake_llm.requests[-1].body["model"] == model
        assert fake_llm.requests[-1].headers["authorization"] == f"Bearer {KEY}"
    with pytest.raises(contextshift.InvalidOptions) as caught:
        contextshift.shift_context(
            blocks, budget=700, strategy="llm-compact", options={"compact_model": "gpt-x"}
        )
    [violation] = caught.value.violations
    assert violation.field == "options.compact_model"
    assert violation.description == "not a configured model; choose one of main (big), fast (small)"


def test_the_configured_endpoint_falls_back_on_a_timeout(
    fake_llm: FakeLlm, server_endpoint: llm.LoopTransport
) -> None:
    fake_llm.mode, fake_llm.delay = "slow", 5.0
    result = contextshift.shift_context(long_chat(12), budget=700, strategy="llm-compact")
    [note] = result.diagnostics
    assert note.detail == "no answer within compact_timeout_ms (2000 ms); fell back to truncate"


def test_the_loop_transport_refuses_to_wait_on_its_own_loop(server_endpoint: llm.LoopTransport) -> None:
    endpoint = llm.Endpoint("http://127.0.0.1:9/v1", "m")

    async def on_the_loop() -> None:
        server_endpoint.post(endpoint, b"{}")

    with pytest.raises(RuntimeError, match="would wait on itself"):
        asyncio.run_coroutine_threadsafe(on_the_loop(), server_endpoint._loop).result(10)


# --- the key ------------------------------------------------------------------------------------


def test_the_api_key_is_never_logged_shown_or_reported(
    fake_llm: FakeLlm, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, httpx and httpcore included
    for name in ("contextshift", "httpx", "httpcore"):
        logging.getLogger(name).propagate = True
    shown: list[str] = []
    for mode in ("good", *(mode for mode, _ in FAILURES)):
        fake_llm.mode, fake_llm.delay = mode, 1.0
        result = compact(long_chat(12), fake_llm, compact_timeout_ms=300)
        shown += [repr(result), str(result.diagnostics), result.messages_json(), str(result.warnings)]
    shown.append(repr(compact(long_chat(12), closed_port_url())))
    shown.append(repr(ShiftOptions.from_mapping({"compact_api_key": KEY}, llm_compact.INFO.options)))
    shown.append(repr(llm.Endpoint(fake_llm.url, "m", Secret(KEY))))
    assert caplog.records, "nothing was logged: the test would prove nothing"
    assert any(r.name.startswith("httpx") for r in caplog.records)
    assert any("fell back" in r.getMessage() for r in caplog.records)
    for text in [caplog.text, *(str(r.__dict__) for r in caplog.records), *shown]:
        assert KEY not in text
    # The key did reach the endpoint: it was in play.
    assert any(r.headers.get("authorization") == f"Bearer {KEY}" for r in fake_llm.requests)

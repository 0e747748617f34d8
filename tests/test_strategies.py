"""Named cases for each built-in strategy (summarize, vector-recall, manual, clear-tool-results),
the hysteresis option, and strategy options. The property suite (test_properties.py) checks the
engine's promises for every strategy on generated conversations; these pin the edge cases."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import contextshift
from contextshift.summarizer import extractive, facts

FILLER = "We talked about the weather and other things that do not matter much at all. "


def turn(block_id: str, role: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"id": block_id, "role": role, "content": text, **extra}


def reasons(result: contextshift.ShiftResult) -> dict[str, str]:
    return {d.id: d.reason for d in [*result.kept, *result.excluded]}


def kept_ids(result: contextshift.ShiftResult) -> list[str]:
    return [d.id for d in result.kept]


def tokens(block: dict[str, Any]) -> int:
    return contextshift.count_tokens([block])[0]


def long_chat(turns: int) -> list[dict[str, Any]]:
    blocks = [turn("sys", "system", "You are a support agent.")]
    for n in range(turns):
        blocks.append(
            turn(f"u{n}", "user", f"Question {n}: the invoice INV-{1000 + n} was sent. " + FILLER * 2)
        )
        blocks.append(
            turn(f"a{n}", "assistant", f"Answer {n}: see /srv/billing/run_{n}.log today. " + FILLER)
        )
    blocks.append(turn("now", "user", "So what about invoice INV-1003?"))
    return blocks


# --- summarize ----------------------------------------------------------------------------------


def test_summarize_puts_one_summary_block_before_the_current_input() -> None:
    blocks = long_chat(12)
    result = contextshift.shift_context(blocks, budget=700, strategy="summarize")
    summary = result.summary
    assert summary is not None and summary.id == "summary"
    assert kept_ids(result)[-2:] == ["summary", "now"]
    assert result.messages[-2] == summary.message
    assert summary.text.startswith("[Conversation summary]")
    assert summary.message["role"] == "system" and summary.message["kind"] == "summary"
    # The summarized blocks say so; the summary is SUMMARY, counted and within the budget.
    assert {reasons(result)[d.id] for d in result.excluded} == {"SUMMARIZED"}
    assert summary.summarized == len(result.excluded)
    assert reasons(result)["summary"] == "SUMMARY"
    assert result.prompt_tokens == sum(d.tokens for d in result.kept) <= 700
    assert summary.tokens == tokens(dict(summary.message)) <= 512
    assert summary.divider_text == f"Earlier context ({summary.summarized} messages) was summarized."
    # The ordered view puts it where it is sent.
    ordered = [d.id for d, _ in result.ordered_decisions()]
    assert ordered.index("summary") == ordered.index("now") - 1


def test_summarize_is_byte_identical_on_both_routes_and_runs() -> None:
    blocks = long_chat(10)
    first = contextshift.shift_context(blocks, budget=600, strategy="summarize")
    again = contextshift.shift_context(blocks, budget=600, strategy="summarize")
    from_json = contextshift.shift_context(json.dumps(blocks), budget=600, strategy="summarize")
    assert first.summary and again.summary and from_json.summary
    assert first.summary.text == again.summary.text == from_json.summary.text
    assert json.loads(from_json.messages_json()) == json.loads(first.messages_json())


def test_summarize_keeps_the_facts_of_what_it_left_out() -> None:
    blocks = long_chat(8)
    result = contextshift.shift_context(blocks, budget=500, strategy="summarize")
    assert result.summary is not None
    left_out = [b["content"] for b in blocks if b["id"] in {d.id for d in result.excluded}]
    for text in left_out:
        for fact in ("INV-", "/srv/billing/run_"):
            for found in facts.extract(text):
                if found.startswith(fact):
                    assert found in result.summary.text
    assert result.summary.facts_kept == result.summary.facts_total > 0


def early_fact_chat() -> list[dict[str, Any]]:
    """Two facts, then more than the summarizer's scored window of fact-free history."""
    filler = FILLER * 100
    blocks = [
        turn("sys", "system", "You are a support agent."),
        turn("u0", "user", "The report is at /srv/early/report_0.csv for ticket OPS-4711."),
    ]
    for n in range(extractive.MAX_INPUT_CHARS // (2 * len(filler)) + 2):
        blocks += [turn(f"a{n}", "assistant", "Noted. " + filler), turn(f"u{n + 1}", "user", filler)]
    blocks.append(turn("now", "user", "Where was the report?"))
    return blocks


def test_summarize_counts_and_keeps_facts_older_than_the_scored_window() -> None:
    blocks = early_fact_chat()
    result = contextshift.shift_context(blocks, budget=800, strategy="summarize")
    summary = result.summary
    assert summary is not None and kept_ids(result) == ["sys", "summary", "now"]
    left_out = [b["content"] for b in blocks if b["id"] in {d.id for d in result.excluded}]
    assert sum(map(len, left_out)) > extractive.MAX_INPUT_CHARS
    every = facts.distinct(f for text in left_out for f in facts.extract(text))
    assert every == ["/srv/early/report_0.csv", "OPS-4711"]
    # Counted although only the latest MAX_INPUT_CHARS are scored, and carried (a facts line).
    assert (summary.facts_kept, summary.facts_total) == (2, 2)
    assert all(f in summary.text for f in every)


def test_fact_extraction_skips_only_text_without_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    # The trigger prefilter must never hide a fact: every sample and every sentence of the
    # shipped fact corpus gives what the full scan (every text scanned) gives.
    corpus = json.loads(
        (Path(__file__).resolve().parent.parent / "benchmarks/data/fact_chats.json").read_text()
    )
    texts = [b["content"] for chat in corpus for b in chat["blocks"] if isinstance(b.get("content"), str)]
    samples = [
        "See fooBar and os.path.join() in app.py, C:\\Temp\\x, ~/notes, $5, 12:30, OPS-12, #42.",
        "Released v1.2.3 on May 1, 2024 to a@b.io at https://x.org; 3 days, 25%, 1,000.",
        "deadbeef1 and MAX_SIZE and snake_case and `code` and 2024年",
        # One trigger each: a camelCase word, a file name, a dotted call, CONSTANT_CASE, a path.
        "then fooBar ran",
        "open notes.md first",
        "call os.getcwd() there",
        "set MAX_SIZE high",
        "see ~/notes now",
        "Plain prose: no facts at all here. None! Really?",
    ]
    sentences = samples + [s for t in texts for s in extractive.sentences(t)]
    filtered = [facts.extract(s) for s in sentences]
    monkeypatch.setattr(facts, "_TRIGGERS", (re.compile(""),))  # matches anywhere: scan all
    assert filtered == [facts.extract(s) for s in sentences]
    assert sum(map(bool, filtered)) > len(samples) and filtered[len(samples) - 1] == []


def test_summarize_reads_facts_from_the_most_recent_window_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A history past the facts window: its oldest facts are not read, and the result says so.
    monkeypatch.setattr(extractive, "MAX_FACTS_CHARS", extractive.MAX_INPUT_CHARS)
    blocks = early_fact_chat()
    result = contextshift.shift_context(blocks, budget=800, strategy="summarize")
    assert result.summary is not None and result.summary.facts_total == 0
    [warning] = [w for w in result.warnings if w.startswith("summary: facts read from")]
    assert f"most recent {extractive.MAX_INPUT_CHARS} characters" in warning


def roomy(limit: int = 10_000) -> extractive.Room:
    """A summary's room of `limit` heuristic tokens."""
    return extractive.Room(
        limit,
        lambda text: contextshift.count_tokens([{"role": "system", "content": text}])[0],
        lambda texts: contextshift.count_tokens(list(texts)),
    )


def test_summaries_keep_code_spans_and_fenced_code_byte_for_byte() -> None:
    code = "```py\ndef f():\n    return  1\n```"
    text = f"Call `x. y` first.   Then run `a  b\tc`  twice.\n{code}\nDone."
    made = extractive.summarize([extractive.Turn("assistant", text)], roomy())
    assert made is not None
    # Prose on one line with single spaces; a code span is neither split nor re-spaced, and a
    # fenced block keeps its lines and indentation. "Done." says too little to be worth a place.
    assert made.text == "\n".join(
        [
            "[Conversation summary]",
            "assistant: Call `x. y` first. Then run `a  b\tc` twice.",
            f"  {code}",
        ]
    )
    assert made.facts_kept == made.facts_total == 2  # the two code spans


def test_summarize_ends_at_the_target_once_a_shift_is_needed() -> None:
    blocks = long_chat(12)
    # The target (350) leaves no summary_max_tokens beside the protected blocks: the summary
    # takes the room under the target, not under the budget.
    result = contextshift.shift_context(
        blocks, budget=700, strategy="summarize", options={"target_ratio": 0.5, "summary_max_tokens": 512}
    )
    summary = result.summary
    assert summary is not None and kept_ids(result) == ["sys", "summary", "now"]
    assert result.prompt_tokens <= 350 < result.prompt_tokens - summary.tokens + 512
    assert summary.facts_kept > 0


def test_summarize_when_everything_fits_makes_no_summary() -> None:
    blocks = long_chat(2)
    result = contextshift.shift_context(blocks, budget=10_000, strategy="summarize")
    assert result.summary is None and result.excluded == []


def test_summarize_history_that_is_already_summaries() -> None:
    blocks = [turn("sys", "system", "Be brief.")]
    blocks += [
        turn(
            f"s{n}",
            "system",
            f"[Conversation summary] step {n} wrote /tmp/out_{n}.csv. " + FILLER,
            kind="summary",
        )
        for n in range(8)
    ]
    blocks.append(turn("now", "user", "Continue."))
    result = contextshift.shift_context(blocks, budget=200, strategy="summarize")
    assert result.summary is not None
    assert result.summary.text.count("[Conversation summary]") == 1  # one header, old ones are text
    summarized = [d.id for d in result.excluded]
    assert summarized and all(
        f"/tmp/out_{block_id[1:]}.csv" in result.summary.text for block_id in summarized
    )
    assert result.prompt_tokens <= 200


def test_a_summary_that_would_overflow_is_cut_down_to_fit() -> None:
    blocks = long_chat(30)
    protected = tokens(blocks[0]) + tokens(blocks[-1])
    budget = protected + 60
    result = contextshift.shift_context(
        blocks, budget=budget, strategy="summarize", options={"summary_max_tokens": 512}
    )
    assert result.summary is not None
    assert result.prompt_tokens <= budget
    assert result.summary.facts_kept < result.summary.facts_total  # only the most recent fit
    # The facts line keeps the most recent facts when it must be cut.
    assert "INV-1029" in result.summary.text


def test_no_room_for_a_summary_is_a_diagnostic_not_a_failure() -> None:
    blocks = long_chat(5)
    budget = tokens(blocks[0]) + tokens(blocks[-1]) + 5
    result = contextshift.shift_context(blocks, budget=budget, strategy="summarize")
    assert result.summary is None
    assert [d.event for d in result.diagnostics] == ["SUMMARY_SKIPPED"]
    assert kept_ids(result) == ["sys", "now"]


def test_sentences_split_on_cjk_ends_and_keep_code_blocks_whole() -> None:
    text = "東京に行きます。明日は雨ですか？はい！ Then we ran:\n```\nmake test\nmake lint\n```\nDone. Next."
    assert extractive.sentences(text) == [
        "東京に行きます。",
        "明日は雨ですか？",
        "はい！",
        "Then we ran:",
        "```\nmake test\nmake lint\n```",
        "Done.",
        "Next.",
    ]


def facts_benchmark() -> ModuleType:
    """benchmarks/facts.py, loaded from its file (benchmarks/ is not on the test path)."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "facts.py"
    spec = importlib.util.spec_from_file_location("facts_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_facts_benchmark_fails_when_retention_misses_the_target() -> None:
    bench = facts_benchmark()

    def row(facts_stated: int, kept: int) -> dict[str, Any]:
        return {"facts": facts_stated, "kept": kept, "baseline_kept": 0, "extracted": [kept, facts_stated]}

    finding, status = bench.verdict([row(10, 10), row(10, 7)])  # 85%
    assert status == 1 and finding.endswith("FAIL")
    finding, status = bench.verdict([row(10, 10), row(10, 8)])  # 90%: met
    assert status == 0 and finding.endswith("PASS")
    assert bench.verdict([])[1] == 1  # no facts measured is no evidence


# --- vector-recall ------------------------------------------------------------------------------


def lore(block_id: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"id": block_id, "role": "system", "kind": "lorebook", "content": text, **extra}


def test_vector_recall_drops_the_least_relevant_entries_first_ties_older_first() -> None:
    blocks = [
        lore("l0", "x" * 40, relevance=0.5),
        lore("l1", "x" * 40, relevance=0.1),
        lore("l2", "x" * 40, relevance=0.5),
        {"id": "m", "role": "system", "kind": "memory", "content": "x" * 40, "relevance": 0.9},
        turn("u", "user", "hi"),
    ]
    entry = tokens(blocks[0])
    everything = sum(tokens(b) for b in blocks)
    result = contextshift.shift_context(blocks, budget=everything - 2 * entry, strategy="vector-recall")
    assert [d.id for d in result.excluded] == ["l0", "l1"]  # 0.1 first, then the older 0.5
    assert {d.reason for d in result.excluded} == {"LOW_RELEVANCE"}
    assert {(r.id, r.score, r.source) for r in result.relevance} == {
        ("l0", 0.5, "given"),
        ("l1", 0.1, "given"),
        ("l2", 0.5, "given"),
        ("m", 0.9, "given"),
    }


def test_vector_recall_scores_embeddings_by_cosine_and_text_by_bm25() -> None:
    blocks = [
        lore("near", "a", meta={"embedding": [1.0, 0.0]}),
        lore("far", "b", meta={"embedding": [0.0, 1.0]}),
        lore("dragon", "The red dragon sleeps in the northern pass."),
        lore("tavern", "The tavern serves ale and stew."),
        turn("u", "user", "Where does the dragon sleep?"),
    ]
    result = contextshift.shift_context(
        blocks, budget=10_000, strategy="vector-recall", options={"query_embedding": [1.0, 0.0]}
    )
    scores = {r.id: (round(r.score, 6), r.source) for r in result.relevance}
    assert scores["near"] == (1.0, "embedding") and scores["far"] == (0.0, "embedding")
    assert scores["dragon"][1] == scores["tavern"][1] == "bm25"
    assert scores["dragon"][0] > scores["tavern"][0]
    assert result.excluded == []  # everything fits: nothing dropped
    # Tight: by BM25 the tavern (irrelevant to the question) goes before the dragon.
    text_only = blocks[2:]
    tight = sum(tokens(b) for b in text_only) - tokens(blocks[3])
    cut = contextshift.shift_context(text_only, budget=tight, strategy="vector-recall")
    assert [(d.id, d.reason) for d in cut.excluded] == [("tavern", "LOW_RELEVANCE")]
    # By embedding, the far entry goes first.
    embedded = [blocks[0], blocks[1], blocks[4]]
    by_cosine = contextshift.shift_context(
        embedded,
        budget=sum(tokens(b) for b in embedded) - 1,
        strategy="vector-recall",
        options={"query_embedding": [1.0, 0.0]},
    )
    assert [d.id for d in by_cosine.excluded] == ["far"]


def test_vector_recall_puts_every_source_on_one_scale() -> None:
    """A caller's relevance of 1.0 outranks every computed score: BM25 is divided by the most the
    input can score, so it stays below 1, and ranks among the given ones."""
    question = "Where does the red dragon sleep in the northern pass?"
    computed = [lore(f"c{i}", f"The red dragon sleeps in the northern pass, note {i}.") for i in range(13)]
    blocks = [
        lore("given", "Salt wards off the dragon.", relevance=1.0),
        *computed,
        turn("u", "user", question),
    ]
    entry = tokens(computed[0])
    result = contextshift.shift_context(
        blocks, budget=sum(tokens(b) for b in blocks) - 13 * entry, strategy="vector-recall"
    )
    assert "given" not in {d.id for d in result.excluded}
    scores = {r.id: (r.score, r.source) for r in result.relevance}
    assert scores["given"] == (1.0, "given")
    assert all(
        source == "bm25" and 0 < score < 1 for key, (score, source) in scores.items() if key != "given"
    )
    # A given relevance of 0.2 goes before the computed entries that match the question well.
    low = [
        lore("low", "Salt wards off the dragon.", relevance=0.2),
        *computed[:3],
        turn("u", "user", question),
    ]
    cut = contextshift.shift_context(low, budget=sum(tokens(b) for b in low) - 1, strategy="vector-recall")
    assert [d.id for d in cut.excluded] == ["low"]


def test_vector_recall_scores_a_question_without_terms_zero_not_minus_zero() -> None:
    blocks = [lore("a", "dragons"), lore("b", "taverns"), turn("u", "user", "?!")]
    result = contextshift.shift_context(blocks, budget=10_000, strategy="vector-recall")
    assert [(r.score, math.copysign(1, r.score)) for r in result.relevance] == [(0.0, 1.0), (0.0, 1.0)]


@pytest.mark.parametrize(("relevance", "shown"), [(1.5, "1.5"), (-0.1, "-0.1"), (7, "7")])
def test_a_relevance_off_the_scale_is_refused(relevance: float, shown: str) -> None:
    with pytest.raises(contextshift.InvalidBlocks) as caught:
        contextshift.shift_context([lore("l", "x", relevance=relevance), turn("u", "user", "q")], budget=100)
    assert [(v.field, v.description) for v in caught.value.violations] == [
        ("blocks[0].relevance", f"must be between 0 and 1, got {shown}")
    ]


def test_vector_recall_with_every_lorebook_entry_mandatory_shifts_history() -> None:
    blocks = [
        lore("l0", "x" * 40, mandatory=True),
        turn("u0", "user", "old question"),
        turn("a0", "assistant", "old answer"),
        turn("u1", "user", "new question"),
    ]
    budget = sum(tokens(b) for b in blocks) - 1
    result = contextshift.shift_context(blocks, budget=budget, strategy="vector-recall")
    # u0 goes for the budget; a0 would then lead with no user turn before u1, so u0 comes back
    # as the anchor and a0 pays for it.
    assert reasons(result) == {
        "l0": "MANDATORY",
        "u0": "ANCHOR_USER_TURN",
        "a0": "BUDGET_OLDEST_FIRST",
        "u1": "PINNED",
    }
    assert result.relevance == []


def test_vector_recall_rejects_an_embedding_of_the_wrong_size() -> None:
    blocks = [lore("l", "a", meta={"embedding": [1.0, 2.0, 3.0]}), turn("u", "user", "q")]
    with pytest.raises(contextshift.InvalidBlocks) as caught:
        contextshift.shift_context(
            blocks, budget=1000, strategy="vector-recall", options={"query_embedding": [1.0, 0.0]}
        )
    assert [v.field for v in caught.value.violations] == ["blocks[0].meta.embedding"]


# --- manual -------------------------------------------------------------------------------------


def test_manual_leaves_out_flagged_blocks_even_when_everything_fits() -> None:
    blocks = [
        turn("sys", "system", "s"),
        turn("u0", "user", "old", meta={"manualExcluded": True}),
        turn("a0", "assistant", "reply"),
        turn("u1", "user", "now"),
    ]
    result = contextshift.shift_context(blocks, budget=10_000, strategy="manual")
    assert reasons(result) == {
        "sys": "PROTECTED_SYSTEM",
        "u0": "MANUAL_EXCLUDED",
        "a0": "LEADING_ASSISTANT",
        "u1": "PINNED",
    }
    # The same flag under truncate means nothing.
    assert contextshift.shift_context(blocks, budget=10_000).excluded == []


def test_manual_flag_on_one_member_takes_the_whole_tool_group() -> None:
    blocks = [
        turn("u0", "user", "look it up"),
        {
            "id": "call",
            "role": "assistant",
            "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
        },
        {
            "id": "result",
            "role": "tool",
            "tool_call_id": "c1",
            "content": "42",
            "meta": {"manualExcluded": True},
        },
        turn("a0", "assistant", "it is 42"),
        turn("u1", "user", "thanks"),
    ]
    result = contextshift.shift_context(
        blocks, budget=10_000, strategy="manual", options={"start_on_user": False}
    )
    assert [(d.id, d.reason) for d in result.excluded] == [
        ("call", "MANUAL_EXCLUDED"),
        ("result", "TOOL_GROUP"),
    ]


def test_manual_flag_on_a_protected_block_is_an_error_naming_it() -> None:
    blocks = [
        turn("sys", "system", "s", meta={"manualExcluded": True}),
        turn("u", "user", "q", meta={"manualExcluded": True}),
    ]
    with pytest.raises(contextshift.InvalidOptions) as caught:
        contextshift.shift_context(blocks, budget=1000, strategy="manual")
    assert [v.field for v in caught.value.violations] == [
        "blocks[0].meta.manualExcluded",
        "blocks[1].meta.manualExcluded",
    ]
    assert "'sys' is protected (system)" in str(caught.value)


def test_manual_then_truncates_when_still_over() -> None:
    blocks = [turn(f"u{n}", "user" if n % 2 == 0 else "assistant", "x" * 100) for n in range(6)]
    blocks[2]["meta"] = {"manualExcluded": True}
    budget = tokens(blocks[0]) * 3
    result = contextshift.shift_context(blocks, budget=budget, strategy="manual")
    # Flagged u2 goes; u0 and u1 go for the budget; u3 would then lead with no user turn before
    # the current input u4: u0 (not the flagged u2) comes back as the anchor, u3 pays for it.
    assert reasons(result)["u2"] == "MANUAL_EXCLUDED"
    assert [d.id for d in result.kept] == ["u0", "u4", "u5"]
    assert reasons(result)["u0"] == "ANCHOR_USER_TURN"
    assert result.prompt_tokens <= budget


# --- clear-tool-results -------------------------------------------------------------------------


def agent_loop(calls: int, output: str = "row " * 200) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [turn("sys", "system", "agent"), turn("task", "user", "do the task")]
    for n in range(calls):
        name = "search" if n % 2 == 0 else "fetch"
        call = {
            "id": f"c{n}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps({"q": n})},
        }
        blocks.append({"id": f"call{n}", "role": "assistant", "tool_calls": [call]})
        blocks.append({"id": f"res{n}", "role": "tool", "tool_call_id": f"c{n}", "content": output})
    return blocks


def test_clear_tool_results_replaces_the_oldest_results_and_keeps_the_pairs() -> None:
    blocks = agent_loop(6)
    budget = sum(tokens(b) for b in blocks) - 2 * tokens(blocks[3]) + 50
    result = contextshift.shift_context(blocks, budget=budget, strategy="clear-tool-results")
    assert result.excluded == []  # no turn dropped: clearing was enough
    cleared = [t for t in result.truncated if t.how == "TOOL_RESULT_CLEARED"]
    assert [t.id for t in cleared] == ["res0", "res1"]
    messages = {m["id"]: m for m in result.messages}
    assert messages["res0"]["content"] == f"[tool result cleared: {cleared[0].tokens_before} tokens]"
    assert messages["res0"]["tool_call_id"] == "c0" and "call0" in messages  # still a valid pair
    assert messages["res5"]["content"] == blocks[-1]["content"]
    assert result.prompt_tokens <= budget
    assert [d.event for d in result.diagnostics] == ["TOOL_RESULTS_CLEARED"]


def cleared_result(block: dict[str, Any]) -> dict[str, Any]:
    """A tool result as clear-tool-results sends it."""
    return {**block, "content": f"[tool result cleared: {tokens(block)} tokens]"}


def cleared_call(block: dict[str, Any]) -> dict[str, Any]:
    """A tool call with its arguments blanked (clear_tool_inputs)."""
    calls = [{**c, "function": {**c["function"], "arguments": "{}"}} for c in block["tool_calls"]]
    return {**block, "tool_calls": calls}


def clearing_case(
    blocks: list[dict[str, Any]], cleared: list[str], inputs: bool = False
) -> tuple[int, list[dict[str, Any]], list[contextshift.Truncation]]:
    """The budget that clearing exactly the results `cleared` (and with `inputs` their calls)
    reaches, the messages then sent, and the truncations listed."""
    by_id = {b["id"]: b for b in blocks}
    issuer = {c["id"]: b["id"] for b in blocks for c in b.get("tool_calls", [])}
    calls = {issuer[by_id[i]["tool_call_id"]] for i in cleared} if inputs else set()
    sent = [
        cleared_result(b) if b["id"] in cleared else cleared_call(b) if b["id"] in calls else b
        for b in blocks
    ]
    truncations = [
        contextshift.Truncation(
            b["id"],
            tokens(b),
            tokens(after),
            "TOOL_RESULT_CLEARED" if b["id"] in cleared else "TOOL_INPUT_CLEARED",
        )
        for b, after in zip(blocks, sent, strict=True)
        if after is not b
    ]
    return sum(map(tokens, sent)), sent, truncations


def assert_cleared_exactly(
    result: contextshift.ShiftResult,
    blocks: list[dict[str, Any]],
    sent: list[dict[str, Any]],
    truncations: list[contextshift.Truncation],
) -> None:
    """Nothing left out, the pairs all kept, the cleared blocks listed, every other block sent as
    given (the caller's own dict)."""
    assert result.excluded == []
    assert kept_ids(result) == [b["id"] for b in blocks]
    assert result.truncated == truncations
    assert result.messages == sent
    listed = {t.id for t in truncations}
    assert {d.reason for d in result.kept if d.id in listed} == {"FITS"}
    assert all(m is b for m, b in zip(result.messages, blocks, strict=True) if b["id"] not in listed)
    assert result.prompt_tokens == sum(map(tokens, sent)) <= result.budget


def test_clear_tool_results_keeps_the_latest_keep_tool_uses_intact() -> None:
    blocks = agent_loop(6)
    # Every result but the latest one must be cleared to fit: keep_tool_uses 1 allows it.
    budget, sent, truncations = clearing_case(blocks, ["res0", "res1", "res2", "res3", "res4"])
    options = {"keep_tool_uses": 1}
    result = contextshift.shift_context(blocks, budget=budget, strategy="clear-tool-results", options=options)
    assert_cleared_exactly(result, blocks, sent, truncations)
    assert result.messages[-1]["content"] == "row " * 200  # res5, the latest, intact
    assert [d.event for d in result.diagnostics] == ["TOOL_RESULTS_CLEARED"]
    assert result.diagnostics[0].detail == "cleared 5 tool results"
    # With the default 3, res3-res5 stay intact: turns go instead.
    default = contextshift.shift_context(blocks, budget=budget, strategy="clear-tool-results")
    assert default.excluded != [] and default.truncated == []
    assert kept_ids(default)[-2:] == ["call5", "res5"] and default.messages[-1] is blocks[-1]


def test_clear_tool_results_never_clears_exclude_tools() -> None:
    blocks = agent_loop(6)  # res1, res3, res5 answer "fetch"
    budget, sent, truncations = clearing_case(blocks, ["res0", "res2", "res4"])
    options = {"keep_tool_uses": 0, "exclude_tools": ["fetch"]}
    result = contextshift.shift_context(blocks, budget=budget, strategy="clear-tool-results", options=options)
    assert_cleared_exactly(result, blocks, sent, truncations)
    assert [t.id for t in result.truncated] == ["res0", "res2", "res4"]
    assert {m["id"]: m["content"] for m in result.messages if m["id"] in {"res1", "res3", "res5"}} == {
        "res1": "row " * 200,
        "res3": "row " * 200,
        "res5": "row " * 200,
    }
    # Without the exclusion the oldest results go first, fetch's among them.
    plain = contextshift.shift_context(
        blocks, budget=budget, strategy="clear-tool-results", options={"keep_tool_uses": 0}
    )
    assert [t.id for t in plain.truncated] == ["res0", "res1", "res2"]


def test_clear_tool_inputs_blanks_the_calls_arguments_too() -> None:
    blocks = agent_loop(6)
    budget, sent, truncations = clearing_case(blocks, ["res0", "res1", "res2"], inputs=True)
    options = {"clear_tool_inputs": True}
    result = contextshift.shift_context(blocks, budget=budget, strategy="clear-tool-results", options=options)
    assert_cleared_exactly(result, blocks, sent, truncations)
    assert [(t.id, t.how) for t in result.truncated] == [
        ("call0", "TOOL_INPUT_CLEARED"),
        ("res0", "TOOL_RESULT_CLEARED"),
        ("call1", "TOOL_INPUT_CLEARED"),
        ("res1", "TOOL_RESULT_CLEARED"),
        ("call2", "TOOL_INPUT_CLEARED"),
        ("res2", "TOOL_RESULT_CLEARED"),
    ]
    messages = {m["id"]: m for m in result.messages}
    call = messages["call0"]["tool_calls"][0]
    assert call == {"id": "c0", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    assert messages["res0"] == {
        "id": "res0",
        "role": "tool",
        "tool_call_id": "c0",
        "content": f"[tool result cleared: {tokens(blocks[3])} tokens]",
    }
    assert messages["call3"]["tool_calls"][0]["function"]["arguments"] == json.dumps({"q": 3})
    # The calls' tokens count: without clearing them the same budget is not reached, a turn goes.
    without = contextshift.shift_context(blocks, budget=budget, strategy="clear-tool-results")
    assert without.excluded != []
    assert {t.how for t in without.truncated} == {"TOOL_RESULT_CLEARED"}


def test_every_tool_result_under_keep_tool_uses_means_truncate() -> None:
    blocks = agent_loop(3)
    budget = sum(tokens(b) for b in blocks) - 10
    result = contextshift.shift_context(blocks, budget=budget, strategy="clear-tool-results")
    plain = contextshift.shift_context(blocks, budget=budget)
    assert result.truncated == [] and result.diagnostics == []
    assert reasons(result) == reasons(plain)


def test_clear_at_least_when_clearing_gains_nothing_truncates_straight_away() -> None:
    blocks = agent_loop(5, output="short result")  # as short as a placeholder: no gain at all
    budget = sum(tokens(b) for b in blocks) - 3
    result = contextshift.shift_context(
        blocks, budget=budget, strategy="clear-tool-results", options={"clear_at_least": 1000}
    )
    assert result.truncated == []
    assert [d.event for d in result.diagnostics] == ["CLEAR_SKIPPED"]
    assert reasons(result) == reasons(contextshift.shift_context(blocks, budget=budget))


def clear_gain(block: dict[str, Any]) -> int:
    return tokens(block) - tokens(cleared_result(block))


def test_clear_at_least_not_reached_clears_nothing_and_truncates_straight_away() -> None:
    blocks = agent_loop(6)
    budget = sum(tokens(b) for b in blocks) - 10
    # res0-res2 may be cleared (keep_tool_uses 3): all of them gain one token less than asked.
    possible = sum(clear_gain(b) for b in blocks if b["id"] in {"res0", "res1", "res2"})
    assert possible > 10  # clearing would fit the budget
    options = {"clear_at_least": possible + 1}
    result = contextshift.shift_context(blocks, budget=budget, strategy="clear-tool-results", options=options)
    assert result.truncated == []
    assert result.messages == [b for b in blocks if b["id"] in kept_ids(result)]
    plain = contextshift.shift_context(blocks, budget=budget)
    assert reasons(result) == reasons(plain) and result.excluded != []
    [skipped] = result.diagnostics
    assert (skipped.event, skipped.tokens) == ("CLEAR_SKIPPED", possible)
    assert skipped.detail == (
        f"clearing would gain {possible} tokens, under clear_at_least {possible + 1}; truncating instead"
    )


def test_clear_at_least_reached_clears_until_that_much_is_gained() -> None:
    blocks = agent_loop(6)
    budget = sum(tokens(b) for b in blocks) - 10
    # One result would fit the budget; clear_at_least asks for the gain of two.
    options = {"clear_at_least": clear_gain(blocks[3]) + clear_gain(blocks[5])}
    result = contextshift.shift_context(blocks, budget=budget, strategy="clear-tool-results", options=options)
    _, sent, truncations = clearing_case(blocks, ["res0", "res1"])
    assert_cleared_exactly(result, blocks, sent, truncations)
    assert [d.event for d in result.diagnostics] == ["TOOL_RESULTS_CLEARED"]
    # Without it, the one result that suffices.
    least = contextshift.shift_context(blocks, budget=budget, strategy="clear-tool-results")
    assert [t.id for t in least.truncated] == ["res0"] and least.excluded == []


def test_clear_tool_results_goes_down_to_the_target_once_a_shift_is_needed() -> None:
    blocks = agent_loop(6)
    total = sum(map(tokens, blocks))
    budget = total - 10
    target = math.floor(0.8 * budget)
    # res1 is the one result that may be cleared: that fits the budget, not the target.
    options = {"keep_tool_uses": 4, "exclude_tools": ["search"], "target_ratio": 0.8}
    assert target < total - clear_gain(blocks[5]) <= budget
    result = contextshift.shift_context(blocks, budget=budget, strategy="clear-tool-results", options=options)
    assert result.prompt_tokens <= target
    # Truncate went on from the oldest group; the cleared result stays cleared.
    assert [(d.id, d.reason) for d in result.excluded] == [
        ("call0", "BUDGET_OLDEST_FIRST"),
        ("res0", "TOOL_GROUP"),
    ]
    assert [(t.id, t.how) for t in result.truncated] == [("res1", "TOOL_RESULT_CLEARED")]
    assert result.diagnostics[0].detail == "cleared 1 tool results"
    # Under the budget from the start, nothing is cleared or cut, whatever the target.
    fits = contextshift.shift_context(blocks, budget=total, strategy="clear-tool-results", options=options)
    assert fits.excluded == [] and fits.truncated == []


def test_clear_tool_results_in_anthropic_shape_on_the_json_route() -> None:
    blocks: list[dict[str, Any]] = [turn("task", "user", "go")]
    for n in range(5):
        blocks.append(
            {
                "id": f"use{n}",
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{n}", "name": "ls", "input": {"n": n}}],
            }
        )
        blocks.append(
            {
                "id": f"res{n}",
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"t{n}", "content": "file " * 150}],
            }
        )
    blocks.append(turn("now", "user", "next"))
    budget = sum(tokens(b) for b in blocks) - 150
    result = contextshift.shift_context(json.dumps(blocks), budget=budget, strategy="clear-tool-results")
    sent = json.loads(result.messages_json())
    assert sent[2]["content"][0]["content"].startswith("[tool result cleared:")
    assert sent[2]["content"][0]["tool_use_id"] == "t0"


# --- hysteresis and options ---------------------------------------------------------------------


def test_target_ratio_cuts_deeper_once_a_shift_is_needed() -> None:
    blocks = long_chat(10)
    total = sum(tokens(b) for b in blocks)
    budget = total - 10
    at_one = contextshift.shift_context(blocks, budget=budget)
    at_eight = contextshift.shift_context(blocks, budget=budget, options={"target_ratio": 0.8})
    assert at_eight.prompt_tokens <= 0.8 * budget < at_one.prompt_tokens <= budget
    # Under the budget, nothing is cut whatever the target.
    assert contextshift.shift_context(blocks, budget=total, options={"target_ratio": 0.5}).excluded == []


@pytest.mark.parametrize(
    ("strategy", "options", "field"),
    [
        ("nope", None, "strategy"),
        ("truncate", {"summary_max_tokens": 100}, "options.summary_max_tokens"),
        ("summarize", {"summary_max_tokens": "100"}, "options.summary_max_tokens"),
        ("summarize", {"summary_max_tokens": 1}, "options.summary_max_tokens"),
        ("truncate", {"target_ratio": 0}, "options.target_ratio"),
        ("truncate", {"target_ratio": 1.5}, "options.target_ratio"),
        ("vector-recall", {"query_embedding": [1, "x"]}, "options.query_embedding"),
        ("clear-tool-results", {"exclude_tools": "search"}, "options.exclude_tools"),
        ("clear-tool-results", {"keep_tool_uses": -1}, "options.keep_tool_uses"),
        ("truncate", {"plugin_timeout_ms": 0}, "options.plugin_timeout_ms"),
    ],
)
def test_unknown_strategies_and_bad_options_name_the_field(
    strategy: str, options: dict[str, Any] | None, field: str
) -> None:
    with pytest.raises(contextshift.InvalidOptions) as caught:
        contextshift.shift_context([turn("u", "user", "q")], budget=100, strategy=strategy, options=options)
    assert [v.field for v in caught.value.violations] == [field]


def test_built_in_strategies_are_listed_with_their_options() -> None:
    listed = {s.name: s for s in contextshift.list_strategies()}
    assert {"truncate", "summarize", "vector-recall", "manual", "clear-tool-results"} <= set(listed)
    assert [(o.name, o.kind, o.default) for o in listed["summarize"].options] == [
        ("summary_max_tokens", "int", 0)  # 0: the size follows the budget
    ]
    assert listed["drop-greetings"].builtin is False  # the sample plugin's, from its entry point
    assert all(s.builtin and s.description for name, s in listed.items() if name != "drop-greetings")

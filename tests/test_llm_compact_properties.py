"""Property tests: `llm-compact` against the fake LLM endpoint (tests/fake_llm.py) on generated
conversations keeps every promise of a strategy (test_properties.check_promises: protected blocks
kept, groups whole, within the budget, order and reasons), whether the LLM answers or fails; a
failure gives exactly truncate's plan."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator

import pytest
from conversations import Scenario, examples, scenarios
from fake_llm import FakeLlm
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_properties import STRATEGY_EXCLUDED_REASONS, as_json_text, check_promises, decisions, run_library

import contextshift


@pytest.fixture(scope="module")
def endpoint() -> Iterator[FakeLlm]:
    fake = FakeLlm()
    yield fake
    fake.close()


@settings(max_examples=examples(200))
@given(
    scenarios(),
    st.sampled_from(["good", "good", "error", "empty"]),
    st.sampled_from([1.0, 0.7]),
    st.integers(0, 5),
)
def test_llm_compact_keeps_the_promises(
    endpoint: FakeLlm, scenario: Scenario, mode: str, target_ratio: float, keep_recent: int
) -> None:
    try:
        plain = run_library(scenario, target_ratio=target_ratio)
    except (contextshift.InvalidInput, contextshift.TokenBudgetExceeded):
        return  # the engine's own errors; the reference tests cover them
    endpoint.mode = mode
    endpoint.requests.clear()
    options = {
        "target_ratio": target_ratio,
        "keep_recent": keep_recent,
        "compact_base_url": endpoint.url,
        "compact_model": "m",
    }
    snapshot = copy.deepcopy(scenario.blocks)
    # Where truncate fits, llm-compact fits: TokenBudgetExceeded here fails the test.
    result = run_library(scenario, strategy="llm-compact", **options)
    assert scenario.blocks == snapshot, "llm-compact modified its input"
    check_promises(scenario, result, excluded_reasons=STRATEGY_EXCLUDED_REASONS)

    called = len(endpoint.requests)
    assert called <= 1  # one attempt, never a retry
    events = [d.event for d in result.diagnostics]
    event(f"{mode}: {events[0] if events else 'nothing to compact'}")  # --hypothesis-show-statistics
    if result.summary is not None:
        assert mode == "good" and events == ["LLM_COMPACTED"]
        assert result.summary.tokens <= 512
        assert result.compaction_usage == contextshift.CompactionUsage("m", 321, 45)
        assert {d.reason for d in result.excluded} >= {"SUMMARIZED"}
    else:
        # Nothing compacted: exactly truncate's plan, and why when the LLM was asked.
        assert (decisions(result.kept), decisions(result.excluded)) == (
            decisions(plain.kept),
            decisions(plain.excluded),
        )
        assert events in ([], ["LLM_FALLBACK"], ["COMPACTION_SKIPPED"], ["SUMMARY_SKIPPED"])
        assert (events == ["LLM_FALLBACK"]) == (called == 1)

    text = as_json_text(scenario.blocks)
    if text is not None:  # the same plan on the JSON route
        from_json = run_library(scenario, text, strategy="llm-compact", **options)
        assert decisions(from_json.kept) == decisions(result.kept)
        assert json.loads(from_json.messages_json()) == json.loads(result.messages_json())

"""contextshift.profile_bench: corpora in every shape, the error figures, the bounds."""

from __future__ import annotations

import json

import pytest

import contextshift
from contextshift import profile_bench


def test_every_supported_shape_gives_its_messages() -> None:
    blocks = [
        {"id": "a", "role": "user", "content": "Hello there"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "get", "input": {"q": "x"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "done"}]},
    ]
    documents = [
        ("list.json", json.dumps(blocks).encode()),
        ("anthropic.json", json.dumps({"system": "Be brief.", "messages": blocks[:1]}).encode()),
        (
            "responses.json",
            json.dumps({"input": [{"type": "function_call_output", "output": "42"}]}).encode(),
        ),
        ("notes.txt", b"First paragraph.\n\nSecond one,\nover two lines.\n\n\n"),
    ]
    corpus = profile_bench.corpus(documents)
    assert corpus.documents == 4
    assert corpus.texts == [
        "Hello there",
        'get\n{"q": "x"}',  # ids and types are not text; a tool input is its JSON
        "done",
        "Be brief.",
        "Hello there",
        "42",
        "First paragraph.",
        "Second one,\nover two lines.",
    ]


def test_error_figures_on_known_counts() -> None:
    result = profile_bench.accuracy("h", "e", approx=[12, 8, 5, 7], exact=[10, 10, 0, 7])
    # Per message |error|: 0.2, 0.2, (no exact tokens: left out), 0.0.
    assert result.messages == 3
    assert result.mean_relative_error == pytest.approx(0.4 / 3)
    assert result.p95_relative_error == pytest.approx(0.2)
    assert result.total_drift == pytest.approx((32 - 27) / 27)


def test_the_sample_corpus_runs_every_loadable_profile() -> None:
    report = profile_bench.run(profile_bench.sample_corpus(), time_budget=1.0)
    measured = {t.profile for t in report.throughput}
    assert {"heuristic", "anthropic", "o200k_base", "cl100k_base", "qwen"} <= measured
    assert report.messages > 40 and report.bytes > 10_000
    for t in report.throughput:
        assert t.tokens > 0 and t.single_thread_mb_per_s > 0 and t.batch_mb_per_s > 0
    # The heuristic against every exact profile; anthropic has none of its family.
    references = {a.reference for a in report.accuracy if a.profile == "heuristic"}
    assert references == {t.profile for t in report.throughput if not t.approximate}
    assert not [a for a in report.accuracy if a.profile == "anthropic"]
    heuristic = next(t for t in report.throughput if t.profile == "heuristic")
    texts = profile_bench.sample_corpus().texts
    assert heuristic.tokens == sum(contextshift.count_tokens(texts))  # the counts are the library's


def test_profiles_may_be_models_and_unknown_names_are_named() -> None:
    corpus = profile_bench.corpus([("t.txt", b"some text to count")])
    report = profile_bench.run(corpus, ["gpt-4o", "heuristic"], time_budget=0.2)
    assert [t.profile for t in report.throughput] == ["o200k_base", "heuristic"]
    assert [(a.profile, a.reference) for a in report.accuracy] == [("heuristic", "o200k_base")]
    with pytest.raises(contextshift.InvalidOptions) as err:
        profile_bench.run(corpus, ["heuristic", "no-such-tokenizer"])
    assert [v.field for v in err.value.violations] == ["profiles[1]"]


def test_bounds() -> None:
    with pytest.raises(profile_bench.CorpusTooLarge):
        profile_bench.corpus([("a", b"x" * profile_bench.MAX_CORPUS_BYTES), ("b", b"y")])
    with pytest.raises(contextshift.InvalidInput):
        profile_bench.corpus([("empty.json", b"[]")])
    with pytest.raises(contextshift.InvalidInput) as err:
        profile_bench.corpus([("bin", b"\xff\xfe")])
    assert err.value.violations[0].field == "bin"

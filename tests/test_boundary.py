"""The Python/Rust boundary: every bad input becomes a specific, named error; a Rust panic
becomes InternalError (never a hang, never a BaseException a server would not answer)."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

import contextshift
from contextshift import _core, engine
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb


def fields(exc: contextshift.InvalidInput) -> list[str]:
    return [v.field for v in exc.violations]


def test_rust_panic_surfaces_as_internal_error() -> None:
    with pytest.raises(contextshift.InternalError, match="deliberate panic"):
        _core._panic_for_tests()
    # InternalError is an ordinary Exception, so `except Exception` in a server catches it.
    assert issubclass(contextshift.InternalError, Exception)


def test_blocks_must_be_a_list() -> None:
    with pytest.raises(contextshift.InvalidBlocks) as err:
        contextshift.shift_context({"role": "user"}, budget=10)  # type: ignore[arg-type]
    assert fields(err.value) == ["blocks"]


def test_tuples_are_lists() -> None:
    result = contextshift.shift_context(({"role": "user", "content": "hi"},), budget=100)
    assert [d.id for d in result.kept] == ["#0"]


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ({"role": "user", "content": {1, 2}}, "blocks[0].content"),
        ({"role": "user", "content": "a lone \ud800 surrogate"}, "blocks[0].content"),
        (
            {"role": "user", "content": [{"type": "text", "text": "😀 then \udc00"}]},
            "blocks[0].content[0].text",
        ),
        ({"role": "user", "relevance": math.inf}, "blocks[0].relevance"),
        ({"role": "user", "relevance": True}, "blocks[0].relevance"),
        ({"role": "user", "id": 7}, "blocks[0].id"),
        ({"role": "user", "id": ""}, "blocks[0].id"),
        ({"role": "tool", "meta": {"toolCallId": 5}}, "blocks[0].meta.toolCallId"),
        ({"role": "tool", "meta": []}, "blocks[0].meta"),
        ({"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}, "blocks[0].tool_calls[0].id"),
        ({"role": "assistant", "tool_calls": {}}, "blocks[0].tool_calls"),
        ({"role": "user", "content": [{"type": "text"}]}, "blocks[0].content[0].text"),
        ({"role": "user", "content": ["plain string part"]}, "blocks[0].content[0]"),
        ({"role": "user", "content": [{"type": "image_url", "width": -1}]}, "blocks[0].content[0].width"),
        ({"role": "user", "kind": "diary"}, "blocks[0].kind"),
        ({"content": "no role"}, "blocks[0].role"),
        ({"type": "function_call", "name": "f"}, "blocks[0].call_id"),
        (
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {"x": math.nan}}]},
            "blocks[0].content[0].input",
        ),
    ],
)
def test_each_bad_field_is_named(block: dict[str, Any], field: str) -> None:
    with pytest.raises(contextshift.InvalidBlocks) as err:
        contextshift.shift_context([{"role": "system", "content": "s"}, block], budget=1000)
    assert fields(err.value) == [field.replace("blocks[0]", "blocks[1]")]


def test_every_problem_of_a_request_is_reported_at_once() -> None:
    blocks = [
        {"id": "a", "role": "user"},
        {"id": "a", "role": "bot", "relevance": "high"},
        {"role": "user", "pinned": 1},
        {"id": "a", "role": "user"},
    ]
    with pytest.raises(contextshift.InvalidBlocks) as err:
        contextshift.shift_context(blocks, budget=100)
    assert fields(err.value) == [
        "blocks[1].id",
        "blocks[1].role",
        "blocks[1].relevance",
        "blocks[2].pinned",
        "blocks[3].id",
    ]
    assert "blocks[1].role: unknown role 'bot'" in str(err.value).replace('"', "'")


def test_deep_nesting_is_refused_not_a_crash() -> None:
    deep: Any = "leaf"
    for _ in range(5000):
        deep = {"x": deep}
    block = {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": deep}]}
    with pytest.raises(contextshift.InvalidBlocks, match="nested deeper"):
        contextshift.shift_context([block], budget=10_000)
    text = '[{"role": "user", "content": "hi", "meta": ' + "[" * 5000 + "]" * 5000 + "}]"
    with pytest.raises(contextshift.InvalidBlocks, match=r"blocks_json: .* nested deeper than 128 levels"):
        contextshift.shift_context(text, budget=10_000)


def test_non_string_keys_and_unknown_fields_are_ignored() -> None:
    block = {"role": "user", "content": "hi", 3: "x", "extra": object()}
    result = contextshift.shift_context([block], budget=100)
    assert result.messages == [block]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"budget": -1}, "budget"),
        ({"budget": 1.5}, "budget"),
        ({"budget": True}, "budget"),
        ({"budget": 2**70}, "budget"),
        ({"budget": contextshift.Budget(0)}, "budget.context_limit"),
        ({"budget": contextshift.Budget(1000, response_reserve=-5)}, "budget.response_reserve"),
        ({"budget": 10, "profile": "gpt-99"}, "profile"),
        ({"budget": 10, "strategy": "magic"}, "strategy"),
        ({"budget": 10, "options": {"max_block_chars": 10}}, "options.max_block_chars"),
        ({"budget": 10, "options": {"pinned_cap": 1.5}}, "options.pinned_cap"),
        ({"budget": 10, "options": {"start_on_user": "yes"}}, "options.start_on_user"),
        ({"budget": 10, "options": {"keep_everything": True}}, "options.keep_everything"),
    ],
)
def test_bad_options_are_named(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(contextshift.InvalidOptions) as err:
        contextshift.shift_context([{"role": "user", "content": "x"}], **kwargs)
    assert fields(err.value) == [field]
    assert isinstance(err.value, ValueError)


def test_budget_floor_is_applied_and_reported() -> None:
    result = contextshift.shift_context(
        [{"role": "user", "content": "x"}], budget=contextshift.Budget(10_000, response_reserve=9_000)
    )
    assert result.budget == 4000  # min(4000, 10_000 // 2), above 10_000 - 9_000
    assert result.warnings == [
        "budget floor applied: 1000 < min(4000, context_limit // 2) = 4000; using 4000"
    ]
    small = contextshift.shift_context(
        [{"role": "user", "content": "x"}], budget=contextshift.Budget(100, 90)
    )
    assert small.budget == 50


def test_token_budget_exceeded_carries_the_numbers() -> None:
    blocks = [{"role": "system", "content": "x" * 400}, {"role": "user", "content": "hi"}]
    with pytest.raises(contextshift.TokenBudgetExceeded) as err:
        contextshift.shift_context(blocks, budget=50)
    assert (err.value.code, err.value.protected_tokens, err.value.budget) == (
        "TOKEN_BUDGET_EXCEEDED",
        109,
        50,
    )


def test_count_tokens_items_and_errors() -> None:
    assert contextshift.count_tokens(
        ["", "abcd", "abcde", "日本語", {"role": "user", "content": "abcd"}]
    ) == [
        0,
        1,
        2,
        2,
        5,
    ]
    with pytest.raises(contextshift.InvalidBlocks) as err:
        contextshift.count_tokens(["ok", 5, {"role": "nobody"}])  # type: ignore[list-item]
    assert fields(err.value) == ["items[1]", "items[2].role"]
    with pytest.raises(contextshift.InvalidOptions):
        contextshift.count_tokens(["x"], profile="nope")


def test_block_decision_is_a_value() -> None:
    a = contextshift.BlockDecision("x", 3, "FITS")
    assert a == contextshift.BlockDecision("x", 3, "FITS")
    assert a != contextshift.BlockDecision("x", 4, "FITS")
    assert repr(a) == "BlockDecision(id='x', tokens=3, reason='FITS')"


def test_json_text_and_dicts_give_the_same_shift() -> None:
    blocks: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "x" * 300},
        {
            "role": "assistant",
            "content": "y" * 70_000,
            "tool_calls": [{"id": "c", "function": {"name": "f"}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "ok"}]},
        {"role": "user", "content": "now"},
    ]
    for budget in (30, 200, 20_000):
        from_dicts = contextshift.shift_context(blocks, budget=budget)
        for text in (json.dumps(blocks), json.dumps(blocks).encode()):
            from_json = contextshift.shift_context(text, budget=budget)
            assert from_json == from_dicts


def test_strs_of_every_width_are_read_as_their_json() -> None:
    # CPython keeps a str at 1, 2 or 4 bytes a character by its widest one (ASCII, Latin-1 past
    # ASCII, the BMP, beyond it): each reads from dicts as the same text from JSON, counted and
    # cut alike.
    texts = ["plain", "café crème " * 30, "snow ☃, “quoted” " * 30, "emoji 😀 and é " * 30, "ÿ", "☃" * 9]
    blocks: list[dict[str, Any]] = [
        {"id": f"b{i}", "role": "user", "content": t} for i, t in enumerate(texts)
    ]
    blocks.append({"id": "parts", "role": "user", "content": [{"type": "text", "text": t} for t in texts]})
    for options in (None, {"max_block_chars": 64}):
        for profile in ("heuristic", "o200k_base"):
            from_dicts = contextshift.shift_context(blocks, budget=10_000, profile=profile, options=options)
            text = json.dumps(blocks, ensure_ascii=False).encode()
            from_json = contextshift.shift_context(text, budget=10_000, profile=profile, options=options)
            assert from_dicts == from_json
            assert from_dicts.messages == from_json.messages
    cut = contextshift.shift_context(blocks, budget=10_000, options={"max_block_chars": 64})
    assert cut.messages[2]["content"] == texts[2][:53] + "[Truncated]"


@dataclasses.dataclass(frozen=True)
class Listed:
    kept_decisions: list[contextshift.BlockDecision]
    excluded_decisions: list[contextshift.BlockDecision]


def test_decisions_are_built_from_the_plan_and_compared() -> None:
    blocks = [
        {"role": "user", "content": "x" * 300},
        {"role": "assistant", "content": "y"},
        {"role": "user", "content": "now"},
    ]
    result = contextshift.shift_context(json.dumps(blocks), budget=30)
    assert [d.id for d in result.kept] == ["#2"] and [d.id for d in result.excluded] == ["#0", "#1"]
    # The core encodes the same decisions for a reply, in wire format.
    plan = result.decisions
    assert isinstance(plan, engine.Plan)
    encoded = pb.ContextPlan.FromString(
        plan.encode_decisions(pb.ContextPlan.KEPT_FIELD_NUMBER, pb.ContextPlan.EXCLUDED_FIELD_NUMBER)
    )
    for decoded, decided in ((encoded.kept, result.kept), (encoded.excluded, result.excluded)):
        assert [(d.id, d.tokens, d.reason) for d in decoded] == [(d.id, d.tokens, d.reason) for d in decided]
    # Results compare their decisions, whatever their source.
    assert dataclasses.replace(result, decisions=Listed(result.kept, result.excluded)) == result
    assert dataclasses.replace(result, decisions=Listed(result.kept, result.excluded[:1])) != result


def test_json_text_errors_are_named() -> None:
    with pytest.raises(contextshift.InvalidBlocks) as err:
        contextshift.shift_context('{"role": "user"}', budget=10)
    assert fields(err.value) == ["blocks_json"]
    with pytest.raises(contextshift.InvalidBlocks) as err:
        contextshift.shift_context('[{"role": "user"}, {"role": 3}]', budget=10)
    assert fields(err.value) == ["blocks[1].role"]


# Found by hand (issue #12): the JSON reader answered these with "a block is nested deeper than 128
# levels", and passed a block with a repeated key on as sent.
@pytest.mark.parametrize(
    ("text", "description"),
    [
        (
            r'[{"role":"user","content":"a\ud83db"}]',
            r"unpaired UTF-16 surrogate in a \u escape (JSON text must encode Unicode characters) "
            "at line 1 column 29",
        ),
        (
            '[{"role":"user","content":"x","relevance":1e999}]',
            "number out of range (beyond a 64-bit float) at line 1 column 43",
        ),
    ],
)
def test_json_text_errors_say_what_and_where(text: str, description: str) -> None:
    for given in (text, text.encode()):
        with pytest.raises(contextshift.InvalidBlocks) as err:
            contextshift.shift_context(given, budget=100)
        assert [(v.field, v.description) for v in err.value.violations] == [
            ("blocks_json", f"not a JSON array of blocks: {description}")
        ]


def test_repeated_key_in_json_text_is_refused_at_its_place() -> None:
    with pytest.raises(contextshift.InvalidBlocks) as err:
        contextshift.shift_context('[{"role":"user","role":"assistant","content":"x"}]', budget=100)
    [violation] = err.value.violations
    assert violation.field == "blocks[0].role"
    assert violation.description.startswith('duplicate key "role"')
    # Nested keys too, with the block's other errors, in block order.
    text = json.dumps([{"role": "user"}, {"role": "bot"}]).replace(
        '"role": "bot"', '"role": "bot", "content": [{"type": "text", "text": "a", "text": "b"}]'
    )
    with pytest.raises(contextshift.InvalidBlocks) as err:
        contextshift.shift_context(text, budget=100)
    assert fields(err.value) == ["blocks[1].content[0].text", "blocks[1].role"]


LAYOUT_FIELDS = ("ids", "roles", "kinds", "groups", "protection", "group_protected", "orphan")
LAYOUT_FIELDS += ("manual_excluded", "relevance", "calls", "result_ids")


def test_per_block_sequences_are_made_once_and_read_only() -> None:
    # Strategies index the layout, the counts and the plan in loops: a new list per read made
    # those loops quadratic (a 100k-block summarize took minutes). Each read is the same tuple.
    blocks = [{"role": "user", "content": f"turn {n}"} for n in range(4)]
    conversation = engine.Conversation(blocks, 50_000)
    layout = conversation.layout([], protect_current_input=True)
    counts = conversation.count("heuristic")
    plan = conversation.plan(counts, budget=10_000)
    sequences = [(layout, name) for name in LAYOUT_FIELDS]
    sequences += [(counts, "tokens"), (plan, "kept"), (plan, "excluded")]
    for owner, name in sequences:
        first = getattr(owner, name)
        assert isinstance(first, tuple) and getattr(owner, name) is first, name
    assert layout.ids == ("#0", "#1", "#2", "#3") and plan.kept == (0, 1, 2, 3)

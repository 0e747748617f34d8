"""Cache-stable shifts: a chat's next shift leaves out again what its last prompt left out while
that prompt's blocks are unchanged, cuts further only when over the budget, and plans afresh (and
says so) when the prefix changed. The server reads the previous prompt from the chat's last audit
(tests/integration/test_grpc_cache_stable.py)."""

from __future__ import annotations

from typing import Any

import contextshift
from contextshift.cache_stable import PreviousPrompt


def chat(turns: int) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"id": "sys", "role": "system", "content": "Be brief."}]
    for n in range(turns):
        blocks.append({"id": f"u{n}", "role": "user", "content": f"question {n} " + "word " * 20})
        blocks.append({"id": f"a{n}", "role": "assistant", "content": f"answer {n} " + "word " * 30})
    return blocks


def shift(
    blocks: list[dict[str, Any]], previous: PreviousPrompt | None = None, **options: Any
) -> contextshift.ShiftResult:
    return contextshift.shift_context(
        blocks, budget=300, options={"target_ratio": 0.8, **options}, previous=previous
    )


def excluded(result: contextshift.ShiftResult) -> list[str]:
    return [d.id for d in result.excluded]


def test_the_next_turn_keeps_the_cut_while_it_fits() -> None:
    blocks = [*chat(8), {"id": "now", "role": "user", "content": "and?"}]
    first = shift(blocks)
    assert first.excluded and first.prompt_tokens <= 0.8 * 300
    # The next turn: the answer and a new question appended, the whole history sent again.
    more = [
        *blocks,
        {"id": "a-now", "role": "assistant", "content": "short"},
        {"id": "next", "role": "user", "content": "ok"},
    ]
    stateless = shift(more)
    stable = shift(more, first.as_previous())
    # Without the previous prompt the shift re-plans: it keeps more of the old history, so the
    # prompt's prefix changes; with it, what went before goes again and the prefix holds.
    assert excluded(stateless) != excluded(first)
    assert excluded(stable)[: len(first.excluded)] == excluded(first)
    kept_before = [d.id for d in first.kept]
    assert [d.id for d in stable.kept][: len(kept_before)] == kept_before
    assert [(d.event, d.source) for d in stable.diagnostics] == [("CACHE_STABLE", "host")]
    assert stable.prompt_tokens <= 300


def prefix_changes(turns: int, carry: bool) -> int:
    """Turns whose prompt does not start with the previous turn's, over `turns` turns of the same
    size as the history's (about 90 tokens), budget 1000 and target_ratio 0.8."""
    blocks = chat(20)
    result = contextshift.shift_context(blocks, budget=1000, options={"target_ratio": 0.8})
    changes = 0
    for n in range(20, 20 + turns):
        blocks += chat(n + 1)[-2:]  # question n and answer n
        following = contextshift.shift_context(
            blocks,
            budget=1000,
            options={"target_ratio": 0.8},
            previous=result.as_previous() if carry else None,
        )
        before = [d.id for d in result.kept]
        changes += [d.id for d in following.kept][: len(before)] != before
        assert following.prompt_tokens <= 1000
        result = following
    return changes


def test_it_cuts_further_only_once_over_the_budget() -> None:
    # A cut goes down to 800 tokens, which leaves room for two turns before the next one; without
    # the previous prompt, the whole history is over the budget every turn, and every turn cuts.
    assert prefix_changes(24, carry=True) <= 9
    assert prefix_changes(24, carry=False) >= 22


def test_a_changed_prefix_plans_afresh_and_says_so() -> None:
    blocks = [*chat(8), {"id": "now", "role": "user", "content": "and?"}]
    first = shift(blocks)
    edited = [dict(b) for b in blocks]
    kept_id = first.kept[1].id
    next(b for b in edited if b["id"] == kept_id)["content"] = "an edited message " + "word " * 50
    again = shift(edited, first.as_previous())
    assert [d.event for d in again.diagnostics] == ["CACHE_STABLE_RESET"]
    assert again == shift(edited) or excluded(again) == excluded(shift(edited))


def test_a_prompt_that_left_nothing_out_carries_nothing() -> None:
    # So the server keeps such a prompt as the empty one (servicer._as_previous): its kept blocks
    # change no next shift, whether that shift's blocks still carry them or not.
    def outcome(result: contextshift.ShiftResult) -> Any:
        return (
            [(d.id, d.tokens) for d in result.kept],
            [(d.id, d.reason) for d in result.excluded],
            [(d.event, d.source) for d in result.diagnostics],
            result.prompt_tokens,
        )

    blocks = chat(2)
    first = shift(blocks)
    assert not first.excluded and first.as_previous().kept
    edited = [dict(b) for b in blocks]
    edited[1]["content"] = "an edited question " + "word " * 40
    for turn in (blocks, [*chat(8), {"id": "now", "role": "user", "content": "and?"}], edited):
        assert outcome(shift(turn, first.as_previous())) == outcome(shift(turn, PreviousPrompt()))


def test_a_block_protected_since_stays_and_the_option_turns_it_off() -> None:
    blocks = [*chat(8), {"id": "now", "role": "user", "content": "and?"}]
    first = shift(blocks)
    gone = first.excluded[-1].id
    pinned = [dict(b, pinned=True) if b["id"] == gone else b for b in blocks]
    assert gone in [d.id for d in shift(pinned, first.as_previous()).kept]
    off = shift(
        [*blocks, {"id": "x", "role": "assistant", "content": "y"}], first.as_previous(), cache_stable=False
    )
    assert off.diagnostics == []


def test_summaries_are_made_again_over_the_carried_blocks() -> None:
    blocks = [*chat(10), {"id": "now", "role": "user", "content": "and?"}]
    first = contextshift.shift_context(blocks, budget=400, strategy="summarize")
    assert first.summary is not None
    following = contextshift.shift_context(
        [*blocks, {"id": "next", "role": "user", "content": "ok"}],
        budget=400,
        strategy="summarize",
        previous=first.as_previous(),
    )
    assert following.summary is not None
    assert {d.reason for d in following.excluded} == {"SUMMARIZED"}
    assert following.summary.summarized >= first.summary.summarized

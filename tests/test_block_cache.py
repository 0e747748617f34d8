"""The block cache (blocks read from JSON, found again by their text): a shift through it is the
shift without it, however the history was sent before, and a bad block is refused the same way."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cache_checks
import pytest
from cache_checks import fresh_cache  # noqa: F401 (autouse)
from conversations import conversations, examples
from hypothesis import given, settings
from hypothesis import strategies as st

import contextshift
from contextshift import profiles

Block = dict[str, Any]


def shift(blocks: list[Block], budget: int) -> tuple[contextshift.ShiftResult, bytes]:
    result = contextshift.shift_context(json.dumps(blocks).encode(), budget=budget)
    return result, result.messages_json_bytes()


uncached = cache_checks.uncached(shift)


@given(conversations(), st.integers(0, 400), st.sampled_from(["hi", "and now?"]))
@settings(max_examples=examples(60), deadline=None)
def test_a_shift_through_the_cache_is_the_shift_without_it(
    blocks: list[Block], budget: int, said: str
) -> None:
    turn = [*blocks, {"id": "next", "role": "user", "content": said}]
    # Both taken first: turning the cache off drops what it holds.
    try:
        expected, expected_turn = uncached(blocks, budget), uncached(turn, budget)
    except contextshift.TokenBudgetExceeded:
        return
    assert shift(blocks, budget) == expected  # read, and stored
    assert shift(blocks, budget) == expected  # found
    assert shift(turn, budget) == expected_turn  # the history found, the new block read


def test_an_agent_loop_reads_only_what_is_new() -> None:
    history: list[Block] = [{"id": "sys", "role": "system", "content": "You fix bugs."}]
    history += [
        {"id": f"m{i}", "role": ["user", "assistant"][i % 2], "content": f"step {i}"} for i in range(40)
    ]
    shift(history, 10_000)
    before = profiles.block_cache_stats()
    history.append({"id": "m40", "role": "user", "content": "and the tests?"})
    shift(history, 10_000)
    after = profiles.block_cache_stats()
    # The 41 blocks of the previous request's bytes taken as they were read (hits, no lookup),
    # the new one looked up (a miss) and read.
    assert (after.hits - before.hits, after.misses - before.misses) == (41, 1)
    assert after.entries == 42
    # The same request again (a retry): every block taken, nothing looked up nor read.
    shift(history, 10_000)
    again = profiles.block_cache_stats()
    assert (again.hits - after.hits, again.misses - after.misses, again.entries) == (42, 0, 42)


def test_a_bad_block_among_found_ones_is_refused_as_without_the_cache() -> None:
    history: list[Block] = [{"id": f"m{i}", "role": "user", "content": f"turn {i}"} for i in range(12)]
    bad = [
        {"id": "m3", "role": "user", "content": "again"},
        {"id": "m11", "role": "user", "content": "the last one again"},
        {"id": "x", "role": "nobody", "content": "?"},
    ]
    cache_checks.refused_alike(shift, history, bad)


def test_bytes_not_utf8_after_a_resent_history_are_refused_as_without_the_cache() -> None:
    history: list[Block] = [{"id": f"m{i}", "role": "user", "content": f"turn {i} é"} for i in range(12)]
    text = json.dumps(history, ensure_ascii=False).encode()
    contextshift.shift_context(text, budget=1000)  # now a recent request
    # Its bytes, then a block whose text is not UTF-8: only that part is checked, and the error
    # names the byte in the whole text.
    bad = text[:-1] + b', {"id": "x", "role": "user", "content": "\xc3("}]'
    errors = []
    for bound in (profiles.block_cache_stats().capacity_bytes, 0):
        profiles.configure_block_cache(bound)
        contextshift.shift_context(text, budget=1000)
        with pytest.raises(contextshift.InvalidBlocks) as err:
            contextshift.shift_context(bad, budget=1000)
        errors.append([(v.field, v.description) for v in err.value.violations])
    assert errors[0] == errors[1]
    assert errors[0][0][0] == "blocks_json" and "not UTF-8" in errors[0][0][1]
    assert str(len(text) - 1 + len(b', {"id": "x", "role": "user", "content": "')) in errors[0][0][1]


def test_chats_shifted_on_many_threads_at_once_are_shifted_as_without_the_cache() -> None:
    # Eight chats sharing their opening (the recent requests' candidates), each resent a turn longer
    # from four threads at once: every shift is the shift with the cache off.
    opening: list[Block] = [
        {"id": "sys", "role": "system", "content": "You are terse."},
        {"id": "hello", "role": "user", "content": "hello"},
    ]
    chats = [
        [
            *opening,
            *({"id": f"c{c}m{i}", "role": "assistant", "content": f"chat {c} turn {i}"} for i in range(30)),
        ]
        for c in range(8)
    ]
    requests = [(chat[:n], 60) for chat in chats for n in range(20, 33, 3)]
    expected = [uncached(blocks, budget) for blocks, budget in requests]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda request: shift(*request), requests * 3))
    assert got == expected * 3

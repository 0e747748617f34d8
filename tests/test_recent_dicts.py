"""Recent requests read from dicts (the same objects sent again, as an agent loop keeps its
messages): a shift that takes blocks read before is the shift without them, whatever changed in
place since, and the objects held for it are let go when the caches are cleared."""

from __future__ import annotations

import copy
import sys
import uuid
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


def shift(blocks: list[Block], budget: int) -> tuple[contextshift.ShiftResult, list[Any]]:
    result = contextshift.shift_context(blocks, budget=budget, profile="o200k_base")
    return result, copy.deepcopy(result.messages)


uncached = cache_checks.uncached(shift)


def expected(blocks: list[Block], budget: int) -> object:
    """The shift without kept requests, or the error it raises. (It drops the kept requests: take
    every expected result before the shifts it is compared with.)"""
    try:
        return uncached(blocks, budget)
    except contextshift.TokenBudgetExceeded as err:
        return type(err)


def got(blocks: list[Block], budget: int) -> object:
    try:
        return shift(blocks, budget)
    except contextshift.TokenBudgetExceeded as err:
        return type(err)


def _edit(blocks: list[Block], at: int) -> None:
    """Changes block `at` in place, as a caller editing its history would: its text or, without
    text, a new field."""
    block = blocks[at]
    if isinstance(block.get("content"), str):
        block["content"] += " (edited)"
    elif isinstance(block.get("content"), list) and block["content"]:
        block["content"].pop()
    else:
        block["name"] = "editor"


@given(conversations(), st.integers(0, 400), st.data())
@settings(max_examples=examples(60), deadline=None)
def test_a_shift_of_objects_sent_again_is_the_shift_without_them(
    blocks: list[Block], budget: int, data: st.DataObject
) -> None:
    turn = [*blocks, {"id": "next", "role": "user", "content": "and now?"}]
    at = data.draw(st.integers(0, len(turn) - 1))
    edited = copy.deepcopy(turn)
    _edit(edited, at)
    # Each request as it will be sent: its history, once more, a turn longer, a block changed in
    # place (read again from there), that block taken out.
    requests = [blocks, turn, edited, [*edited[:at], *edited[at + 1 :]]]
    wanted = [expected(request, budget) for request in requests]
    assert got(blocks, budget) == wanted[0]  # read, and noted
    assert got(blocks, budget) == wanted[0]  # sent again: read, and kept
    assert got(blocks, budget) == wanted[0]  # taken whole
    assert got(turn, budget) == wanted[1]  # the history taken, the new block read
    _edit(turn, at)
    assert got(turn, budget) == wanted[2]
    assert got([*turn[:at], *turn[at + 1 :]], budget) == wanted[3]


def test_a_value_changed_deep_in_a_block_is_read_again() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "grep", "arguments": '{"q": "a"}'}}
    blocks: list[Block] = [
        {"id": "sys", "role": "system", "content": "You search."},
        {"id": "ask", "role": "assistant", "content": "", "tool_calls": [call]},
        {"id": "out", "role": "tool", "tool_call_id": "call_1", "content": "found it"},
    ]
    first = shift(blocks, 1000)
    call["function"]["arguments"] = '{"q": "' + "many words " * 40 + '"}'
    assert shift(blocks, 1000) == uncached(blocks, 1000) != first
    call["id"] = "call_2"  # now an orphan result, and a call without its result
    assert shift(blocks, 1000) == uncached(blocks, 1000)


def test_a_bad_block_after_a_history_sent_again_is_refused_as_without_it() -> None:
    history: list[Block] = [{"id": f"m{i}", "role": "user", "content": f"turn {i}"} for i in range(12)]
    bad = [
        {"id": "m3", "role": "user", "content": "again"},
        {"id": "m11", "role": "user", "content": "the last one again"},
        {"id": "x", "role": "nobody", "content": "?"},
        {"id": "y", "role": "user", "content": object()},
    ]
    cache_checks.refused_alike(shift, history, bad, sends=2)  # sent again: kept
    assert shift(history, 1000) == uncached(history, 1000)


def test_a_bad_block_in_place_of_kept_ones_leaves_nothing_behind() -> None:
    history: list[Block] = [{"id": f"m{i}", "role": "user", "content": f"turn {i}"} for i in range(12)]
    bad: Block = {"id": "x", "role": "nobody", "content": "?"}
    turn = [*history, {"id": "next", "role": "user", "content": "and now?"}]
    wanted = [expected(history, 1000), expected(turn, 1000)]
    with pytest.raises(contextshift.InvalidBlocks) as without:
        uncached([*history[:8], bad], 1000)
    shift(history, 1000)
    held = shift(history, 1000)  # kept; its result (sharing the kept blocks) held on
    # Most of the kept request taken, then a bad block where its ninth was: refused as without it.
    with pytest.raises(contextshift.InvalidBlocks) as err:
        shift([*history[:8], bad], 1000)
    assert [(v.field, v.description) for v in err.value.violations] == [
        (v.field, v.description) for v in without.value.violations
    ]
    # Nothing of it left behind, and the result held unchanged by the shifts after it.
    assert got(history, 1000) == wanted[0]
    assert got(history, 1000) == wanted[0]
    assert got(turn, 1000) == wanted[1]
    assert held == wanted[0]


class Note(str):
    """A str subclass: it may carry state of its own, so it is never taken as read before."""


class Message(dict[str, Any]):
    pass


def test_subclasses_are_read_every_time() -> None:
    blocks: list[Block] = [
        Message(id="a", role="user", content="hello"),
        {"id": "b", "role": "assistant", "content": Note("hi there")},
    ]
    assert shift(blocks, 1000) == uncached(blocks, 1000)
    blocks[0]["content"] = "hello, and a much longer question than before " * 5
    assert shift(blocks, 1000) == uncached(blocks, 1000)


def test_a_request_whose_counts_are_known_is_kept_once_sent_again() -> None:
    text = f"a text nobody else holds {uuid.uuid4()}"  # (never counted before)
    contextshift.count_tokens([text], "o200k_base")  # its count known, as after an earlier call
    blocks: list[Block] = [{"id": "a", "role": "user", "content": text}]
    before = sys.getrefcount(text)
    shift(blocks, 1000)
    assert sys.getrefcount(text) == before  # a request seen once: its text not held
    shift(blocks, 1000)
    assert sys.getrefcount(text) == before + 1  # sent again: held by the request kept


def test_a_request_counted_now_is_kept_at_once() -> None:
    # The call counts its blocks with the tokenizer: recording its objects is a small part of it,
    # and its second sight (a loop's next turn) reads none of them again.
    text = f"a text nobody else holds {uuid.uuid4()}"  # (never counted before)
    blocks: list[Block] = [{"id": "a", "role": "user", "content": text}]
    before = sys.getrefcount(text)
    shift(blocks, 1000)
    assert sys.getrefcount(text) == before + 1  # kept after its first sight
    again = shift(blocks, 1000)
    contextshift.shift_context(blocks, budget=1000, profile="heuristic")  # the same request
    assert again == uncached(blocks, 1000)  # which lets the kept request go
    del again
    assert sys.getrefcount(text) == before


def test_held_objects_are_let_go_when_the_caches_are_cleared() -> None:
    text = f"a text nobody else holds {uuid.uuid4()}"  # (never counted before)
    blocks: list[Block] = [{"id": "a", "role": "user", "content": text}]
    before = sys.getrefcount(text)
    shift(blocks, 1000)
    assert sys.getrefcount(text) == before + 1  # counted now: kept at once
    profiles.clear_cache()  # its blocks hold counts: kept requests go with them
    assert sys.getrefcount(text) == before
    shift(blocks, 1000)
    profiles.configure_block_cache(profiles.block_cache_stats().capacity_bytes)
    assert sys.getrefcount(text) == before
    profiles.configure_block_cache(0)
    shift(blocks, 1000)
    shift(blocks, 1000)
    assert sys.getrefcount(text) == before  # nothing kept with the cache off


def test_messages_built_anew_every_time_are_not_held() -> None:
    text = "".join(["a text in every request ", str(id(object()))])
    system = {"id": "sys", "role": "system", "content": "the same object every time"}
    # Their counts known, as a backend's are after its first call.
    contextshift.count_tokens([text, system["content"]], "o200k_base")
    before = sys.getrefcount(text)
    for turn in range(4):
        # A backend's messages from its store: new dicts each time, after a constant opening.
        history = [{"id": f"m{i}", "role": "user", "content": text} for i in range(turn + 2)]
        assert shift([system, *history], 1000) == uncached([system, *history], 1000)
    del history
    assert sys.getrefcount(text) == before


def test_chats_shifted_on_many_threads_at_once_are_shifted_as_without_it() -> None:
    chats = [
        [
            {"id": "sys", "role": "system", "content": "You are terse."},
            *({"id": f"c{c}m{i}", "role": "assistant", "content": f"chat {c} turn {i}"} for i in range(30)),
        ]
        for c in range(12)  # more chats than requests kept
    ]
    requests = [(chat[:n], 60) for chat in chats for n in range(20, 32, 3)]
    expected = [uncached(blocks, budget) for blocks, budget in requests]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda request: shift(*request), requests * 3))
    assert got == expected * 3

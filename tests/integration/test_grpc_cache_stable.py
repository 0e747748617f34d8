"""Cache-stable shifts through the server: a chat's next ShiftContext reads the chat's last audit
and leaves out again what it left out, so a backend resending its whole history keeps the
provider's cached prefix; `cache_stable: false` turns it off; PreviewContext reads it too and
writes nothing."""

from __future__ import annotations

from test_cache_stable import chat

import contextshift
from contextshift import cache_stable
from contextshift.cache_stable import PreviousPrompt

from .conftest import ServerProcess


def test_the_chats_last_audit_keeps_the_cut(server: ServerProcess) -> None:
    options = {"target_ratio": 0.8}
    with contextshift.Client(server.address) as client:
        first = client.shift_context(chat(20), budget=1000, chat_id="stable-chat", options=options)
        assert first.excluded and [d.event for d in first.diagnostics] == []
        # A second chat whose last audit holds the same cut, for the shift with the option off.
        twin = client.shift_context(chat(20), budget=1000, chat_id="stable-chat-off", options=options)
        assert [d.id for d in twin.excluded] == [d.id for d in first.excluded]
        following = chat(21)
        previewed = client.preview_context(following, budget=1000, chat_id="stable-chat", options=options)
        shifted = client.shift_context(following, budget=1000, chat_id="stable-chat", options=options)
        plain = client.shift_context(
            following, budget=1000, chat_id="stable-chat-off", options={**options, "cache_stable": False}
        )
        stateless = client.shift_context(following, budget=1000, options=options)  # no chat, no audit
    # The next turn starts with the same prompt; a stateless shift would cut more of the front.
    assert [d.id for d in shifted.kept][: len(first.kept)] == [d.id for d in first.kept]
    assert [d.event for d in shifted.diagnostics] == ["CACHE_STABLE"]
    assert previewed.kept == shifted.kept and previewed.excluded == shifted.excluded
    # Off, the chat's last audit is not read: the cut is the stateless one, not the kept prefix.
    assert [d.id for d in plain.kept] == [d.id for d in stateless.kept] != [d.id for d in shifted.kept]
    assert [d.id for d in plain.kept][: len(first.kept)] != [d.id for d in first.kept]
    assert plain.diagnostics == []


def test_a_chats_shifts_leave_headroom_by_default(server: ServerProcess) -> None:
    """With a chat_id (cache-stable) and no target_ratio, a shift that must cut goes down to
    cache_stable.TARGET_RATIO of the budget, from the chat's first shift on, so the next turns grow
    on the same prefix; the library does the same given a previous prompt (an empty one: the
    first turn); a target_ratio given, or cache_stable off, is 1.0 as before."""
    blocks = chat(20)
    with contextshift.Client(server.address) as client:
        chatty = client.shift_context(blocks, budget=1000, chat_id="headroom-chat")
        previewed = client.preview_context(blocks, budget=1000, chat_id="headroom-preview")
        given = client.shift_context(
            blocks, budget=1000, chat_id="headroom-given", options={"target_ratio": 1.0}
        )
        off = client.shift_context(
            blocks, budget=1000, chat_id="headroom-off", options={"cache_stable": False}
        )
        stateless = client.shift_context(blocks, budget=1000)
    assert chatty.prompt_tokens <= cache_stable.TARGET_RATIO * 1000 < stateless.prompt_tokens <= 1000
    assert previewed.kept == chatty.kept
    library = contextshift.shift_context(blocks, budget=1000, previous=PreviousPrompt())
    assert library.kept == chatty.kept
    assert given.kept == off.kept == stateless.kept == contextshift.shift_context(blocks, budget=1000).kept

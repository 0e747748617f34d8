"""The contenders of the shift benchmark besides contextshift: the pure-Python reference
(tests/reference) and LangChain's `trim_messages`, given the same conversations and the same
counting rule.

`trim_messages` gets `strategy="last"`, `start_on="human"`, `include_system=True`, the same budget,
and a `token_counter` that applies the `heuristic` profile's rule to each message it is given (4 +
text tokens of the content + text tokens of each tool call's name and JSON arguments; docs/
semantics.md §2), written in Python as a LangChain user would write it. It is checked to give the
library's total on the whole conversation. `trim_messages` asks for counts of growing prefixes
(binary search), so it counts about log2(n) times n messages; contextshift counts each once and
twice for the recount. A counter that looks the counts up instead (`lookup_counter`) is the contender
of the cached-count shifts: given the same `o200k_base` counts and budget, LangChain does no counting
at all, as a caller who caches counts would run it; `trim_by_content` looks them up by each
message's content first, for messages built anew each call.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    trim_messages,
)

from tests.reference.shift import json_text, text_tokens

TokenCounter = Callable[[list[BaseMessage]], int]


def langchain_messages(blocks: Sequence[dict[str, Any]]) -> list[BaseMessage]:
    """The generated conversation (benchmarks/conversation.py: OpenAI Chat shapes) as LangChain
    messages. Lorebook entries are system blocks there; for LangChain they are system messages too."""
    messages: list[BaseMessage] = []
    for block in blocks:
        content, role = block.get("content", ""), block["role"]
        if role == "system":
            messages.append(SystemMessage(content, id=block["id"]))
        elif role == "user":
            messages.append(HumanMessage(content, id=block["id"]))
        elif role == "assistant":
            calls = [
                {"id": c["id"], "name": c["function"]["name"], "args": json.loads(c["function"]["arguments"])}
                for c in block.get("tool_calls", [])
            ]
            messages.append(AIMessage(content, id=block["id"], tool_calls=calls))
        else:
            messages.append(ToolMessage(content, id=block["id"], tool_call_id=block["tool_call_id"]))
    return messages


def heuristic_counter(messages: list[BaseMessage]) -> int:
    """The heuristic profile's rule over LangChain messages (string content, as generated)."""
    total = 0
    for message in messages:
        total += 4 + text_tokens(str(message.content))
        for call in getattr(message, "tool_calls", ()):
            total += text_tokens(call["name"]) + text_tokens(json_text(call["args"]))
    return total


def lookup_counter(messages: list[BaseMessage], counts: Sequence[int]) -> TokenCounter:
    """A counter that looks each message's count up (by identity) instead of counting."""
    by_message = {id(m): c for m, c in zip(messages, counts, strict=True)}
    return lambda batch: sum(by_message[id(m)] for m in batch)


ContentCounts = dict[tuple[str, str | None, Any], int]


def counts_by_content(messages: list[BaseMessage], counts: Sequence[int]) -> ContentCounts:
    """Counts by what each message says (its type, id and content): what a caller whose messages
    are built anew each time (read from a store) can look them up by, no object being the one
    counted before."""
    return {(m.type, m.id, m.content): c for m, c in zip(messages, counts, strict=True)}


def trim_by_content(messages: list[BaseMessage], budget: int, by_content: ContentCounts) -> list[BaseMessage]:
    """`trim` of messages built anew, each one's count looked up by content once (its text
    hashed), then by identity for trim_messages' many prefix counts."""
    counts = [by_content[(m.type, m.id, m.content)] for m in messages]
    return trim(messages, budget, lookup_counter(messages, counts))


def trim(messages: list[BaseMessage], budget: int, counter: TokenCounter) -> list[BaseMessage]:
    return trim_messages(
        messages,
        max_tokens=budget,
        token_counter=counter,
        strategy="last",
        start_on="human",
        include_system=True,
    )

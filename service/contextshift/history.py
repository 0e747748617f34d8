"""A chat's stored history (AppendBlocks) joined with a request's blocks, as one JSON array.

Stored blocks are their own JSON text, so a shift splices them, byte for byte, in front of the
request's blocks (its `blocks_json` text, or its typed blocks as JSON), and the engine parses the
whole once; the stored tokens of each block under the profile come along as known counts. Errors
name a request block by its index in the request (`blocks[0]`), a stored one as `history[i]`.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from contextshift import engine
from contextshift.errors import FieldViolation, InvalidInput

# Blocks are stored whole: a shift's char cap cuts them (and counts the cut ones afresh).
NO_CHAR_CAP = sys.maxsize
_BLOCK_INDEX = re.compile(r"^blocks\[(\d+)\]")


@dataclass(frozen=True)
class HistoryBlock:
    """A block of a chat's stored history: its JSON text, and its tokens under the profile asked
    for (None: not counted under it yet)."""

    json: str
    tokens: int | None = None


@dataclass(frozen=True)
class Joined:
    """The history and the request's blocks as one JSON array, with the known tokens per block."""

    json: bytes
    known_tokens: list[int | None]
    stored: int  # blocks from the history, first
    warnings: list[str]


def request_texts(blocks_json: bytes) -> list[str]:
    """Each block of a request's JSON array as its own text (InvalidBlocks naming `blocks[i]` or
    `blocks_json` when it does not parse)."""
    conversation = engine.Conversation.from_json(blocks_json, NO_CHAR_CAP)
    return conversation.json_texts(list(range(len(conversation))))


def typed_texts(blocks: Sequence[dict[str, Any]]) -> list[str]:
    return [json.dumps(block, ensure_ascii=False) for block in blocks]


def _is_user(text: str) -> bool:
    block = json.loads(text)
    return isinstance(block, dict) and block.get("role") == "user"


def _array_items(blocks_json: bytes) -> str | None:
    """The text between the brackets of a JSON array (None when the text is not one, or not
    UTF-8)."""
    try:
        text = blocks_json.decode().strip()
    except UnicodeDecodeError:
        return None
    return text[1:-1].strip() if text.startswith("[") and text.endswith("]") else None


def _without_repeat(last: str, items: str) -> tuple[str, bool]:
    """`items` without a first item equal to `last` (the repeated current input)."""
    try:
        first, end = json.JSONDecoder().raw_decode(items)
    except ValueError:
        return items, False  # the engine reports what is wrong with it
    if first != json.loads(last):
        return items, False
    rest = items[end:].lstrip()
    return rest.removeprefix(",").lstrip(), True


def join(history: Sequence[HistoryBlock], new: Sequence[str] | bytes) -> Joined:
    """The history, then the new blocks (their texts, or a request's JSON array spliced as it
    came); a first new block that repeats the history's last user block (the same JSON value) is
    dropped, with a warning. The known tokens are the history's; the engine counts the rest."""
    if isinstance(new, bytes):
        items = _array_items(new)
        if items is None:
            request_texts(new)  # raises what is wrong with it
            raise AssertionError("not reached: a JSON array that is not one")
    else:
        items = ",".join(new)
    repeated = False
    if history and items and _is_user(history[-1].json):
        items, repeated = _without_repeat(history[-1].json, items)
    warnings = ["blocks[0] repeats the stored history's last user block; the request's copy was dropped"]
    text = "[" + ",".join([*(b.json for b in history), *([items] if items else [])]) + "]"
    return Joined(text.encode(), [b.tokens for b in history], len(history), warnings if repeated else [])


def renamed(
    error: InvalidInput, stored: int, rename: Callable[[str], str] = lambda field: field
) -> InvalidInput:
    """An error over joined blocks, naming request blocks by their index in the request (then
    `rename`d, for typed blocks) and stored ones as `history[i]`."""

    def field(name: str) -> str:
        match = _BLOCK_INDEX.match(name)
        if match is None:
            return name
        index = int(match.group(1))
        rest = name[match.end() :]
        return rename(f"blocks[{index - stored}]{rest}") if index >= stored else f"history[{index}]{rest}"

    return type(error)([FieldViolation(field(v.field), v.description) for v in error.violations])


def appended(
    history: Sequence[HistoryBlock],
    new: Sequence[str],
    profile: str,
    rename: Callable[[str], str] | None = None,
) -> list[HistoryBlock]:
    """The new blocks as AppendBlocks stores them, checked with the history (ids unique over the
    whole chat; errors `rename`d as in `renamed`) and counted under `profile`, reusing the
    history's known counts."""
    text = "[" + ",".join([*(b.json for b in history), *new]) + "]"
    try:
        conversation = engine.Conversation.from_json(text, NO_CHAR_CAP)
    except InvalidInput as e:
        raise renamed(e, len(history), rename or (lambda field: field)) from e
    counts = conversation.count(profile, [b.tokens for b in history])
    return [HistoryBlock(t, tokens) for t, tokens in zip(new, counts.tokens[len(history) :], strict=True)]

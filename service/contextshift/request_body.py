"""Blocks from a file or a request body, by one rule for every reader of them (`contextshift
preview` and `count`, `bench-profiles` and the BenchmarkProfiles RPC): a JSON list of blocks, or an
object holding one: `blocks`; `messages` (OpenAI Chat, Anthropic, whose top-level `system` string
becomes a system block first); `input` (OpenAI Responses). An object with a repeated key is
refused, as the core's reader of `blocks_json` refuses it: `json` would keep the key's last value,
where a provider's parser may read another."""

from __future__ import annotations

import json
from typing import Any

_HOLDERS = ("blocks", "messages", "input")


class RepeatedKey(ValueError):
    """A JSON object with a key twice."""


def _distinct_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise RepeatedKey(f"duplicate key {key!r} in a JSON object")
        seen[key] = value
    return seen


def parse_json(text: str | bytes) -> Any:
    """JSON text's value; ValueError when it is not JSON (UnicodeDecodeError for bytes that are not
    text), RepeatedKey when an object repeats a key."""
    return json.loads(text, object_pairs_hook=_distinct_keys)


def blocks_in(data: Any) -> list[Any] | None:
    """The blocks `data` is or holds (see the module's doc), or None when it holds none."""
    if isinstance(data, list):
        return data
    if not isinstance(data, dict):
        return None
    for key in _HOLDERS:
        if isinstance(data.get(key), list):
            blocks: list[Any] = list(data[key])
            if key == "messages" and isinstance(data.get("system"), str):
                blocks.insert(0, {"role": "system", "content": data["system"]})
            return blocks
    return None

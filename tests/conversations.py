"""Hypothesis strategies for realistic conversations, in the JSON shapes callers already have.

A conversation mixes OpenAI Chat Completions, OpenAI Responses items, Anthropic Messages and
Vercel AI SDK parts, the way a real backend's history does after a few provider switches:
system prompts (several, also in the middle), character/persona/lorebook/memory blocks,
user/assistant turns, parallel tool calls whose results arrive later and out of order under
different id spellings, orphan results, flags, images, empty content, non-ASCII text and long
blocks. Budgets range from 0 to ample.
"""

# ruff: noqa: RUF001  (the look-alike characters in the sample texts are the point)

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from reference.shift import analyze, json_text, parse_block

Block = dict[str, Any]


def examples(count: int) -> int:
    """Per-test ``max_examples``, scaled tenfold under HYPOTHESIS_PROFILE=thorough."""
    return count * (10 if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else 1)


BudgetSpec = int | tuple[int, int, int]

# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------

PHRASES = [
    "Hello!",
    "Can you help me plan a trip to Kyoto next spring?",
    "Sure. What is your budget?",
    "Summarise the last meeting notes, please.",
    "東京の天気はどうですか？",
    "我想了解一下这个项目的进展。",
    "안녕하세요, 반갑습니다.",
    "Привет, как дела?",
    "مرحبا بك",
    "Great 👍 thanks! 🎉🎉",
    "👨‍👩‍👧‍👦 family emoji and flags 🇯🇵🇫🇷",
    "naïve café résumé — “quotes” and ‘apostrophes’",
    'The function returned: {"ok": true, "items": [1, 2, 3]}',
    "```python\nprint('hi')\n```",
    "Line one\nLine two\r\n\tTabbed",
    "e\u0301 combining accent, zero\u200bwidth",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 mathematical letters 𝟙𝟚𝟛",
    "",
]

_CHARS = st.one_of(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF),
    st.sampled_from(("😀", "🙂", "🎉", "👍", "🚀", "\u200d", "\n", "\t", "é", "ß", "€", "\U0001f1ef")),
    st.characters(codec="utf-8"),  # anything but surrogates (not valid UTF-8)
)


SHORT_TEXTS = st.one_of(st.sampled_from(PHRASES), st.text(_CHARS, max_size=40))
_LONG_SNIPPETS = st.sampled_from([phrase + " " for phrase in PHRASES[:-1]])


@st.composite
def _texts(draw: st.DrawFn) -> str:
    """Mostly short text; sometimes long enough to trip a small ``max_block_chars``."""
    text = draw(SHORT_TEXTS)
    if draw(st.integers(0, 9)) == 0:
        text += draw(_LONG_SNIPPETS) * draw(st.integers(2, 120))
    return text


TEXTS = _texts()

# JSON values without floats (their text differs between languages).
_JSON_KEYS = st.one_of(
    st.sampled_from(("q", "city", "ids", "limit", "城市", "z", "a")), st.text(_CHARS, max_size=6)
)
JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(_CHARS, max_size=12)),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(_JSON_KEYS, children, max_size=3)
    ),
    max_leaves=8,
)
NON_NULL_JSON = JSON_VALUES.filter(lambda value: value is not None)
JSON_OBJECTS = st.dictionaries(_JSON_KEYS, JSON_VALUES, max_size=4)


TOOL_NAMES = ["get_weather", "search", "read_file", "run_python", "lookup_lore", "天気", ""]

# --------------------------------------------------------------------------------------------
# Content shapes
# --------------------------------------------------------------------------------------------


@st.composite
def user_content(draw: st.DrawFn) -> Any:
    shape = draw(st.sampled_from(("str", "str", "str", "parts", "empty", "missing", "none", "emptylist")))
    if shape == "str":
        return draw(TEXTS)
    if shape == "empty":
        return ""
    if shape == "none":
        return None
    if shape == "emptylist":
        return []
    if shape == "missing":
        return _MISSING
    parts: list[Block] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(("text", "input_text", "image_url", "image", "input_image")))
        if kind in ("text", "input_text"):
            parts.append({"type": kind, "text": draw(TEXTS)})
        elif kind == "image_url":
            image: Block = {"type": "image_url", "image_url": {"url": "https://example.test/cat.png"}}
            if draw(st.booleans()):
                image["image_url"]["detail"] = draw(st.sampled_from(("low", "high", "auto")))
            parts.append(image)
        elif kind == "image":
            parts.append(
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}}
            )
        else:
            image = {"type": "input_image", "image_url": "data:image/png;base64,iVBOR"}
            if draw(st.booleans()):
                image.update(
                    width=draw(st.integers(1, 4096)), height=draw(st.integers(1, 4096)), detail="high"
                )
            parts.append(image)
    return parts


@st.composite
def assistant_content(draw: st.DrawFn) -> Any:
    shape = draw(st.sampled_from(("str", "str", "parts", "empty", "missing", "none")))
    if shape == "str":
        return draw(TEXTS)
    if shape == "empty":
        return ""
    if shape == "none":
        return None
    if shape == "missing":
        return _MISSING
    parts: list[Block] = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(("text", "output_text", "refusal", "thinking", "redacted_thinking")))
        if kind in ("text", "output_text"):
            parts.append({"type": kind, "text": draw(TEXTS)})
        elif kind == "refusal":
            parts.append({"type": "refusal", "refusal": draw(SHORT_TEXTS)})
        elif kind == "thinking":
            parts.append({"type": "thinking", "thinking": draw(TEXTS), "signature": "sig"})
        else:
            part: Block = {"type": "redacted_thinking"}
            _put(part, "data", draw(st.sampled_from(("EmwKAhgBEgy3va3pzix", "", _MISSING))))
            parts.append(part)
    return parts


# An encrypted payload as providers send them (base64), of any length.
OPAQUE = st.text(
    st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="), max_size=300
)


def with_reasoning(draw: st.DrawFn, block: Block) -> Block:
    """`block` sometimes carrying a chat message's reasoning (DeepSeek's `reasoning_content`,
    vLLM's `reasoning`, both) and sometimes the reasoning tokens its provider reported."""
    choice = draw(st.integers(0, 5))
    if choice == 1:
        block["reasoning_content"] = draw(TEXTS)
    elif choice == 2:
        block["reasoning"] = draw(TEXTS)
    elif choice == 3:
        text = draw(TEXTS)
        block["reasoning_content"] = text
        block["reasoning"] = draw(st.sampled_from((text, text + " more")))
    if choice and draw(st.integers(0, 4)) == 0:
        block.setdefault("meta", {})["reasoning_tokens"] = draw(st.integers(0, 5000))
    return block


class _Missing:
    """Marker: leave the key out of the dict."""


_MISSING = _Missing()


def _put(block: Block, key: str, value: Any) -> Block:
    if not isinstance(value, _Missing):
        block[key] = value
    return block


# --------------------------------------------------------------------------------------------
# Conversation builder
# --------------------------------------------------------------------------------------------

RESULT_SPELLINGS = ["toolCallId", "tool_call_id", "callId", "call_id", "tool_use_id"]


@dataclass
class _Builder:
    draw: st.DrawFn
    blocks: list[Block] = field(default_factory=list)
    pending: list[Block] = field(default_factory=list)  # tool results still to be placed
    next_call: int = 0

    def call_id(self) -> str:
        self.next_call += 1
        style = self.draw(st.sampled_from(("call_{}", "toolu_{}", "fc_{}", "{}", "呼{}")))
        return style.format(f"{self.next_call:03d}")

    def flags(
        self, block: Block, *, pinned: float = 0.05, mandatory: float = 0.02, injected: float = 0.05
    ) -> Block:
        for name, probability in (("pinned", pinned), ("mandatory", mandatory), ("injected", injected)):
            roll = self.draw(st.integers(0, 999)) / 1000
            if roll < probability:
                block[name] = True
            elif roll > 0.97:
                block[name] = self.draw(st.sampled_from((False, None)))
        return block

    def add(self, block: Block) -> None:
        self.blocks.append(block)

    # -- tool results ------------------------------------------------------------------------

    def generic_result(self, call_ids: list[str]) -> Block:
        """A role=tool result naming its call(s) with any spelling, top level or in meta."""
        block: Block = {"role": "tool"}
        if self.draw(st.booleans()):
            block["content"] = self.draw(TEXTS)
        else:
            block["content"] = [{"type": "text", "text": self.draw(TEXTS)}]
        for call_id in call_ids:
            spellings = self.draw(
                st.lists(st.sampled_from(RESULT_SPELLINGS), min_size=1, max_size=2, unique=True)
            )
            for spelling in spellings:
                if self.draw(st.booleans()):
                    block.setdefault("meta", {})[spelling] = call_id
                elif spelling not in block:
                    block[spelling] = call_id
                else:
                    block.setdefault("meta", {})[spelling] = call_id
        if self.draw(st.integers(0, 9)) == 0:
            block.setdefault("meta", {})["source"] = "mcp"
        return block

    def anthropic_result(self, call_ids: list[str]) -> Block:
        parts: list[Block] = []
        for call_id in call_ids:
            part: Block = {"type": "tool_result", "tool_use_id": call_id}
            inner = self.draw(st.sampled_from(("str", "parts", "missing")))
            if inner == "str":
                part["content"] = self.draw(TEXTS)
            elif inner == "parts":
                inner_parts: list[Block] = [{"type": "text", "text": self.draw(TEXTS)}]
                if self.draw(st.integers(0, 4)) == 0:
                    inner_parts.append({"type": "image", "source": {"type": "base64", "data": "xx"}})
                part["content"] = inner_parts
            if self.draw(st.integers(0, 4)) == 0:
                part["is_error"] = True
            parts.append(part)
        if self.draw(st.booleans()):
            parts.append({"type": "text", "text": self.draw(SHORT_TEXTS)})
        return {"role": "user", "content": parts}

    def vercel_result(self, call_ids: list[str]) -> Block:
        parts: list[Block] = []
        for call_id in call_ids:
            part: Block = {
                "type": "tool-result",
                "toolCallId": call_id,
                "toolName": self.draw(st.sampled_from(TOOL_NAMES)),
            }
            key = self.draw(st.sampled_from(("output", "result")))
            if self.draw(st.booleans()):
                part[key] = self.draw(TEXTS)
            else:
                part[key] = self.draw(NON_NULL_JSON)
            parts.append(part)
        return {"role": "tool", "content": parts}

    def responses_result(self, call_id: str) -> Block:
        block: Block = {"type": "function_call_output", "call_id": call_id}
        if self.draw(st.booleans()):
            block["output"] = self.draw(TEXTS)
        else:
            block["output"] = [{"type": "input_text", "text": self.draw(TEXTS)}]
        return block

    # -- turns -------------------------------------------------------------------------------

    def system_block(self) -> None:
        role = self.draw(st.sampled_from(("system", "system", "developer")))
        kind = self.draw(
            st.sampled_from(
                (_MISSING, "system", "message", "character", "persona", "lorebook", "memory", "summary", None)
            )
        )
        block = _put({"role": role}, "kind", kind)
        if kind in ("lorebook", "memory") and self.draw(st.booleans()):
            block["relevance"] = self.draw(st.one_of(st.integers(0, 1), st.floats(0, 1, width=32)))
        _put(block, "content", self.draw(st.one_of(TEXTS, st.just(_MISSING), st.just(""))))
        mandatory = 0.3 if kind == "lorebook" else 0.02
        self.add(self.flags(block, pinned=0.08, mandatory=mandatory))

    def user_turn(self) -> None:
        block = _put({"role": "user"}, "content", self.draw(user_content()))
        if self.draw(st.integers(0, 5)) == 0:
            block["type"] = "message"
        if self.draw(st.integers(0, 7)) == 0:
            block["kind"] = "message"
        self.add(self.flags(block, pinned=0.12, injected=0.2))

    def assistant_turn(self) -> None:
        block = _put({"role": "assistant"}, "content", self.draw(assistant_content()))
        if self.draw(st.integers(0, 5)) == 0:
            block["type"] = "message"
        self.add(self.flags(with_reasoning(self.draw, block)))

    def reasoning_item(self) -> None:
        summary = [{"type": "summary_text", "text": self.draw(TEXTS)}] if self.draw(st.integers(0, 3)) else []
        block: Block = {"type": "reasoning", "summary": summary}
        if self.draw(st.booleans()):
            block["content"] = [{"type": "reasoning_text", "text": self.draw(SHORT_TEXTS)}]
        if self.draw(st.booleans()):
            block["encrypted_content"] = self.draw(OPAQUE)
        if self.draw(st.integers(0, 4)) == 0:
            block["meta"] = {"reasoning_tokens": self.draw(st.integers(0, 3000))}
        self.add(self.flags(block))

    def tool_round(self) -> None:
        """One assistant turn with several parallel calls; results are queued for later."""
        flavour = self.draw(st.sampled_from(("openai", "anthropic", "vercel", "responses")))
        ids = [self.call_id() for _ in range(self.draw(st.integers(1, 4)))]
        if flavour == "openai":
            calls = []
            for call_id in ids:
                arguments = self.draw(
                    st.one_of(st.just(json_text(self.draw(JSON_OBJECTS))), JSON_OBJECTS, SHORT_TEXTS)
                )
                if self.draw(st.integers(0, 3)) == 0:
                    calls.append(
                        {
                            "id": call_id,
                            "name": self.draw(st.sampled_from(TOOL_NAMES)),
                            "arguments": arguments,
                        }
                    )
                else:
                    function = {"name": self.draw(st.sampled_from(TOOL_NAMES)), "arguments": arguments}
                    calls.append({"id": call_id, "type": "function", "function": function})
            block = {
                "role": "assistant",
                "content": self.draw(st.sampled_from((None, "", "Let me check."))),
                "tool_calls": calls,
            }
            self.add(self.flags(with_reasoning(self.draw, block)))
        elif flavour == "anthropic":
            parts: list[Block] = []
            if self.draw(st.booleans()):
                parts.append({"type": "text", "text": self.draw(SHORT_TEXTS)})
            for call_id in ids:
                name = self.draw(st.sampled_from(TOOL_NAMES))
                parts.append(
                    {"type": "tool_use", "id": call_id, "name": name, "input": self.draw(JSON_OBJECTS)}
                )
            self.add(self.flags({"role": "assistant", "content": parts}))
        elif flavour == "vercel":
            parts = []
            for call_id in ids:
                part: Block = {
                    "type": "tool-call",
                    "toolCallId": call_id,
                    "toolName": self.draw(st.sampled_from(TOOL_NAMES)),
                }
                part[self.draw(st.sampled_from(("input", "args")))] = self.draw(JSON_OBJECTS)
                parts.append(part)
            self.add(self.flags({"role": "assistant", "content": parts}))
        else:
            if self.draw(st.booleans()):
                self.reasoning_item()
            for call_id in ids:
                item: Block = {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": self.draw(st.sampled_from(TOOL_NAMES)),
                }
                item["arguments"] = json_text(self.draw(JSON_OBJECTS))
                if self.draw(st.integers(0, 3)) == 0:
                    item["role"] = "assistant"
                if self.draw(st.integers(0, 3)) == 0:
                    item["id"] = "fc_item_" + call_id
                self.add(self.flags(item))
        self.queue_results(ids)

    def queue_results(self, ids: list[str]) -> None:
        remaining = list(self.draw(st.permutations(ids)))
        while remaining:
            style = self.draw(
                st.sampled_from(("generic", "anthropic", "vercel", "responses", "dropped", "early"))
            )
            take = 1 if style in ("responses", "dropped") else self.draw(st.integers(1, len(remaining)))
            batch, remaining = remaining[:take], remaining[take:]
            if style == "dropped":
                continue  # a call whose result never arrives
            if style == "generic":
                result = self.generic_result(batch)
            elif style == "anthropic":
                result = self.anthropic_result(batch)
            elif style == "vercel":
                result = self.vercel_result(batch)
            elif style in ("responses", "early"):
                result = (
                    self.responses_result(batch[0]) if style == "responses" else self.generic_result(batch)
                )
            if style == "early" and self.blocks:
                # a result recorded before its call (clock skew, merged histories)
                position = self.draw(st.integers(0, len(self.blocks) - 1))
                self.blocks.insert(position, self.flags(result))
            else:
                self.pending.append(self.flags(result, pinned=0.03, injected=0.03))

    def place_pending(self) -> None:
        """Put some queued results into the history now, in any order."""
        if not self.pending:
            return
        count = self.draw(st.integers(1, len(self.pending)))
        order = self.draw(st.permutations(range(len(self.pending))))
        chosen = sorted(order[:count], reverse=True)
        for index in order[:count]:
            self.add(self.pending[index])
        for index in chosen:
            del self.pending[index]

    def orphan_result(self) -> None:
        orphan_id = "gone_" + self.call_id()
        style = self.draw(st.sampled_from(("generic", "anthropic", "vercel", "responses")))
        if style == "generic":
            block = self.generic_result([orphan_id])
        elif style == "anthropic":
            block = self.anthropic_result([orphan_id])
        elif style == "vercel":
            block = self.vercel_result([orphan_id])
        else:
            block = self.responses_result(orphan_id)
        self.add(self.flags(block, pinned=0.05))


@st.composite
def conversations(draw: st.DrawFn, max_turns: int = 14) -> list[Block]:
    builder = _Builder(draw)
    for _ in range(draw(st.integers(0, 4))):
        builder.system_block()
    actions = [
        "user",
        "user",
        "assistant",
        "assistant",
        "tool",
        "tool",
        "place",
        "place",
        "system",
        "orphan",
        "reasoning",
    ]
    for _ in range(draw(st.integers(0, max_turns))):
        action = draw(st.sampled_from(actions))
        if action == "user":
            builder.user_turn()
        elif action == "assistant":
            builder.assistant_turn()
        elif action == "tool":
            builder.tool_round()
        elif action == "place":
            builder.place_pending()
        elif action == "system":
            builder.system_block()
        elif action == "orphan":
            builder.orphan_result()
        else:
            builder.reasoning_item()
            if draw(st.booleans()):  # the answer message of the same response
                builder.assistant_turn()
    while builder.pending:
        if not draw(st.booleans()):
            break
        builder.place_pending()
    if draw(st.integers(0, 3)) > 0:
        builder.user_turn()
    _assign_ids(draw, builder.blocks)
    return builder.blocks


def _assign_ids(draw: st.DrawFn, blocks: list[Block]) -> None:
    style = draw(st.sampled_from(("msg_{}", "m{}", "{}", "id-{}-x", "メッセージ{}")))
    for position, block in enumerate(blocks):
        if "id" in block:  # Responses items may carry their own item id
            continue
        choice = draw(st.integers(0, 9))
        if choice < 6:
            block["id"] = style.format(position)
        elif choice == 6:
            block["id"] = None
        # else: no id -> "#<position>"
    # Put "id" first, the way callers usually write it (dict order only affects messages display).
    for block in blocks:
        if "id" in block:
            block_id = block.pop("id")
            items = list(block.items())
            block.clear()
            block["id"] = block_id
            block.update(items)


# --------------------------------------------------------------------------------------------
# Options and budgets
# --------------------------------------------------------------------------------------------


@st.composite
def options(draw: st.DrawFn) -> dict[str, Any] | None:
    if draw(st.integers(0, 4)) == 0:
        return None
    result: dict[str, Any] = {}
    if draw(st.booleans()):
        result["max_block_chars"] = draw(
            st.one_of(st.sampled_from((64, 65, 100, 200, 50_000)), st.integers(64, 2000))
        )
    if draw(st.booleans()):
        result["pinned_cap"] = draw(
            st.one_of(st.sampled_from((0.0, 0.05, 0.25, 0.5, 1.0)), st.floats(0, 1, allow_nan=False))
        )
    if draw(st.integers(0, 3)) == 0:
        result["start_on_user"] = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:
        result["protect_current_input"] = draw(st.booleans())
    if draw(st.integers(0, 5)) == 0:
        result["tool_result_max_chars"] = draw(
            st.one_of(st.sampled_from((0, 64, 100, 300)), st.integers(64, 2000))
        )
    return result


@st.composite
def budgets(draw: st.DrawFn, total_tokens: int, protected_tokens: int) -> BudgetSpec:
    """From 0 to ample, concentrated where decisions are interesting: between what the
    protected blocks need and the whole conversation."""
    choice = draw(st.integers(0, 19))
    if choice == 0:
        return draw(st.sampled_from((0, 1, 4, 10, 10**9)))
    if choice <= 2:
        return draw(st.integers(0, total_tokens + 10))
    if choice <= 16:
        low = min(protected_tokens, total_tokens)
        return draw(st.integers(low, total_tokens + 5))
    if choice == 17:  # anything, often under the floor
        context_limit = draw(st.integers(1, 3 * total_tokens + 100))
        response_reserve = draw(st.integers(0, context_limit))
        system_reserve = draw(st.sampled_from((0, 0, 4000, min(10, context_limit))))
        return (context_limit, response_reserve, system_reserve)
    # a Budget whose result lands in the interesting range (unless the floor lifts it)
    target = draw(st.integers(min(protected_tokens, total_tokens), total_tokens + 5))
    response_reserve = draw(st.sampled_from((0, 0, 1, 100, 4000, 64_000)))
    system_reserve = draw(st.sampled_from((0, 0, 7, 4000)))
    return (max(1, target + response_reserve + system_reserve), response_reserve, system_reserve)


@dataclass
class Scenario:
    blocks: list[Block]
    budget: BudgetSpec
    options: dict[str, Any] | None

    def __repr__(self) -> str:  # readable in hypothesis' falsifying-example output
        return f"Scenario(budget={self.budget!r}, options={self.options!r},\n  blocks={self.blocks!r})"


def _fit_json_outputs(blocks: list[Block], max_block_chars: int, tool_result_max_chars: int) -> None:
    """Keep blocks with non-str Vercel tool-result outputs under their char cap (a tool result's is
    the lower of the two caps when `tool_result_max_chars` is set).

    docs/semantics.md does not say how the JSON text of such an output is cut; keep the generated
    inputs inside the documented part (such blocks never need a cut).
    """
    for index, block in enumerate(blocks):
        content = block.get("content")
        if not isinstance(content, list):
            continue
        has_json = any(
            isinstance(part, dict)
            and part.get("type") == "tool-result"
            and not isinstance(part.get("output", part.get("result")), str)
            for part in content
        )
        parsed = parse_block(index, block, [])
        if parsed is None:
            continue
        cap = max_block_chars
        if parsed.result_ids and tool_result_max_chars:
            cap = min(cap, tool_result_max_chars)
        if has_json and parsed.chars() > cap:
            for part in content:
                for key in ("output", "result"):
                    if part.get("type") == "tool-result" and key in part and not isinstance(part[key], str):
                        part[key] = json_text(part[key])


@st.composite
def scenarios(draw: st.DrawFn, max_turns: int = 14) -> Scenario:
    opts = draw(options())
    blocks = draw(conversations(max_turns=max_turns))
    given = opts or {}
    _fit_json_outputs(blocks, given.get("max_block_chars", 50_000), given.get("tool_result_max_chars", 0))
    # Estimate where the interesting budgets are (pins may still be lost to the cap later).
    ample = analyze(blocks, budget=10**12, options=opts)
    total = sum(ample.tokens)
    protected = sum(
        ample.group_tokens(g) for g, is_protected in enumerate(ample.group_protected) if is_protected
    )
    return Scenario(blocks, draw(budgets(total, protected)), opts)


# --------------------------------------------------------------------------------------------
# Invalid input
# --------------------------------------------------------------------------------------------


def _mutate(draw: st.DrawFn, blocks: list[Block]) -> None:
    """Break one block in one documented way."""
    index = draw(st.integers(0, len(blocks) - 1))
    block = blocks[index]
    how = draw(
        st.sampled_from(
            [
                "role",
                "kind",
                "id_empty",
                "id_type",
                "id_dup",
                "flag",
                "relevance",
                "content_type",
                "part_type",
                "part_not_dict",
                "part_no_type",
                "part_text",
                "meta",
                "result_id",
                "tool_call_id",
                "no_role",
                "unknown_type",
                "type_not_str",
                "reasoning",
            ]
        )
    )
    if how == "role":
        block["role"] = draw(st.sampled_from(["robot", "", "USER", 5, ["user"]]))
    elif how == "kind":
        block["kind"] = draw(st.sampled_from(("npc", "Message", 3, True)))
    elif how == "id_empty":
        block["id"] = ""
    elif how == "id_type":
        block["id"] = draw(st.sampled_from([7, True, ["a"]]))
    elif how == "id_dup":
        other = draw(st.integers(0, len(blocks) - 1))
        if other != index:
            block["id"] = blocks[other].get("id") or f"#{other}"
        else:
            block["id"] = f"#{index + 1}" if index + 1 < len(blocks) else f"#{index}"
    elif how == "flag":
        block[draw(st.sampled_from(("pinned", "mandatory", "injected")))] = draw(
            st.sampled_from(["yes", 1, 0, [True]])
        )
    elif how == "relevance":
        block["relevance"] = draw(
            st.sampled_from((math.nan, math.inf, -math.inf, "high", True, 1.5, -0.25, 2))
        )
    elif how == "content_type":
        block["content"] = draw(st.sampled_from((42, {"text": "x"}, True, 1.5)))
    elif how in ("part_type", "part_not_dict", "part_no_type", "part_text"):
        bad: Any = {
            "part_type": {"type": draw(st.sampled_from(("video", "audio", "file", "Text")))},
            "part_not_dict": draw(st.sampled_from([7, "text", None, ["text"]])),
            "part_no_type": {"text": "no type here"},
            "part_text": {"type": draw(st.sampled_from(("text", "input_text", "output_text"))), "text": 5},
        }[how]
        content = block.get("content")
        if isinstance(content, list):
            content.insert(draw(st.integers(0, len(content))), bad)
        else:
            block["content"] = [{"type": "text", "text": "ok"}, bad]
    elif how == "meta":
        block["meta"] = draw(st.sampled_from(["x", [1], 3]))
    elif how == "result_id":
        value = draw(st.sampled_from(["", 5, ["call_1"], False]))
        key = draw(st.sampled_from(("toolCallId", "tool_call_id", "callId", "tool_use_id")))
        if draw(st.booleans()):
            block[key] = value
        else:
            meta = block.get("meta")
            block["meta"] = {**(meta if isinstance(meta, dict) else {}), key: value}
    elif how == "tool_call_id":
        block["tool_calls"] = [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]
        if draw(st.booleans()):
            block["tool_calls"][0]["id"] = draw(st.sampled_from(("", 3)))
    elif how == "no_role":
        block.pop("role", None)
        block.pop("type", None)
    elif how == "unknown_type":
        block.pop("role", None)
        block["type"] = draw(st.sampled_from(("web_search_call", "item_reference", "file_search_call")))
    elif how == "reasoning":
        bad_reasoning = draw(
            st.sampled_from(
                [
                    ("reasoning_content", 5),
                    ("reasoning", ["thought"]),
                    ("meta.reasoning_tokens", -1),
                    ("meta.reasoning_tokens", "many"),
                    ("meta.reasoning_tokens", True),
                    ("encrypted_content", 7),
                    ("part", {"type": "thinking", "signature": "s"}),
                    ("part", {"type": "redacted_thinking", "data": 3}),
                ]
            )
        )
        key, value = bad_reasoning
        if key == "meta.reasoning_tokens":
            meta = block.get("meta")
            block["meta"] = {**(meta if isinstance(meta, dict) else {}), "reasoning_tokens": value}
        elif key == "encrypted_content":
            block.pop("role", None)
            block.update(type="reasoning", summary=[], encrypted_content=value)
        elif key == "part":
            block["content"] = [value]
        else:
            block[key] = value
    else:
        block["type"] = draw(st.sampled_from([5, ["message"], False]))


@st.composite
def invalid_scenarios(draw: st.DrawFn) -> Scenario:
    blocks = draw(conversations(max_turns=6).filter(bool))
    for _ in range(draw(st.integers(1, 3))):
        _mutate(draw, blocks)
    total = sum(len(b) for b in blocks)
    return Scenario(blocks, draw(st.integers(0, 10 * total + 10)), draw(options()))


@st.composite
def invalid_options(draw: st.DrawFn) -> dict[str, Any]:
    drawn = draw(options())
    result: dict[str, Any] = {} if drawn is None else drawn
    bad = draw(
        st.sampled_from(
            [
                ("max_block_chars", 63),
                ("max_block_chars", 0),
                ("max_block_chars", "100"),
                ("max_block_chars", True),
                ("pinned_cap", 1.5),
                ("pinned_cap", -0.1),
                ("pinned_cap", math.nan),
                ("pinned_cap", "half"),
                ("start_on_user", "yes"),
                ("protect_current_input", 1),
                ("tool_result_max_chars", 63),
                ("tool_result_max_chars", -1),
                ("strategy", "truncate"),
                ("max_chars", 100),
                ("pinnedCap", 0.5),
            ]
        )
    )
    result[bad[0]] = bad[1]
    return result

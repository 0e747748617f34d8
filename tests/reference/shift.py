"""A small, readable reference implementation of docs/semantics.md (heuristic profile, truncate).

Section numbers in comments (§1, §4.3, ...) refer to docs/semantics.md. The code follows the
document's wording step by step rather than aiming for speed; it must not import anything from
the ``contextshift`` package.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

# A position inside one block dict, from the block down to a value: ("content", 1, "text").
Place = tuple[str | int, ...]

TRUNCATION_MARK = "[Truncated]"
MESSAGE_OVERHEAD = 4  # §2: tokens per block
IMAGE_TOKENS = 765  # §2: tokens per image
PROMPT_OVERHEAD = 0  # §2

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
KINDS = {"system", "character", "persona", "lorebook", "memory", "summary", "message"}
# Responses item types that imply a role when the block has none (§1).
ROLE_FROM_TYPE = {"function_call": "assistant", "function_call_output": "tool", "reasoning": "assistant"}
# Every spelling of "the call this block answers" (§1).
RESULT_ID_KEYS = ("toolCallId", "tool_call_id", "callId", "call_id", "tool_use_id")
# Part type -> the key holding its text (§1.1).
TEXT_PART_KEYS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "summary_text": "text",
    "reasoning_text": "text",
    "refusal": "refusal",
}
# A chat message's reasoning text fields, in reading order (§1.2).
REASONING_FIELDS = ("reasoning_content", "reasoning")
IMAGE_PART_TYPES = {"image_url", "image", "input_image"}


def budget_floor_warning(raw: int, floor: int) -> str:
    """The warning of §3 when the budget floor applies.

    docs/semantics.md only says that a warning reports the floor; this wording is the library's
    (service/contextshift/budget.py), so that whole results can be compared.
    """
    return f"budget floor applied: {raw} < min(4000, context_limit // 2) = {floor}; using {floor}"


def unpin_warning(block_id: str) -> str:
    """The warning text of §4.3 for a block that lost its pin."""
    return f"unpinned {block_id} by pinned_cap"


def over_cap_warning(block_id: str, reasoning_chars: int, cap: int) -> str:
    """The warning of §4.2 for a protected block whose reasoning alone is over its cap (the
    library's wording, service/contextshift/reasoning.py)."""
    return (
        f"{block_id}: its reasoning ({reasoning_chars} characters) is over the character cap ({cap}) and is "
        "never cut; kept whole because it is protected"
    )


# --------------------------------------------------------------------------------------------
# Errors and result
# --------------------------------------------------------------------------------------------


class RefInvalid(Exception):
    """Invalid input: ``fields`` are the field paths, in the order they were found.

    ``kind`` is ``"blocks"`` (InvalidBlocks) or ``"options"`` (InvalidOptions: budget/options).
    """

    def __init__(self, fields: list[str], kind: Literal["blocks", "options"] = "blocks") -> None:
        super().__init__(f"invalid {kind}: {', '.join(fields)}")
        self.fields = fields
        self.kind: Literal["blocks", "options"] = kind


class RefBudgetExceeded(Exception):
    """Protected blocks alone do not fit (§4.4)."""

    def __init__(self, protected_tokens: int, budget: int) -> None:
        super().__init__(f"protected blocks need {protected_tokens} tokens, budget is {budget}")
        self.protected_tokens = protected_tokens
        self.budget = budget


Decision = tuple[str, int, str]  # (id, tokens, reason)
TruncationEntry = tuple[str, int, int, str]  # (id, tokens_before, tokens_after, how)


@dataclass
class RefResult:
    kept: list[Decision]
    excluded: list[Decision]
    truncated: list[TruncationEntry]
    prompt_tokens: int
    budget: int
    warnings: list[str]
    messages: list[dict[str, object]]


# --------------------------------------------------------------------------------------------
# §2 Tokens
# --------------------------------------------------------------------------------------------


def text_tokens(text: str) -> int:
    """§2: 0 for "", else max(1, (3a + 8n + 11) // 12), iterating code points."""
    if text == "":
        return 0
    ascii_count = 0
    other_count = 0
    for char in text:
        if ord(char) < 0x80:
            ascii_count += 1
        else:
            other_count += 1
    return max(1, (3 * ascii_count + 8 * other_count + 11) // 12)


def json_text(value: object) -> str:
    """§1.1: compact-with-spaces JSON, keys in given order, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False)


# --------------------------------------------------------------------------------------------
# §1 Parsing
# --------------------------------------------------------------------------------------------


@dataclass
class TextPiece:
    text: str
    place: Place  # where the text sits in the block dict (for writing back a cut)


@dataclass
class ToolCall:
    call_id: str
    name: str
    arguments: str


@dataclass
class Block:
    index: int
    id: str
    role: str
    kind: str
    pinned: bool
    mandatory: bool
    injected: bool
    pieces: list[TextPiece] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    result_ids: list[str] = field(default_factory=list)
    images: int = 0
    # §1.2: how many pieces of reasoning the block carries, their texts and encrypted payloads,
    # whether it is a Responses reasoning item, and `meta.reasoning_tokens`.
    reasoning: int = 0
    reasoning_texts: list[str] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)
    reasoning_item: bool = False
    reasoning_tokens: int | None = None

    @property
    def system_protected(self) -> bool:
        """§5: kind system or character, or role system with kind message."""
        return self.kind in ("system", "character") or (self.role == "system" and self.kind == "message")

    @property
    def linked_ids(self) -> list[str]:
        """Every call id this block issues and every result id it carries (§4.4 groups)."""
        return [call.call_id for call in self.calls] + self.result_ids

    def tokens(self) -> int:
        """§2: block tokens (the heuristic profile counts all reasoning, §2.1)."""
        total = MESSAGE_OVERHEAD
        total += sum(text_tokens(piece.text) for piece in self.pieces)
        total += sum(text_tokens(call.name) + text_tokens(call.arguments) for call in self.calls)
        total += IMAGE_TOKENS * self.images
        if self.reasoning:
            reported = self.reasoning_tokens
            total += (
                reported
                if reported is not None
                else sum(map(text_tokens, self.reasoning_texts + self.opaque))
            )
        return total

    def reasoning_chars(self) -> int:
        return sum(len(text) for text in self.reasoning_texts)

    def chars(self) -> int:
        """§4.2: code points of the text pieces and the reasoning text (not tool-call names or
        arguments, not encrypted payloads)."""
        return sum(len(piece.text) for piece in self.pieces) + self.reasoning_chars()


def field_path(index: int, place: Place) -> str:
    """("content", 1, "type") -> "blocks[3].content[1].type"."""
    out = f"blocks[{index}]"
    for step in place:
        out += f"[{step}]" if isinstance(step, int) else f".{step}"
    return out


class _BlockReader:
    """Reads one block dict; records errors as field paths instead of stopping at the first."""

    def __init__(self, index: int, errors: list[str]) -> None:
        self.index = index
        self.errors = errors
        self.pieces: list[TextPiece] = []
        self.calls: list[ToolCall] = []
        self.result_ids: list[str] = []
        self.images = 0
        self.reasoning = 0
        self.reasoning_texts: list[str] = []
        self.opaque: list[str] = []

    def error(self, place: Place) -> None:
        self.errors.append(field_path(self.index, place))

    # -- small typed readers -----------------------------------------------------------------

    def non_empty_str(self, value: object, place: Place) -> str | None:
        if isinstance(value, str) and value != "":
            return value
        self.error(place)
        return None

    def optional_str(self, value: object, place: Place, default: str = "") -> str:
        if value is None:
            return default
        if isinstance(value, str):
            return value
        self.error(place)
        return default

    def flag(self, value: object, place: Place) -> bool:
        if value is None:
            return False
        if isinstance(value, bool):
            return value
        self.error(place)
        return False

    def add_call(
        self, call_id: object, name: object, arguments: str, at: Place, id_key: str, name_key: str
    ) -> None:
        checked_id = self.non_empty_str(call_id, (*at, id_key))
        checked_name = self.optional_str(name, (*at, name_key))
        if checked_id is not None:
            self.calls.append(ToolCall(checked_id, checked_name, arguments))

    def opaque_value(self, value: object, place: Place) -> None:
        """An encrypted payload (§1.2): a str, or missing/None."""
        if isinstance(value, str):
            self.opaque.append(value)
        elif value is not None:
            self.error(place)

    def add_result_id(self, value: object, place: Place) -> None:
        checked = self.non_empty_str(value, place)
        if checked is not None:
            self.result_ids.append(checked)

    # -- content and parts (§1.1) --------------------------------------------------------------

    def content(self, value: object, at: Place) -> None:
        """`content`, `output` or a tool_result's `content`: missing/None, str, or list of parts."""
        if value is None:
            return
        if isinstance(value, str):
            self.pieces.append(TextPiece(value, at))
        elif isinstance(value, list):
            self.parts(value, at)
        else:
            self.error(at)

    def parts(self, parts: list[object], at: Place) -> None:
        for j, part in enumerate(parts):
            self.part(part, (*at, j))

    def part(self, part: object, at: Place) -> None:
        if not isinstance(part, dict):
            self.error(at)
            return
        part_type = part.get("type")
        if not isinstance(part_type, str):
            self.error((*at, "type"))
            return
        if part_type in TEXT_PART_KEYS:
            key = TEXT_PART_KEYS[part_type]
            text = part.get(key)
            if isinstance(text, str):
                self.pieces.append(TextPiece(text, (*at, key)))
            else:
                self.error((*at, key))
        elif part_type == "thinking":  # §1.2: reasoning, not text
            self.reasoning += 1
            text = part.get("thinking")
            if isinstance(text, str):
                self.reasoning_texts.append(text)
            else:
                self.error((*at, "thinking"))
        elif part_type == "redacted_thinking":
            self.reasoning += 1
            self.opaque_value(part.get("data"), (*at, "data"))
        elif part_type in IMAGE_PART_TYPES:
            self.images += 1
        elif part_type == "tool_use":  # Anthropic
            arguments = "" if part.get("input") is None else json_text(part["input"])
            self.add_call(part.get("id"), part.get("name"), arguments, at, "id", "name")
        elif part_type == "tool-call":  # Vercel AI SDK
            value = part.get("input")
            if value is None:
                value = part.get("args")
            arguments = "" if value is None else json_text(value)
            self.add_call(
                part.get("toolCallId"), part.get("toolName"), arguments, at, "toolCallId", "toolName"
            )
        elif part_type == "tool_result":  # Anthropic
            self.add_result_id(part.get("tool_use_id"), (*at, "tool_use_id"))
            self.content(part.get("content"), (*at, "content"))
        elif part_type == "tool-result":  # Vercel AI SDK
            self.add_result_id(part.get("toolCallId"), (*at, "toolCallId"))
            key = "output" if part.get("output") is not None else "result"
            output = part.get(key)
            if isinstance(output, str):
                self.pieces.append(TextPiece(output, (*at, key)))
            elif output is not None:
                self.pieces.append(TextPiece(json_text(output), (*at, key)))
        else:
            self.error((*at, "type"))

    # -- tool_calls ----------------------------------------------------------------------------

    def tool_calls(self, value: object) -> None:
        if value is None:
            return
        if not isinstance(value, list):
            self.error(("tool_calls",))
            return
        for j, call in enumerate(value):
            at: Place = ("tool_calls", j)
            if not isinstance(call, dict):
                self.error(at)
                continue
            holder: dict[str, object] = call
            holder_at = at
            function = call.get("function")
            if function is not None:
                if not isinstance(function, dict):
                    self.error((*at, "function"))
                    continue
                holder = function
                holder_at = (*at, "function")
            arguments = self.arguments(holder.get("arguments"))
            checked_id = self.non_empty_str(call.get("id"), (*at, "id"))
            name = self.optional_str(holder.get("name"), (*holder_at, "name"))
            if checked_id is not None:
                self.calls.append(ToolCall(checked_id, name, arguments))

    @staticmethod
    def arguments(value: object) -> str:
        """Arguments: a str as is, missing -> "", any other JSON value -> its JSON text."""
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        return json_text(value)


def parse_block(index: int, raw: object, errors: list[str]) -> Block | None:
    """Parse block ``index`` (§1). Errors are appended to ``errors``; returns None if unusable."""
    if not isinstance(raw, dict):
        errors.append(f"blocks[{index}]")
        return None
    reader = _BlockReader(index, errors)

    raw_id = raw.get("id")
    block_id = f"#{index}"
    if raw_id is not None:
        checked = reader.non_empty_str(raw_id, ("id",))
        if checked is not None:
            block_id = checked

    item_type = raw.get("type")
    if item_type is not None and not isinstance(item_type, str):
        reader.error(("type",))
        item_type = None

    raw_role = raw.get("role")
    role = ""
    if raw_role is not None:
        if isinstance(raw_role, str) and raw_role in ROLES:
            role = ROLES[raw_role]
        else:
            reader.error(("role",))
    elif isinstance(item_type, str) and item_type in ROLE_FROM_TYPE:
        role = ROLE_FROM_TYPE[item_type]
    elif item_type is None or item_type == "message":
        reader.error(("role",))
    else:
        reader.error(("type",))

    raw_kind = raw.get("kind")
    kind = "message"
    if raw_kind is not None:
        if isinstance(raw_kind, str) and raw_kind in KINDS:
            kind = raw_kind
        else:
            reader.error(("kind",))

    # §1.2: a message's reasoning fields; the same text in both counts once.
    field_texts = []
    for key in REASONING_FIELDS:
        value = raw.get(key)
        if isinstance(value, str):
            if value not in field_texts:
                field_texts.append(value)
        elif value is not None:
            reader.error((key,))
    if field_texts:
        reader.reasoning += 1
        reader.reasoning_texts += field_texts

    # Text pieces in order (§1.1): content, then a function_call_output's output. (The doc leaves
    # the order of content and output open when a function_call_output has both; the generated
    # conversations never do.) A reasoning item's summary and content are its reasoning (§1.2).
    if item_type == "reasoning":
        texts_before = len(reader.pieces)
        summary = raw.get("summary")
        if isinstance(summary, list):
            reader.parts(summary, ("summary",))
        elif summary is not None:
            reader.error(("summary",))
        reader.content(raw.get("content"), ("content",))
        reader.reasoning += 1
        reader.reasoning_texts += [piece.text for piece in reader.pieces[texts_before:]]
        del reader.pieces[texts_before:]
        reader.opaque_value(raw.get("encrypted_content"), ("encrypted_content",))
    else:
        reader.content(raw.get("content"), ("content",))
        if item_type == "function_call_output":
            reader.content(raw.get("output"), ("output",))

    reader.tool_calls(raw.get("tool_calls"))

    pinned = reader.flag(raw.get("pinned"), ("pinned",))
    mandatory = reader.flag(raw.get("mandatory"), ("mandatory",))
    injected = reader.flag(raw.get("injected"), ("injected",))

    relevance = raw.get("relevance")
    if relevance is not None:
        is_number = isinstance(relevance, (int, float)) and not isinstance(relevance, bool)
        if not is_number or not 0 <= relevance <= 1:  # the relevance scale; NaN fails it too
            reader.error(("relevance",))

    # Result ids at top level (a function_call's call_id is the call it issues, not a result).
    for key in RESULT_ID_KEYS:
        if key == "call_id" and item_type == "function_call":
            continue
        if raw.get(key) is not None:
            reader.add_result_id(raw[key], (key,))
    meta = raw.get("meta")
    reasoning_tokens = None
    if isinstance(meta, dict):
        reported = meta.get("reasoning_tokens")
        if isinstance(reported, int) and not isinstance(reported, bool) and reported >= 0:
            reasoning_tokens = reported
        elif reported is not None:
            reader.error(("meta", "reasoning_tokens"))
        for key in RESULT_ID_KEYS:
            if meta.get(key) is not None:
                reader.add_result_id(meta[key], ("meta", key))
    elif meta is not None:
        reader.error(("meta",))

    if item_type == "function_call":
        arguments = _BlockReader.arguments(raw.get("arguments"))
        reader.add_call(raw.get("call_id"), raw.get("name"), arguments, (), "call_id", "name")

    return Block(
        index=index,
        id=block_id,
        role=role,
        kind=kind,
        pinned=pinned,
        mandatory=mandatory,
        injected=injected,
        pieces=reader.pieces,
        calls=reader.calls,
        result_ids=reader.result_ids,
        images=reader.images,
        reasoning=reader.reasoning,
        reasoning_texts=reader.reasoning_texts,
        opaque=reader.opaque,
        reasoning_item=item_type == "reasoning",
        reasoning_tokens=reasoning_tokens,
    )


def parse_blocks(raw_blocks: Sequence[object]) -> list[Block]:
    """§4.1: parse every block, collecting every error; raise RefInvalid if there are any."""
    errors: list[str] = []
    blocks: list[Block] = []
    seen_ids: set[str] = set()
    for index, raw in enumerate(raw_blocks):
        block_errors: list[str] = []
        block = parse_block(index, raw, block_errors)
        if block is not None:
            id_is_valid = f"blocks[{index}].id" not in block_errors
            if id_is_valid and block.id in seen_ids:
                block_errors.insert(0, f"blocks[{index}].id")
            if id_is_valid:
                seen_ids.add(block.id)
            blocks.append(block)
        errors.extend(block_errors)
    if errors:
        raise RefInvalid(errors, "blocks")
    return blocks


# --------------------------------------------------------------------------------------------
# §3 Options and budget
# --------------------------------------------------------------------------------------------

BudgetSpec = int | tuple[int, int, int]


@dataclass
class Options:
    max_block_chars: int = 50_000
    tool_result_max_chars: int = 0  # 0: tool results take max_block_chars
    pinned_cap: float = 0.5
    start_on_user: bool = True
    protect_current_input: bool = True
    # §7: read and checked here; clearing old reasoning is not part of the reference's truncate,
    # so comparisons with the library leave it unset.
    keep_reasoning_turns: int = 0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def resolve_options(options: dict[str, object] | None) -> Options:
    if options is None:
        return Options()
    if not isinstance(options, dict):
        raise RefInvalid(["options"], "options")
    errors: list[str] = []
    resolved = Options()
    for key, value in options.items():
        if key == "max_block_chars" and isinstance(value, int) and _is_int(value) and value >= 64:
            resolved.max_block_chars = value
        elif (
            key == "tool_result_max_chars"
            and isinstance(value, int)
            and _is_int(value)
            and (value == 0 or value >= 64)
        ):
            resolved.tool_result_max_chars = value
        elif (
            key == "pinned_cap"
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and 0 <= value <= 1
        ):
            resolved.pinned_cap = float(value)
        elif key == "start_on_user" and isinstance(value, bool):
            resolved.start_on_user = value
        elif key == "protect_current_input" and isinstance(value, bool):
            resolved.protect_current_input = value
        elif key == "keep_reasoning_turns" and isinstance(value, int) and _is_int(value) and value >= 0:
            resolved.keep_reasoning_turns = value
        else:
            errors.append(f"options.{key}")
    if errors:
        raise RefInvalid(errors, "options")
    return resolved


def resolve_budget(budget: BudgetSpec) -> tuple[int, list[str]]:
    """§3: returns (budget, warnings)."""
    if isinstance(budget, tuple):
        context_limit, response_reserve, system_reserve = budget
        errors = []
        if not _is_int(context_limit) or context_limit <= 0:
            errors.append("budget.context_limit")
        if not _is_int(response_reserve) or response_reserve < 0:
            errors.append("budget.response_reserve")
        if not _is_int(system_reserve) or system_reserve < 0:
            errors.append("budget.system_reserve")
        if errors:
            raise RefInvalid(errors, "options")
        raw = context_limit - response_reserve - system_reserve
        floor = min(4000, context_limit // 2)
        if raw < floor:
            return floor, [budget_floor_warning(raw, floor)]
        return raw, []
    if not _is_int(budget) or budget < 0:
        raise RefInvalid(["budget"], "options")
    return budget, []


# --------------------------------------------------------------------------------------------
# §4.2 Char cap
# --------------------------------------------------------------------------------------------


def cut_texts(pieces: list[TextPiece], max_block_chars: int, force: bool = False) -> list[str] | None:
    """The texts after the char cap, or None when the block is not over the cap (`force`: the
    caller found it over, its reasoning counted)."""
    if not force and sum(len(piece.text) for piece in pieces) <= max_block_chars:
        return None
    remaining = max_block_chars - len(TRUNCATION_MARK)
    texts: list[str] = []
    cut_done = False
    for piece in pieces:
        if cut_done:
            texts.append("")
        elif len(piece.text) <= remaining:
            texts.append(piece.text)
            remaining -= len(piece.text)
        else:
            texts.append(piece.text[:remaining] + TRUNCATION_MARK)
            cut_done = True
    return texts


def write_texts(raw: dict[str, object], pieces: list[TextPiece], texts: list[str]) -> dict[str, object]:
    """A copy of the block dict with each piece's text replaced (the caller's dict is untouched)."""
    message = copy.deepcopy(raw)
    for piece, text in zip(pieces, texts, strict=True):
        container: object = message
        for step in piece.place[:-1]:
            container = container[step]  # type: ignore[index]
        container[piece.place[-1]] = text  # type: ignore[index]
    return message


# --------------------------------------------------------------------------------------------
# §4.3-4.4 Analysis: tokens, pins, protection, groups
# --------------------------------------------------------------------------------------------


@dataclass
class Analysis:
    """Everything decided before the strategy runs (also used by tests to check invariants)."""

    budget: int
    options: Options
    warnings: list[str]
    blocks: list[Block]  # after the char cap
    messages: list[dict[str, object]]  # per block: the dict to return when kept
    tokens: list[int]  # block tokens after the char cap
    truncated: list[TruncationEntry]
    # §4.2: blocks over their cap whose reasoning leaves no room: (index, reasoning chars, cap).
    over_cap: list[tuple[int, int, int]]
    unpinned: set[int]  # block indexes that lost their pin
    protected: list[bool]
    groups: list[list[int]]  # block indexes, groups ordered by earliest member
    group_of: list[int]  # block index -> group number
    group_protected: list[bool]
    group_orphan: list[bool]

    @property
    def ids(self) -> list[str]:
        return [block.id for block in self.blocks]

    def group_tokens(self, group: int) -> int:
        return sum(self.tokens[i] for i in self.groups[group])


def _current_input(blocks: list[Block]) -> int | None:
    """The last block with role user (§5)."""
    for block in reversed(blocks):
        if block.role == "user":
            return block.index
    return None


def _apply_pinned_cap(blocks: list[Block], tokens: list[int], pinned_cap: float, budget: int) -> set[int]:
    """§4.3: returns the indexes of blocks that lose their pin."""
    counted = [b for b in blocks if b.pinned and not b.system_protected and not b.mandatory]
    pinned_sum = sum(tokens[b.index] for b in counted)
    unpinned: set[int] = set()
    if pinned_sum <= pinned_cap * budget:
        return unpinned
    for block in counted[:-1]:  # the most recent counted pin always stays pinned
        if pinned_sum <= pinned_cap * budget:
            break
        if block.injected:
            unpinned.add(block.index)
            pinned_sum -= tokens[block.index]
    return unpinned


def _group_blocks(blocks: list[Block]) -> tuple[list[list[int]], list[int]]:
    """Union-find over linked ids; groups ordered by earliest member."""
    parent = list(range(len(blocks)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        a, b = find(i), find(j)
        parent[max(a, b)] = min(a, b)

    owner: dict[str, int] = {}
    for block in blocks:
        for linked_id in block.linked_ids:
            if linked_id in owner:
                union(owner[linked_id], block.index)
            else:
                owner[linked_id] = block.index
    # A Responses reasoning item joins the assistant blocks after it, up to a block of another
    # role or the next reasoning item.
    for block in blocks:
        if block.reasoning_item:
            for follower in blocks[block.index + 1 :]:
                if follower.role != "assistant" or follower.reasoning_item:
                    break
                union(block.index, follower.index)

    by_root: dict[int, list[int]] = {}
    for block in blocks:
        by_root.setdefault(find(block.index), []).append(block.index)
    groups = sorted(by_root.values(), key=lambda members: members[0])
    group_of = [0] * len(blocks)
    for number, members in enumerate(groups):
        for i in members:
            group_of[i] = number
    return groups, group_of


def analyze(
    raw_blocks: Sequence[dict[str, object]],
    *,
    budget: BudgetSpec,
    options: dict[str, object] | None = None,
) -> Analysis:
    """§4 stages 1-3 and the first part of 4 (everything before the strategy)."""
    resolved_options = resolve_options(options)
    budget_value, warnings = resolve_budget(budget)
    blocks = parse_blocks(raw_blocks)

    # §4.2 char cap: reasoning is never cut; the text gets what it leaves, or the block goes whole.
    messages: list[dict[str, object]] = list(raw_blocks)
    truncated: list[TruncationEntry] = []
    over_cap: list[tuple[int, int, int]] = []
    for block in blocks:
        cap = resolved_options.max_block_chars
        if block.result_ids and resolved_options.tool_result_max_chars:
            cap = min(cap, resolved_options.tool_result_max_chars)
        if block.chars() <= cap:
            continue
        reasoning = block.reasoning_chars()
        if reasoning + len(TRUNCATION_MARK) > cap:
            over_cap.append((block.index, reasoning, cap))
            continue
        texts = cut_texts(block.pieces, cap - reasoning, force=True)
        if texts is None:
            continue
        before = block.tokens()
        messages[block.index] = write_texts(raw_blocks[block.index], block.pieces, texts)
        block.pieces = [TextPiece(text, piece.place) for piece, text in zip(block.pieces, texts, strict=True)]
        truncated.append((block.id, before, block.tokens(), "CHAR_CAP"))
    tokens = [block.tokens() for block in blocks]

    # §4.3 pinned cap
    unpinned = _apply_pinned_cap(blocks, tokens, resolved_options.pinned_cap, budget_value)
    warnings += [unpin_warning(block.id) for block in blocks if block.index in unpinned]

    # §4.4 protection and groups
    current_input = _current_input(blocks) if resolved_options.protect_current_input else None
    protected = [
        block.system_protected
        or block.mandatory
        or (block.pinned and block.index not in unpinned)
        or block.index == current_input
        for block in blocks
    ]
    groups, group_of = _group_blocks(blocks)
    group_protected = [any(protected[i] for i in members) for members in groups]
    group_orphan = [
        any(blocks[i].result_ids for i in members) and not any(blocks[i].calls for i in members)
        for members in groups
    ]
    warnings += [
        over_cap_warning(blocks[i].id, chars, cap)
        for i, chars, cap in over_cap
        if group_protected[group_of[i]]
    ]
    return Analysis(
        budget=budget_value,
        options=resolved_options,
        warnings=warnings,
        blocks=blocks,
        messages=messages,
        tokens=tokens,
        truncated=truncated,
        over_cap=over_cap,
        unpinned=unpinned,
        protected=protected,
        groups=groups,
        group_of=group_of,
        group_protected=group_protected,
        group_orphan=group_orphan,
    )


# --------------------------------------------------------------------------------------------
# §4.4-§6 Strategy, repair, recount, result
# --------------------------------------------------------------------------------------------


def _kept_reason(analysis: Analysis, block: Block) -> str:
    """§5."""
    if block.system_protected:
        return "PROTECTED_SYSTEM"
    if block.mandatory:
        return "MANDATORY"
    if analysis.protected[block.index]:
        return "PINNED"  # pinned (after the cap) or the current input
    if analysis.group_protected[analysis.group_of[block.index]]:
        return "TOOL_GROUP"
    return "FITS"


def _is_user_turn(analysis: Analysis, index: int) -> bool:
    """§4.5: a message block with role user alone in its group."""
    block = analysis.blocks[index]
    return (
        block.kind == "message"
        and block.role == "user"
        and len(analysis.groups[analysis.group_of[index]]) == 1
    )


def _repair(analysis: Analysis, excluded: dict[int, str], total: int) -> tuple[int | None, int]:
    """§4.5 on the cut in `excluded` (changed in place), whose kept blocks hold `total` tokens.
    Returns the anchor (or None) and the tokens the repair removed."""

    def exclude_group(group: int, reason: str) -> None:
        earliest, *others = analysis.groups[group]
        excluded[earliest] = reason
        excluded.update(dict.fromkeys(others, "TOOL_GROUP"))

    # 1. The leading groups, and the first kept history block after them.
    leading: list[int] = []
    first = None
    for block in analysis.blocks:
        group = analysis.group_of[block.index]
        if block.index in excluded or block.kind != "message" or block.role == "system" or group in leading:
            continue
        if block.role != "assistant" or analysis.group_protected[group]:
            first = block.index
            break
        leading.append(group)
    if not leading:
        return None, 0
    removed = sum(analysis.group_tokens(g) for g in leading)

    # 2. A user turn kept before the current input: the leading groups go.
    current = _current_input(analysis.blocks)
    end = -1 if current is None else current  # no current input: no user turn at all
    start = end if first is None else first
    kept_turn = any(i not in excluded and _is_user_turn(analysis, i) for i in range(start, end))
    candidates = [
        i for i in range(end) if excluded.get(i) == "BUDGET_OLDEST_FIRST" and _is_user_turn(analysis, i)
    ]
    # 3. Else the latest user turn the budget removed is the anchor, if it can be afforded.
    removable = sum(
        t
        for i, t in enumerate(analysis.tokens)
        if i not in excluded and not analysis.group_protected[analysis.group_of[i]]
    )
    if kept_turn or not candidates or total + analysis.tokens[candidates[-1]] - removable > analysis.budget:
        for group in leading:
            exclude_group(group, "LEADING_ASSISTANT")
        return None, removed
    anchor = candidates[-1]
    del excluded[anchor]
    total += analysis.tokens[anchor]
    removed = 0
    for group in leading:
        if analysis.groups[group][0] < anchor:
            exclude_group(group, "LEADING_ASSISTANT")
            total -= analysis.group_tokens(group)
            removed += analysis.group_tokens(group)
    # Paid for by the oldest kept groups after it (§4.4's walk, the anchor spared).
    for group, members in enumerate(analysis.groups):
        if total <= analysis.budget:
            break
        if analysis.group_protected[group] or members[0] in excluded or anchor in members:
            continue
        exclude_group(group, "BUDGET_OLDEST_FIRST")
        total -= analysis.group_tokens(group)
        removed += analysis.group_tokens(group)
    return anchor, removed


def repair_warning(analysis: Analysis, anchor: int | None, removed: int, cut: int) -> str:
    """§6: the warning of a repair that removed more than a quarter of the `cut` tokens the cut
    kept. The wording is the library's (service/contextshift/shift.py)."""
    if anchor is None:
        return f"start_on_user: removed {removed} of the {cut} tokens the cut kept so the history starts on a user turn"
    return (
        f"start_on_user: kept {analysis.blocks[anchor].id} as the anchor (ANCHOR_USER_TURN) and removed "
        f"{removed} of the {cut} tokens the cut kept to pay for it"
    )


def reference_shift(
    blocks: Sequence[dict[str, object]],
    *,
    budget: BudgetSpec,
    options: dict[str, object] | None = None,
) -> RefResult:
    """The whole shift of docs/semantics.md for profile "heuristic" and strategy "truncate"."""
    analysis = analyze(blocks, budget=budget, options=options)
    warnings = list(analysis.warnings)
    excluded: dict[int, str] = {}  # block index -> reason

    def exclude_group(group: int, reason: str) -> None:
        earliest, *others = analysis.groups[group]
        excluded[earliest] = reason
        for i in others:
            excluded[i] = "TOOL_GROUP"

    # Orphan groups, always, unless protected.
    for group in range(len(analysis.groups)):
        if analysis.group_orphan[group] and not analysis.group_protected[group]:
            exclude_group(group, "ORPHAN_TOOL_RESULT")

    # Blocks whose reasoning alone is over the cap go whole (§4.2), unless protected.
    strategy_excluded = False
    for index, _, _ in analysis.over_cap:
        group = analysis.group_of[index]
        members = analysis.groups[group]
        if not analysis.group_protected[group] and members[0] not in excluded:
            exclude_group(group, "REASONING_OVER_CAP")
            strategy_excluded |= any(analysis.blocks[i].kind == "message" for i in members)

    # truncate: oldest unprotected group first, stop as soon as it fits.
    total = sum(tokens for i, tokens in enumerate(analysis.tokens) if i not in excluded)
    for group, members in enumerate(analysis.groups):
        if analysis.group_protected[group] or members[0] in excluded:
            continue
        if total <= analysis.budget:
            break
        exclude_group(group, "BUDGET_OLDEST_FIRST")
        total -= analysis.group_tokens(group)
        strategy_excluded = True
    if total > analysis.budget:
        raise RefBudgetExceeded(total, analysis.budget)

    # §4.5 Repair: the history starts on a user turn.
    anchor: int | None = None
    if analysis.options.start_on_user and strategy_excluded:
        anchor, removed = _repair(analysis, excluded, total)
        if removed * 4 > total:
            warnings.append(repair_warning(analysis, anchor, removed, total))

    for i in analysis.unpinned:
        if i in excluded:
            excluded[i] = "UNPINNED_BY_CAP"

    # Recount the kept blocks independently: re-parse the messages we return.
    kept: list[Decision] = []
    messages: list[dict[str, object]] = []
    for block in analysis.blocks:
        if block.index in excluded:
            continue
        message = analysis.messages[block.index]
        recounted = parse_block(block.index, message, [])
        assert recounted is not None
        reason = "ANCHOR_USER_TURN" if block.index == anchor else _kept_reason(analysis, block)
        kept.append((block.id, recounted.tokens(), reason))
        messages.append(message)
    prompt_tokens = sum(tokens for _, tokens, _ in kept) + PROMPT_OVERHEAD
    assert prompt_tokens <= analysis.budget, "reference bug: over budget"

    return RefResult(
        kept=kept,
        excluded=[
            (b.id, analysis.tokens[b.index], excluded[b.index])
            for b in analysis.blocks
            if b.index in excluded
        ],
        truncated=analysis.truncated,
        prompt_tokens=prompt_tokens,
        budget=analysis.budget,
        warnings=warnings,
        messages=messages,
    )


def reference_count_tokens(items: Sequence[str | dict[str, object]]) -> list[int]:
    """count_tokens: a str counts as text, a dict as a whole block (no char cap)."""
    counts: list[int] = []
    errors: list[str] = []
    for index, item in enumerate(items):
        if isinstance(item, str):
            counts.append(text_tokens(item))
            continue
        block = parse_block(index, item, errors)
        counts.append(block.tokens() if block is not None else 0)
    if errors:
        raise RefInvalid(errors, "blocks")
    return counts

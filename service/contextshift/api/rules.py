"""The rules of request fields that the .proto cannot state: which are required, which are ids,
which values of an enum a request may send, and the least value of a number. One table, read by
both the checks the servicer makes (`violations`, for gRPC and HTTP alike) and the OpenAPI document
(`contextshift.api.openapi`), so the document says what the server enforces and the two cannot
drift. Rules that join several fields stay in the servicer, and the document states them too
(`openapi.CONDITIONS`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.message import Message

from contextshift.budget import MAX_TOKENS
from contextshift.errors import FieldViolation

MAX_ID_CHARS = 256
# C0 and C1 control characters, refused in ids (a log line or a terminal would act on them).
CONTROL = "\u0000-\u001f\u007f-\u009f"
_CONTROL_CHARACTER = re.compile(f"[{CONTROL}]")  # one search, not a test per character
# The same rule as a JSON Schema pattern (ECMA 262): one or more characters, none a control one.
ID_PATTERN = f"^[^{CONTROL.encode('unicode_escape').decode()}]+$"


@dataclass(frozen=True)
class Rule:
    """What a request field must be beyond its type."""

    required: bool = False
    # A chat, generation or model id: 1 to MAX_ID_CHARS characters, no control characters.
    id: bool = False
    # The enum values (names) a request may send, when not all of them.
    values: tuple[str, ...] = ()
    # The least and the greatest value of a number, when it is set.
    minimum: int | None = None
    maximum: int | None = None
    # What a string (each string of a repeated field) must match, as a JSON Schema pattern.
    pattern: str = ""
    # A named kind of string the OpenAPI document marks with `format` (a profile or model name,
    # a strategy name), checked by the server against what it knows.
    format: str = ""


_ID = Rule(id=True)
# A profile or model name ("" where a field may be left empty: not given).
_PROFILE = Rule(format="contextshift-profile")
_PROFILE_NAME = Rule(format="contextshift-profile-name")
_LIMIT = Rule(minimum=1, maximum=MAX_TOKENS)
_RESERVE = Rule(minimum=0, maximum=MAX_TOKENS)
_WINDOW = {"context_limit": _LIMIT, "response_reserve": _RESERVE, "system_reserve": _RESERVE}
_REQUIRED_ID = Rule(required=True, id=True)
_ROLES = ("ROLE_SYSTEM", "ROLE_USER", "ROLE_ASSISTANT", "ROLE_TOOL")
_TERMINAL = ("GENERATION_STATUS_COMPLETED", "GENERATION_STATUS_FAILED", "GENERATION_STATUS_CANCELLED")

# Message full name -> field name (.proto) -> rule.
RULES: Mapping[str, Mapping[str, Rule]] = {
    "contextshift.v1.ShiftContextRequest": {
        "chat_id": _ID,
        "generation_id": _ID,
        "model": _ID,
        "profile": _PROFILE,
        "strategy": Rule(format="contextshift-strategy"),
        **_WINDOW,
    },
    "contextshift.v1.PreviewContextRequest": {
        "chat_id": _ID,
        "model": _ID,
        "profile": _PROFILE,
        "strategy": Rule(format="contextshift-strategy"),
        **_WINDOW,
    },
    "contextshift.v1.CountTokensRequest": {"model": _ID, "profile": _PROFILE},
    "contextshift.v1.Block": {"role": Rule(required=True, values=_ROLES)},
    "contextshift.v1.BenchmarkProfilesRequest": {
        # Some text to count (an all-blank corpus has no messages).
        "documents": Rule(pattern="\\S"),
        "profiles": _PROFILE_NAME,
    },
    "contextshift.v1.GetContextAuditRequest": {"chat_id": _REQUIRED_ID},
    # page_size 0: the default page; above the largest page: the largest (AIP-158).
    "contextshift.v1.ListChatsRequest": {
        "page_size": Rule(minimum=0),
        "page_token": Rule(format="contextshift-page-token"),
    },
    "contextshift.v1.DeleteChatRequest": {"chat_id": _REQUIRED_ID},
    "contextshift.v1.AppendBlocksRequest": {"chat_id": _REQUIRED_ID, "model": _ID, "profile": _PROFILE},
    "contextshift.v1.FinishGenerationRequest": {
        "generation_id": _REQUIRED_ID,
        "chat_id": _ID,
        "status": Rule(required=True, values=_TERMINAL),
        "reported_prompt_tokens": _LIMIT,
    },
    "contextshift.v1.SetModelConfigRequest": {"config": Rule(required=True)},
    "contextshift.v1.ModelConfig": {
        "model": _REQUIRED_ID,
        "context_size": _LIMIT,
        "max_output_tokens": _RESERVE,
        "system_reserve": _RESERVE,
        "profile": _PROFILE,
    },
    "contextshift.v1.GetModelConfigRequest": {"model": _ID},
    "contextshift.v1.DeleteModelConfigRequest": {"model": _REQUIRED_ID},
}


@dataclass(frozen=True)
class Condition:
    """A rule joining two fields of a message: `not_both` (set at most one of `a` and `b`),
    `either` (set at least one), `needs` (`a` set needs `b` set), `only_with` (`a` set needs
    `b` to hold `value`). A field is set when it holds other than its default."""

    kind: str
    a: str
    b: str
    value: str = ""
    why: str = ""
    # The field a violation names (default `a`).
    at: str = ""


_BLOCKS = Condition(
    "not_both", "blocks", "blocks_json", why="set either blocks or blocks_json, not both", at="blocks_json"
)
_ROLE = Condition(
    "not_both", "model", "model_role", why="set either model or model_role, not both", at="model_role"
)
_FAILED = "GENERATION_STATUS_FAILED"

# ShiftContext's and PreviewContext's.
_SHIFT = (
    _BLOCKS,
    _ROLE,
    Condition(
        "needs", "use_stored_history", "chat_id", why="needs chat_id: the chat whose stored history to use"
    ),
)

CONDITIONS: Mapping[str, tuple[Condition, ...]] = {
    "contextshift.v1.ShiftContextRequest": _SHIFT,
    "contextshift.v1.PreviewContextRequest": _SHIFT,
    "contextshift.v1.AppendBlocksRequest": (
        _BLOCKS,
        _ROLE,
        Condition("either", "blocks", "blocks_json", why="nothing to append: set blocks or blocks_json"),
    ),
    "contextshift.v1.FinishGenerationRequest": (
        Condition("only_with", "error_code", "status", _FAILED, why="only with status FAILED"),
        Condition("only_with", "provider_error", "status", _FAILED, why="only with status FAILED"),
        Condition(
            "not_both",
            "error_code",
            "provider_error",
            why="set provider_error or the deprecated error_code, not both",
        ),
    ),
}


# Messages with a oneof of which a request must set one member: the oneof, and what a message
# with none set is told.
ONEOF_REQUIRED: Mapping[str, tuple[str, str]] = {
    "contextshift.v1.Part": (
        "part",
        "empty part: set text, image, tool_result, thinking or redacted_thinking",
    ),
    "contextshift.v1.CountItem": ("item", "empty item: set text or block"),
}


def is_set(message: Message, name: str) -> bool:
    """Whether a field holds other than its default (a message field: is present)."""
    field = message.DESCRIPTOR.fields_by_name[name]
    if field.is_repeated:
        return bool(getattr(message, name))
    if field.message_type is not None or field.has_presence:
        return message.HasField(name)
    return bool(getattr(message, name))


def _broken(condition: Condition, message: Message) -> bool:
    a, b = is_set(message, condition.a), is_set(message, condition.b)
    if condition.kind == "not_both":
        return a and b
    if condition.kind == "either":
        return not (a or b)
    if condition.kind == "needs":
        return a and not b
    enum = message.DESCRIPTOR.fields_by_name[condition.b].enum_type
    assert enum is not None  # only_with names an enum's value
    return a and getattr(message, condition.b) != enum.values_by_name[condition.value].number


def range_problem(rule: Rule, value: int) -> str | None:
    """What is wrong with a number under `rule`, if anything."""
    low = rule.minimum if rule.minimum is not None else -MAX_TOKENS
    high = rule.maximum if rule.maximum is not None else MAX_TOKENS
    if low <= value <= high:
        return None
    return f"must be between {low} and {high}, got {value}"


def id_violations(field: str, value: str, *, required: bool = True) -> list[FieldViolation]:
    """A chat, generation or model id: 1 to 256 characters, no control characters."""
    if not value:
        return [FieldViolation(field, "required")] if required else []
    if len(value) > MAX_ID_CHARS:
        return [FieldViolation(field, f"at most {MAX_ID_CHARS} characters, got {len(value)}")]
    if _CONTROL_CHARACTER.search(value):
        return [FieldViolation(field, "must not contain control characters")]
    return []


def violations(message: Message, prefix: str = "") -> list[FieldViolation]:
    """What breaks the rules of `message` (and of its rule-bearing message fields), each field
    named by its path (`config.model`)."""
    found: list[FieldViolation] = []
    descriptor = message.DESCRIPTOR
    for name, rule in RULES.get(descriptor.full_name, {}).items():
        field = descriptor.fields_by_name[name]
        path = f"{prefix}{name}"
        if field.message_type is not None:
            if message.HasField(name):
                found += violations(getattr(message, name), f"{path}.")
            elif rule.required:
                found.append(FieldViolation(path, "required"))
            continue
        value = getattr(message, name)
        if rule.id:
            found += id_violations(path, value, required=rule.required)
        elif field.enum_type is not None and rule.values:
            shown = field.enum_type.values_by_number.get(value)
            if shown is None or shown.name not in rule.values:
                what = (
                    "not set"
                    if value == 0
                    else f"{shown.name} is not allowed"
                    if shown
                    else f"unknown value {value}"
                )
                found.append(FieldViolation(path, f"{what}: one of {', '.join(rule.values)}"))
        elif rule.minimum is not None and (not field.has_presence or message.HasField(name)):
            problem = range_problem(rule, value)
            if problem:
                found.append(FieldViolation(path, problem))
    for condition in CONDITIONS.get(descriptor.full_name, ()):
        if _broken(condition, message):
            found.append(FieldViolation(f"{prefix}{condition.at or condition.a}", condition.why))
    return found

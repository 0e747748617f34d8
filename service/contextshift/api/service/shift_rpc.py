"""ShiftContext and PreviewContext over the library: a request, read with its `blocks_json` apart
and checked once (`read_request`), becomes a `shift_context` call with what the store holds for it
(the model's configuration, the chat's stored history) and the chat's last prompt, and its result
the reply's ContextPlan (`shift`). Plain CPU work: `placement` decides where it runs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic

from google.protobuf.message import DecodeError

from contextshift import engine, history
from contextshift._proto.contextshift.v1 import context_service_pb2
from contextshift.api import rules
from contextshift.api.service import chat_header
from contextshift.api.service.blocks import block_dict, renamed, typed_field
from contextshift.api.service.model_configs import role_of
from contextshift.api.service.plans import R, Shifted, encode_plan
from contextshift.api.service.requests import Model, options_of, resolve_model, window
from contextshift.api.service.rpc_status import bad_fields, invalid, undecodable
from contextshift.api.service.store_view import StoreView
from contextshift.audit.store import Role
from contextshift.budget import Budget
from contextshift.cache_stable import PreviousPrompt
from contextshift.errors import InvalidInput, InvalidTools
from contextshift.shift import shift_context
from contextshift.strategies import DEFAULT_STRATEGY, strategy_named

_OUTPUT_FORMATS = frozenset(context_service_pb2.OutputFormat.values())  # values() builds a list per call


@dataclass(frozen=True)
class ShiftCall(Generic[R]):
    """A ShiftContext or PreviewContext request as read and checked, once: the message without
    its `blocks_json`, that JSON as UTF-8 bytes (empty when not set), the model role it names,
    and the size of the encoded request."""

    request: R
    blocks_json: bytes
    role: Role
    size: int


def read_request(message: bytes, request_type: type[R]) -> ShiftCall[R]:
    """An encoded ShiftContext or PreviewContext request, parsed with its `blocks_json` taken out
    as bytes for the core to parse (40 KB of JSON never becomes a str), and checked: every rule
    of its fields (`rules`), the chat its `x-chat-id` header names (`chat_header`), and what the
    split hides from them."""
    try:
        rest, blocks_json = engine.split_message_field(message, request_type.BLOCKS_JSON_FIELD_NUMBER)
        request = request_type.FromString(rest)
    except (ValueError, DecodeError) as e:
        raise undecodable(request_type.DESCRIPTOR.full_name, message) from e
    blocks_json = blocks_json or b""
    if request.blocks and blocks_json:
        raise invalid("blocks_json", "set either blocks or blocks_json, not both")
    if request.output_format not in _OUTPUT_FORMATS:
        raise invalid("output_format", f"unknown value {request.output_format}")
    violations = rules.violations(request) + chat_header.violations(request.chat_id)
    if violations:
        raise bad_fields(violations)
    return ShiftCall(request, blocks_json, role_of(request.model_role, "model_role"), len(message))


def shift(
    call: ShiftCall[R], defaults: Budget, store: StoreView, previous: PreviousPrompt | None = None
) -> Shifted[R]:
    """Run the shift a checked request asks for, with what `store` holds for it, against the
    chat's last prompt `previous` (a cache-stable shift; None: none)."""
    start, read_before = time.perf_counter(), store.read_seconds
    request = call.request
    # Annotated: mypy checks this body once per request type, and defers across the package.
    model: Model = resolve_model(request.profile, request.model, call.role, store)
    budget = window(request, model.resolution, defaults, model.config)
    joined: history.Joined | None
    blocks, joined = _blocks(call, store, model.resolution.profile)
    strategy = strategy_named(request.strategy or DEFAULT_STRATEGY)
    try:
        result = shift_context(
            blocks,
            budget=budget.as_budget(),
            profile=model.resolution.profile,
            strategy=strategy.name,
            options=options_of(request.options, strategy) if request.HasField("options") else None,
            model=model.resolution.model,  # the calibration key of an approximate profile
            calibration_source=store,
            known_tokens=joined.known_tokens if joined else None,
            previous=previous,
            tools=request.tools_json or None,
        )
    except InvalidInput as e:
        raise _as_requested(e, call, joined) from e
    warnings = [*model.resolution.warnings, *(joined.warnings if joined else ())]
    encoded = encode_plan(result, budget, warnings, request.output_format)
    seconds = time.perf_counter() - start - (store.read_seconds - read_before)
    return Shifted(request, result, result.block_count, encoded, seconds)


def _blocks(
    call: ShiftCall[R], store: StoreView, profile: str
) -> tuple[list[dict[str, Any]] | bytes, history.Joined | None]:
    """The request's blocks as the library takes them (its typed blocks as dicts, or its
    `blocks_json`), after the chat's stored history when it asks for it."""
    request, blocks_json = call.request, call.blocks_json
    typed = [block_dict(b, f"blocks[{i}]") for i, b in enumerate(request.blocks)]
    blocks: list[dict[str, Any]] | bytes = typed if request.blocks else blocks_json or b"[]"
    stored = store.history(request.chat_id, profile) if request.use_stored_history else ()
    if not stored:
        return blocks, None
    joined = history.join(stored, history.typed_texts(typed) if request.blocks else blocks_json or b"[]")
    return joined.json, joined


def _as_requested(error: InvalidInput, call: ShiftCall[R], joined: history.Joined | None) -> InvalidInput:
    """The library's error with its fields named as the request names them: `tools_json`, typed
    blocks' fields, request blocks by their index in the request, stored ones as `history[i]`."""
    if isinstance(error, InvalidTools):
        return renamed(error, lambda field: re.sub(r"^tools\b", "tools_json", field))
    if joined and any(v.field == "blocks_json" for v in error.violations):
        history.request_texts(call.blocks_json)  # raises the request's own error, at its own offsets
    rename: Callable[[str], str] = typed_field if call.request.blocks else lambda field: field
    return history.renamed(error, joined.stored if joined else 0, rename)

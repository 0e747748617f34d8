"""ShiftContext and PreviewContext over the library: a request, read with its `blocks_json` apart,
becomes a `shift_context` call with what the store holds for it (the model's configuration, the
chat's history and last prompt), and its result the reply's ContextPlan.

Plain CPU work, run on the engine threads (or, for small requests, on the event loop: see
`ContextShiftService._run`), except the shifts of strategies that wait (llm-compact on its
endpoint, plugin strategies), which run on the io threads.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.protobuf.message import DecodeError

from contextshift import engine, history
from contextshift._proto.contextshift.v1 import context_service_pb2
from contextshift.api import rules
from contextshift.api.service.blocks import block_dict, renamed, typed_field
from contextshift.api.service.errors import bad_fields, invalid, undecodable
from contextshift.api.service.plans import EncodedPlan, encode_plan
from contextshift.api.service.requests import options_of, resolve_model, window
from contextshift.api.service.store_view import NO_STORE, StoreView
from contextshift.budget import Budget
from contextshift.cache_stable import PreviousPrompt
from contextshift.errors import InvalidInput, InvalidTools
from contextshift.profiles import Resolution
from contextshift.result import ShiftResult
from contextshift.shift import shift_context
from contextshift.strategies import DEFAULT_STRATEGY, strategy_named

# One of the two: what a shift was asked with is what it hands back.
R = TypeVar("R", context_service_pb2.ShiftContextRequest, context_service_pb2.PreviewContextRequest)
_OUTPUT_FORMATS = frozenset(context_service_pb2.OutputFormat.values())  # values() builds a list per call


@dataclass(frozen=True)
class Shifted(Generic[R]):
    """A served shift: the request as read (without `blocks_json`), the library's result, the
    number of blocks it shifted (the stored history's too), the reply's ContextPlan, and the
    shift's own time (`shift`, without its reads of the store)."""

    request: R
    result: ShiftResult
    blocks: int
    plan: EncodedPlan
    seconds: float


def read_shift_request(message: bytes, request_type: type[R]) -> tuple[R, bytes]:
    """An encoded ShiftContext or PreviewContext request, parsed, with its `blocks_json` taken out
    as UTF-8 bytes (empty when not set) for the core to parse: 40 KB of JSON never becomes a str."""
    try:
        rest, blocks_json = engine.split_message_field(message, request_type.BLOCKS_JSON_FIELD_NUMBER)
        return request_type.FromString(rest), blocks_json or b""
    except (ValueError, DecodeError) as e:
        raise undecodable(request_type.DESCRIPTOR.full_name, message) from e


def shift(request: R, blocks_json: bytes, defaults: Budget, store: StoreView = NO_STORE) -> Shifted[R]:
    """Run the shift a ShiftContext or PreviewContext request asks for (as `read_shift_request`
    gives it), with what `store` holds for it."""
    start, read_before = time.perf_counter(), store.read_seconds
    if request.blocks and blocks_json:  # `request` comes without its blocks_json (read_shift_request)
        raise invalid("blocks_json", "set either blocks or blocks_json, not both")
    if request.output_format not in _OUTPUT_FORMATS:
        raise invalid("output_format", f"unknown value {request.output_format}")
    violations = rules.violations(request)
    if violations:
        raise bad_fields(violations)
    model = resolve_model(request.profile, request.model, request.model_role, store)
    resolution: Resolution = model.resolution  # annotated: mypy cannot infer it across the import cycle
    budget = window(request, resolution, defaults, model.config)
    joined: history.Joined | None
    blocks, joined = _blocks(request, blocks_json, store, resolution.profile)
    strategy = strategy_named(request.strategy or DEFAULT_STRATEGY)
    try:
        result = shift_context(
            blocks,
            budget=budget.as_budget(),
            profile=resolution.profile,
            strategy=strategy.name,
            options=options_of(request.options, strategy) if request.HasField("options") else None,
            model=resolution.model,  # the calibration key of an approximate profile
            calibration_source=store,
            known_tokens=joined.known_tokens if joined else None,
            # A chat's shifts are cache-stable from its first (an empty previous prompt).
            previous=(store.previous_prompt(request.chat_id) or PreviousPrompt())
            if request.chat_id
            else None,
            tools=request.tools_json or None,
        )
    except InvalidInput as e:
        raise _as_requested(e, request, blocks_json, joined) from e
    warnings = [*resolution.warnings, *(joined.warnings if joined else ())]
    encoded = encode_plan(result, budget, warnings, request.output_format)
    seconds = time.perf_counter() - start - (store.read_seconds - read_before)
    return Shifted(request, result, result.block_count, encoded, seconds)


def _blocks(
    request: R, blocks_json: bytes, store: StoreView, profile: str
) -> tuple[list[dict[str, Any]] | bytes, history.Joined | None]:
    """The request's blocks as the library takes them (its typed blocks as dicts, or its
    `blocks_json`), after the chat's stored history when it asks for it."""
    typed = [block_dict(b, f"blocks[{i}]") for i, b in enumerate(request.blocks)]
    blocks: list[dict[str, Any]] | bytes = typed if request.blocks else blocks_json or b"[]"
    stored = store.history(request.chat_id, profile) if request.use_stored_history else ()
    if not stored:
        return blocks, None
    joined = history.join(stored, history.typed_texts(typed) if request.blocks else blocks_json or b"[]")
    return joined.json, joined


def _as_requested(
    error: InvalidInput, request: R, blocks_json: bytes, joined: history.Joined | None
) -> InvalidInput:
    """The library's error with its fields named as the request names them: `tools_json`, typed
    blocks' fields, request blocks by their index in the request, stored ones as `history[i]`."""
    if isinstance(error, InvalidTools):
        return renamed(error, lambda field: re.sub(r"^tools\b", "tools_json", field))
    if joined and any(v.field == "blocks_json" for v in error.violations):
        history.request_texts(blocks_json)  # raises the request's own error, at its own offsets
    rename: Callable[[str], str] = typed_field if request.blocks else lambda field: field
    return history.renamed(error, joined.stored if joined else 0, rename)

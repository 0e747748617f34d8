"""The audit of a ShiftContext: encoded once from the reply's own pieces, compressed, stored, and
read back for GetContextAudit; what FinishGeneration reports of it; and the guard that keeps a
cancelled call from leaving half of one.

The stored payload is the encoded ContextAudit minus what FinishGeneration changes (status, error,
reported tokens, finish time: the generation's columns) and minus the messages' text, compressed
as an LZ4 frame (fast on the path every audited shift waits for). Its plan is the reply's plan
without the kept and excluded lists (`blocks` has every decision in order). The messages' text is
stored as the chat's blocks, each once (`engine.store_messages`: a next turn stores only its new
messages), and rebuilt from them on reading; an array that cannot be rebuilt from its elements
stays in the payload. Neither is stored when the server runs with `audit_messages = false`.
"""

from __future__ import annotations

import threading
from typing import Any

import lz4.frame

from contextshift import engine
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api.service.ids import timestamp
from contextshift.api.service.plans import Shifted
from contextshift.audit.provider_errors import ErrorCode, normalize
from contextshift.audit.store import (
    AuditKey,
    Generation,
    GenerationReport,
    ShiftRecord,
    Status,
    StoreDamaged,
    StoredAudit,
    Unchecked,
)
from contextshift.cache_stable import PreviousPrompt
from contextshift.calibration import Calibration
from contextshift.result import ShiftResult

STATUSES = {
    Status.PENDING: pb.GENERATION_STATUS_PENDING,
    Status.COMPLETED: pb.GENERATION_STATUS_COMPLETED,
    Status.FAILED: pb.GENERATION_STATUS_FAILED,
    Status.CANCELLED: pb.GENERATION_STATUS_CANCELLED,
}
ERROR_CODES = {code: pb.ProviderErrorCode.Value(f"PROVIDER_ERROR_CODE_{code.value}") for code in ErrorCode}


def generation(shifted: Shifted[pb.ShiftContextRequest], generation_id: str, created_ms: int) -> Generation:
    """The generation a ShiftContext stores: what FinishGeneration needs to calibrate with."""
    result = shifted.result
    return Generation(
        generation_id=generation_id,
        chat_id=shifted.request.chat_id,
        model=result.model or "",
        prompt_tokens=result.prompt_tokens,
        approximate=result.approximate,
        created_ms=created_ms,
    )


def stores_generation(shifted: Shifted[Any]) -> bool:
    """Whether a shift's generation is stored (`generation_stored`)."""
    result = shifted.result
    return generation_stored(shifted.request.chat_id, result.approximate, result.model or "")


def generation_stored(chat_id: str, approximate: bool, model: str) -> bool:
    """Whether the generation of a shift of `chat_id` (or none) counted under an `approximate`
    profile for `model` is stored: with its chat's audit, or for FinishGeneration to calibrate an
    approximate profile's counts for its model."""
    return bool(chat_id or (approximate and model))


def encode(
    shifted: Shifted[pb.ShiftContextRequest],
    generation_id: str,
    created_ms: int,
    timings: pb.AuditTimings,
    *,
    messages: bool,
    text: bytes | None,
) -> bytes:
    """The stored payload of a shift's audit: with its messages' fields when `messages`, and their
    text when given (else stored as blocks)."""
    request, plan = shifted.request, shifted.plan
    head = pb.ContextAudit(
        generation_id=generation_id,
        chat_id=request.chat_id,
        provider=request.provider,
        model=shifted.result.model or "",
        timings=timings,
        create_time=timestamp(created_ms),
        messages_omitted=not messages,
    )
    plan_pieces: list[engine.Piece] = [plan.fields, plan.messages(text)] if messages else [plan.fields]
    encoded = engine.encode_pieces(
        [
            head.SerializeToString(),
            (pb.ContextAudit.PLAN_FIELD_NUMBER, plan_pieces),
            _ordered_blocks(shifted.result),
        ]
    )
    compressed: bytes = lz4.frame.compress(encoded)
    return compressed


def _ordered_blocks(result: ShiftResult) -> bytes:
    """Every block's decision in the prompt's order, as ContextAudit.blocks: by the core straight
    from the engine's plan, or from the decisions a strategy adjusted (a summary, relabels)."""
    if isinstance(result.decisions, engine.Plan):
        return result.decisions.encode_ordered_decisions(pb.ContextAudit.BLOCKS_FIELD_NUMBER)
    blocks = [
        pb.AuditBlock(id=d.id, tokens=d.tokens, reason=d.reason, kept=kept)
        for d, kept in result.ordered_decisions()
    ]
    return pb.ContextAudit(blocks=blocks).SerializeToString()


def decode(stored: StoredAudit) -> pb.ContextAudit:
    """A stored audit as GetContextAudit returns it (read with its blocks), with its generation's
    current status. StoreDamaged when its messages do not rebuild from the chat's blocks."""
    encoded: bytes = lz4.frame.decompress(stored.payload)
    audit = pb.ContextAudit.FromString(encoded)
    if stored.message_refs is not None:
        rebuilt = engine.rebuild_messages(stored.message_refs, stored.segments)
        audit.plan.messages.messages_json = rebuilt.decode()
    g = stored.generation
    audit.status = STATUSES[g.status]
    if g.error_code:
        audit.provider_error_code = ERROR_CODES[ErrorCode(g.error_code)]
    if g.reported_prompt_tokens is not None:
        audit.reported_prompt_tokens = g.reported_prompt_tokens
    if g.finished_ms is not None:
        audit.finish_time.CopyFrom(timestamp(g.finished_ms))
    return audit


# Where a ContextAudit's summary id lies: its plan's summary's id.
_SUMMARY_ID = (
    pb.ContextAudit.PLAN_FIELD_NUMBER,
    pb.ContextPlan.SUMMARY_FIELD_NUMBER,
    pb.SummaryInfo.ID_FIELD_NUMBER,
)


def previous_prompt(stored: StoredAudit) -> PreviousPrompt:
    """The prompt a stored audit records, as the `previous` of the chat's next shift, read by the
    core from the encoded audit (no per-block Python): the empty one when it left nothing out,
    since a next shift carries only what its previous prompt left out (`cache_stable.carried`),
    as a prompt this process kept after writing it. StoreDamaged when the audit cannot be read."""
    try:
        found = engine.read_previous_prompt(
            lz4.frame.decompress(stored.payload), pb.ContextAudit.BLOCKS_FIELD_NUMBER, _SUMMARY_ID
        )
    except (RuntimeError, ValueError) as e:  # lz4's, the core's
        chat = stored.generation.chat_id
        raise StoreDamaged(f"the audit of chat {chat!r} cannot be read: {e}") from e
    return PreviousPrompt() if found is None else PreviousPrompt(*found)


class AuditWrite:
    """Whether a ShiftContext's audit may still be written, decided between the call (on the event
    loop) and its engine thread, so that a call cancelled by its client or its deadline leaves the
    chat's previous audit intact, or its own marked CANCELLED, never one its caller did not get:

    - cancelled before the thread `begin`s the write: nothing is written;
    - cancelled while it writes: the thread marks the generation CANCELLED after the commit (`end`
      says so);
    - cancelled after the write (the reply not sent yet): the call marks it (`cancel` says so).
    A transaction commits whole or not at all, so no reader ever sees half of one.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._written = False
        self._cancelled = False

    def begin(self) -> bool:
        """On the thread, before writing: False when the call was cancelled (write nothing)."""
        with self._lock:
            return not self._cancelled

    def end(self) -> bool:
        """On the thread, after the write committed: True when the call was cancelled meanwhile,
        so the thread must mark the generation CANCELLED."""
        with self._lock:
            self._written = True
            return self._cancelled

    def cancel(self) -> bool:
        """On the event loop, when the call is cancelled: True when the audit was already written,
        so the call must mark the generation CANCELLED (while writing, the thread does)."""
        with self._lock:
            self._cancelled = True
            return self._written


_TERMINAL = {
    pb.GENERATION_STATUS_COMPLETED: Status.COMPLETED,
    pb.GENERATION_STATUS_FAILED: Status.FAILED,
    pb.GENERATION_STATUS_CANCELLED: Status.CANCELLED,
}


def _error_code(request: pb.FinishGenerationRequest) -> ErrorCode | None:
    """The normalized provider error of a report (None unless FAILED); only this is stored."""
    if request.status != pb.GENERATION_STATUS_FAILED:
        return None
    if request.HasField("provider_error"):
        e = request.provider_error
        return normalize(e.http_status, e.type, e.code, e.message)
    return normalize(code=request.error_code) if request.error_code else ErrorCode.UNKNOWN


def report(request: pb.FinishGenerationRequest) -> GenerationReport:
    """What a checked FinishGeneration reports to the store."""
    code = _error_code(request)
    return GenerationReport(
        request.generation_id,
        _TERMINAL[request.status],
        request.chat_id,
        code.value if code else None,
        request.reported_prompt_tokens if request.HasField("reported_prompt_tokens") else None,
    )


def calibration_message(calibration: Calibration | None) -> pb.Calibration | None:
    if calibration is None:
        return None
    return pb.Calibration(model=calibration.model, factor=calibration.factor, samples=calibration.samples)


def stored_blocks(stored: StoredAudit | None) -> engine.StoredBlocks:
    """The blocks a chat holds for its audit `stored` (none for none)."""
    refs = stored.message_refs if stored is not None else None
    return engine.StoredBlocks() if refs is None else engine.StoredBlocks.from_refs(refs)


def record(
    shifted: Shifted[pb.ShiftContextRequest],
    tenant: str,
    generation_id: str,
    created_ms: int,
    made_on: AuditKey | Unchecked | None,
    stored: engine.StoredBlocks,
    timings: pb.AuditTimings,
    *,
    messages: bool,
) -> tuple[ShiftRecord, engine.StoredBlocks]:
    """What the group writer stores of a ShiftContext, and the blocks its chat holds once stored:
    its generation and, with a chat, its audit (checked against the chat's audit `made_on`, the
    one its previous prompt came from, whose blocks are `stored`; none for an unchecked record,
    which then holds all of its own) with its kept and excluded counts (ListChats; as the audit's
    blocks count them, a summary kept)."""
    g = generation(shifted, generation_id, created_ms)
    if not shifted.request.chat_id:
        return ShiftRecord(tenant, g, None, made_on), stored
    text = shifted.plan.messages_json if messages else None
    refs, new, gone, held = engine.store_messages(text, stored)
    payload = encode(
        shifted, generation_id, created_ms, timings, messages=messages, text=None if refs else text
    )
    result = shifted.result
    counts = (result.kept_count, result.excluded_count)
    return ShiftRecord(tenant, g, payload, made_on, *counts, refs, new, gone), held

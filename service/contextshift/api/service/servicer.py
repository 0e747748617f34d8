"""ContextShiftService over the library and the store, read top-down: ShiftContext and
PreviewContext, then the store's RPCs, then the listings.

Where each call's work runs is `placement`'s decision (the event loop for small requests whose
reads the process holds, else the engine or I/O threads). A ShiftContext of a chat is made against
the chat's last prompt as this process knows it (it wrote or read the chat's audit last), else as
the store holds it; its generation and audit go to the process's group writer (`audit.writer`),
which stores them with those of the calls at the same moment in one transaction, checking that the
chat's audit is still the one the shift was made against (else the shift is made again), and wakes
the call once they are committed. A call cancelled by its client or its deadline leaves the chat's
previous audit, or its own marked CANCELLED (`audit_payload.AuditWrite`).

The tenant of every store call is the caller's, as the API key says (`auth.current_tenant`)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from google.rpc import code_pb2

from contextshift import engine
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api import metrics, rules
from contextshift.api.auth import current_tenant
from contextshift.api.service import appends, audit_payload, counting, ids, listings, model_configs, shift_rpc
from contextshift.api.service.audit_payload import AuditWrite
from contextshift.api.service.chat_header import request_violations
from contextshift.api.service.chats import list_chats
from contextshift.api.service.gate import call_stats
from contextshift.api.service.placement import Placement, Work, shift_work
from contextshift.api.service.plans import Shifted
from contextshift.api.service.read_cache import ReadCache
from contextshift.api.service.rpc_status import RequestError, bad_fields, invalid
from contextshift.api.service.shift_rpc import ShiftCall
from contextshift.api.service.store_view import Caches, LastPrompt, TenantStore
from contextshift.audit.provider_errors import ErrorCode
from contextshift.audit.store import (
    UNCHECKED,
    AuditChanged,
    AuditKey,
    GenerationReport,
    NotFound,
    Role,
    ShiftRecord,
    Status,
    Store,
    StoredAudit,
    StoreError,
    Unchecked,
    now_ms,
)
from contextshift.audit.writer import GroupWriter, WriteOutcome
from contextshift.budget import Budget
from contextshift.cache_stable import PreviousPrompt
from contextshift.calibration import ALPHA
from contextshift.errors import FieldViolation
from contextshift.result import ShiftResult

log = logging.getLogger("contextshift.api")

# Tries of a chat's shift whose write finds the chat's audit changed (another process shifted the
# chat meanwhile); the last writes unchecked.
SHIFT_TRIES = 4
# A chat's shift, and the outcome of its write (None: stored).
Written = tuple[Shifted[pb.ShiftContextRequest], WriteOutcome]
# Where a chat's shift is made from: the chat's last prompt, and the audit it is of.
PromptSource = Callable[[TenantStore], LastPrompt]


def _checked(violations: Sequence[FieldViolation]) -> None:
    if violations:
        raise bad_fields(violations)


def _as_previous(result: ShiftResult) -> PreviousPrompt:
    """`result.as_previous()`, short of the kept blocks' list when it left nothing out: a next
    shift carries only what its previous prompt left out (`cache_stable.carried`), so such a
    prompt is the empty one, and the decisions of a chat within its budget are never built."""
    return result.as_previous() if result.excluded_count else PreviousPrompt()


def _prompt_of(chat_id: str, stored: StoredAudit | None, view: TenantStore) -> LastPrompt:
    """The prompt a chat's audit `stored` records."""
    return view.prompt_of(chat_id, stored)


def _work(call: ShiftCall[Any]) -> Work:
    """Where a shift runs: a chat's stored history, and a preview's chat, are read from the store
    (never cached)."""
    request = call.request
    reads_stored = request.use_stored_history or (
        isinstance(request, pb.PreviewContextRequest) and bool(request.chat_id)
    )
    return shift_work(request.strategy, request.profile, request.model, call.size, reads_stored=reads_stored)


@dataclass(frozen=True, slots=True)
class _AuditedCall:
    """One ShiftContext call: what its shift and its write need, handed down whole."""

    shift: ShiftCall[pb.ShiftContextRequest]
    store: TenantStore  # as the caller's tenant sees it
    generation_id: str  # the request's, else a new one
    write: AuditWrite  # whether its audit may still be written (see its doc)


class ContextShiftService:
    """The methods of contextshift.v1.ContextShiftService, served by both surfaces (`api.grpc`,
    `api.http`) through the call gate (`gate.Gate`): a request message in, its response out
    (ShiftContext and PreviewContext encoded: see `ENCODED_METHODS`). The caller's tenant is the
    gate's (`auth.current_tenant`)."""

    def __init__(
        self,
        executor: ThreadPoolExecutor,
        defaults: Budget,
        store: Store,
        *,
        inline_request_bytes: int = 0,
        audit_messages: bool = True,
        io_executor: ThreadPoolExecutor | None = None,
        store_cache_seconds: float = 0.0,
        writer: GroupWriter | None = None,
    ) -> None:
        self._placement = Placement(executor, io_executor, inline_request_bytes, writer or GroupWriter(store))
        self._defaults = defaults
        self._store = store
        self._caches = Caches(ReadCache(store_cache_seconds))
        self._audit_messages = audit_messages

    def _view(self) -> TenantStore:
        """The store as the caller's tenant sees it, through this process's caches."""
        return TenantStore(self._store, current_tenant(), self._caches)

    def _report_stats(self, shifted: Shifted[Any]) -> None:
        stats = call_stats()
        stats.blocks = shifted.blocks
        stats.tokens = shifted.result.prompt_tokens
        stats.shift_seconds = shifted.seconds
        metrics.record_shift(shifted.result.strategy, shifted.result.diagnostics)

    async def ShiftContext(self, request: bytes) -> bytes:
        """An encoded ShiftContextRequest in, an encoded ShiftContextResponse out (see
        `add_context_service`). A shift of a chat is made against the chat's last prompt and
        written before the reply (`_shift_chat`); one without a chat shifts as PreviewContext
        does, and has its generation written when FinishGeneration can calibrate with it."""
        shift = shift_rpc.read_request(request, pb.ShiftContextRequest)
        call = _AuditedCall(shift, self._view(), shift.request.generation_id or ids.uuid7(), AuditWrite())
        try:
            if shift.request.chat_id:
                shifted = await self._shift_chat(call)
            else:
                without_chat = functools.partial(shift_rpc.shift, shift, self._defaults)
                shifted = await self._placement.run(without_chat, call.store, _work(shift))
                if audit_payload.stores_generation(shifted):  # for FinishGeneration to calibrate
                    done: asyncio.Future[Written] = asyncio.get_running_loop().create_future()
                    self._write(shifted, call, call.store, UNCHECKED, engine.StoredBlocks(), done)
                    _, outcome = await done
                    if outcome is not None:
                        raise outcome
        except asyncio.CancelledError:
            if call.write.cancel():  # written, but the reply will not be sent
                self._placement.submit(
                    functools.partial(self._mark_cancelled, call.store.tenant, call.generation_id)
                )
            raise
        self._report_stats(shifted)
        head = pb.ShiftContextResponse(generation_id=call.generation_id).SerializeToString()
        return engine.encode_pieces(
            [head, (pb.ShiftContextResponse.PLAN_FIELD_NUMBER, shifted.plan.pieces())]
        )

    async def _shift_chat(self, call: _AuditedCall) -> Shifted[pb.ShiftContextRequest]:
        """A ShiftContext of a chat, made against the chat's last prompt as this process knows it
        (else read from the store), and written with the check that the chat's audit is still
        the one that prompt is of. When another worker or replica shifted the chat meanwhile, the
        write changes nothing and hands back the chat's audit as it is: the shift is made again
        against that, and the last try writes unchecked (the last write wins, as two calls of one
        chat at once can only)."""
        chat_id = call.shift.request.chat_id

        def last(view: TenantStore) -> LastPrompt:
            return view.last_prompt(chat_id)

        for attempt in range(SHIFT_TRIES):
            checked = attempt < SHIFT_TRIES - 1
            shift_then_write: Callable[[TenantStore, asyncio.Future[Written]], None] = functools.partial(
                self._shift_then_write, call, last, checked
            )
            shifted, outcome = await self._placement.run_settled(
                shift_then_write, call.store, _work(call.shift)
            )
            if not isinstance(outcome, AuditChanged):
                if outcome is not None:
                    raise outcome
                return shifted
            metrics.record_reshift(self._store.dialect)
            last = functools.partial(_prompt_of, chat_id, outcome.current)
        raise AssertionError("not reached: the last try writes unchecked")

    def _shift_then_write(
        self,
        call: _AuditedCall,
        last: PromptSource,
        checked: bool,
        view: TenantStore,
        done: asyncio.Future[Written],
    ) -> None:
        """One try of `_shift_chat`, wherever `placement` runs it: the shift against the chat's
        prompt `last` gives, then its record handed to the writer, which settles `done`."""
        against = last(view)
        shifted = shift_rpc.shift(call.shift, self._defaults, view, against.prompt)
        if checked:
            self._write(shifted, call, view, against.audit, against.blocks, done)
        else:  # the chat's blocks are not known: the record holds all of its own
            self._write(shifted, call, view, UNCHECKED, engine.StoredBlocks(), done)

    def _write(
        self,
        shifted: Shifted[pb.ShiftContextRequest],
        call: _AuditedCall,
        view: TenantStore,
        made_on: AuditKey | Unchecked | None,
        blocks: engine.StoredBlocks,
        done: asyncio.Future[Written],
    ) -> None:
        """Hands what a shift stores to the group writer, read through `view`; `done` gets the
        shift and its outcome once it is stored (or why not). The record (with a chat, the audit's
        encoding and the blocks it adds to the chat's `blocks`) is made on the writer thread."""
        chat_id, created, generation_id = shifted.request.chat_id, now_ms(), call.generation_id
        held: list[engine.StoredBlocks] = []  # the chat's blocks once the record is stored

        def record() -> ShiftRecord | None:
            if not call.write.begin():  # the call was cancelled: nothing to write
                return None
            timings = pb.AuditTimings(store_read_ms=view.read_seconds * 1e3, shift_ms=shifted.seconds * 1e3)
            made, after = audit_payload.record(
                shifted,
                view.tenant,
                generation_id,
                created,
                made_on,
                blocks,
                timings,
                messages=self._audit_messages,
            )
            held.append(after)
            return made

        def written(outcome: WriteOutcome) -> Written:
            if outcome is None:
                if chat_id:  # its next shift is made against this prompt
                    last = LastPrompt((generation_id, created), _as_previous(shifted.result), held[0])
                    view.keep_prompt(chat_id, last)
                if call.write.end():  # the call was cancelled while this was written
                    self._placement.submit(
                        functools.partial(self._mark_cancelled, view.tenant, generation_id)
                    )
            return shifted, outcome

        self._placement.write(record, written, done)

    def _mark_cancelled(self, tenant: str, generation_id: str) -> None:
        """A generation whose ShiftContext call was cancelled after its audit was written: its
        caller never got the reply. A newer shift or a report may have overtaken it; then so be it."""
        try:
            self._store.finish(tenant, GenerationReport(generation_id, Status.CANCELLED), ALPHA)
        except StoreError as e:
            log.info("cancelled call's generation not marked", extra={"fields": {"reason": str(e)}})

    async def PreviewContext(self, request: bytes) -> bytes:
        """An encoded PreviewContextRequest in, an encoded PreviewContextResponse out. Reads the
        store like ShiftContext (a chat's last prompt as its audit records it now), writes nothing."""
        call = shift_rpc.read_request(request, pb.PreviewContextRequest)
        chat_id = call.request.chat_id

        def preview(view: TenantStore) -> Shifted[pb.PreviewContextRequest]:
            return shift_rpc.shift(
                call, self._defaults, view, view.stored_prompt(chat_id) if chat_id else None
            )

        shifted = await self._placement.run(preview, self._view(), _work(call))
        self._report_stats(shifted)
        return engine.encode_pieces([(pb.PreviewContextResponse.PLAN_FIELD_NUMBER, shifted.plan.pieces())])

    async def CountTokens(self, request: pb.CountTokensRequest) -> pb.CountTokensResponse:
        _checked(rules.violations(request))
        # A model's stored configuration may name the profile.
        work = Work(request.ByteSize(), (request.profile, request.model))
        response = await self._placement.run(functools.partial(counting.count, request), self._view(), work)
        stats = call_stats()
        stats.blocks = len(response.counts)
        stats.tokens = response.total
        return response

    async def GetContextAudit(self, request: pb.GetContextAuditRequest) -> pb.GetContextAuditResponse:
        _checked(request_violations(request))
        tenant = current_tenant()

        def read() -> pb.ContextAudit | None:
            stored = self._store.audit(tenant, request.chat_id, with_blocks=True)
            return audit_payload.decode(stored) if stored else None

        audit = await self._placement.blocking(read)
        if audit is None:
            raise RequestError(code_pb2.NOT_FOUND, f"chat {request.chat_id!r} has no audit")
        return pb.GetContextAuditResponse(audit=audit)

    async def ListChats(self, request: pb.ListChatsRequest) -> pb.ListChatsResponse:
        """A page of the tenant's chats, newest first (`chats.list_chats`: one store query)."""
        _checked(rules.violations(request))
        page = functools.partial(list_chats, self._store, current_tenant(), request)
        return await self._placement.blocking(page)

    async def FinishGeneration(self, request: pb.FinishGenerationRequest) -> pb.FinishGenerationResponse:
        """Moves the generation to its terminal status and feeds the calibration, in the store."""
        _checked(request_violations(request))  # ids, status, error_code / provider_error, tokens
        report = audit_payload.report(request)
        tenant = current_tenant()
        try:
            finished = await self._placement.blocking(
                functools.partial(self._store.finish, tenant, report, ALPHA)
            )
        except NotFound:
            chat = f" of chat {request.chat_id!r}" if request.chat_id else ""
            raise RequestError(
                code_pb2.NOT_FOUND,
                f"generation {request.generation_id!r}{chat} is not stored: ShiftContext stores a generation "
                "when it names a chat_id, or when its counts are calibrated (an approximate profile and a "
                "model); stored generations expire after generation_retention_hours and go with DeleteChat",
            ) from None
        g = finished.generation
        if finished.calibration is not None:  # this process's next shifts use it at once
            self._caches.models.put(
                ("factor", tenant, finished.calibration.model), finished.calibration.factor
            )
        response = pb.FinishGenerationResponse(
            calibration_recorded=finished.calibration_recorded,
            calibration=audit_payload.calibration_message(finished.calibration),
            status=audit_payload.STATUSES[g.status],
        )
        if g.error_code:
            response.provider_error_code = audit_payload.ERROR_CODES[ErrorCode(g.error_code)]
        return response

    async def DeleteChat(self, request: pb.DeleteChatRequest) -> pb.DeleteChatResponse:
        _checked(request_violations(request))
        store = self._view()
        deleted = await self._placement.blocking(
            functools.partial(self._store.delete_chat, store.tenant, request.chat_id)
        )
        store.forget_prompt(request.chat_id)
        if deleted:
            metrics.record_deleted_chats("request")
        return pb.DeleteChatResponse(deleted=deleted)

    async def AppendBlocks(self, request: pb.AppendBlocksRequest) -> pb.AppendBlocksResponse:
        _checked(request_violations(request))
        response = await self._placement.blocking(functools.partial(appends.append, request, self._view()))
        call_stats().blocks = len(response.tokens)
        return response

    async def SetModelConfig(self, request: pb.SetModelConfigRequest) -> pb.SetModelConfigResponse:
        _checked(rules.violations(request) if not request.HasField("config") else [])
        config = model_configs.from_proto(request.config)
        _checked(model_configs.check(config, "config"))
        tenant = current_tenant()
        stored = await self._placement.blocking(
            functools.partial(self._store.set_model_config, tenant, config)
        )
        self._caches.models.forget("config")
        return pb.SetModelConfigResponse(config=model_configs.to_proto(stored))

    async def GetModelConfig(self, request: pb.GetModelConfigRequest) -> pb.GetModelConfigResponse:
        role = model_configs.role_of(request.role, "role")
        if bool(request.model) == (role is not Role.NONE):
            raise invalid("model", "set either model or role")
        _checked(rules.violations(request))
        tenant = current_tenant()
        found = await self._placement.blocking(
            functools.partial(self._store.get_model_config, tenant, request.model, role)
        )
        if found is None:
            what = f"model {request.model!r}" if request.model else f"role {role.value!r}"
            raise RequestError(code_pb2.NOT_FOUND, f"no model configuration for {what}")
        return pb.GetModelConfigResponse(config=model_configs.to_proto(found))

    async def ListModelConfigs(self, request: pb.ListModelConfigsRequest) -> pb.ListModelConfigsResponse:
        found = await self._placement.blocking(functools.partial(self._store.model_configs, current_tenant()))
        return pb.ListModelConfigsResponse(configs=[model_configs.to_proto(c) for c in found])

    async def DeleteModelConfig(self, request: pb.DeleteModelConfigRequest) -> pb.DeleteModelConfigResponse:
        _checked(rules.violations(request))
        tenant = current_tenant()
        deleted = await self._placement.blocking(
            functools.partial(self._store.delete_model_config, tenant, request.model)
        )
        self._caches.models.forget("config")
        return pb.DeleteModelConfigResponse(deleted=deleted)

    async def ListTokenizerProfiles(
        self, request: pb.ListTokenizerProfilesRequest
    ) -> pb.ListTokenizerProfilesResponse:
        return await self._placement.blocking(listings.profiles)

    async def ListStrategies(self, request: pb.ListStrategiesRequest) -> pb.ListStrategiesResponse:
        # On a thread: the first listing loads the plugins' entry points.
        return await self._placement.blocking(listings.strategies)

    async def BenchmarkProfiles(self, request: pb.BenchmarkProfilesRequest) -> pb.BenchmarkProfilesResponse:
        """Profiles measured on the caller's corpus, on an engine thread (bounded in size and time
        by `profile_bench`)."""
        return await self._placement.blocking(functools.partial(counting.benchmark_profiles, request))


# ShiftContext and PreviewContext take and return encoded messages: `shift_rpc` takes the request's
# `blocks_json` out as bytes and builds the reply's encoding around the kept blocks' bytes, so the
# JSON is never decoded into a Python str, re-encoded, or copied through a parsed reply message.
ENCODED_METHODS = frozenset({"ShiftContext", "PreviewContext"})

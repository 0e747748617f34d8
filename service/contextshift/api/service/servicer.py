"""ContextShiftService over the library and the store. The engine, every conversion and every
store call run on a thread pool (the Rust core releases the GIL; sqlite3 and psycopg block), so the
event loop only moves bytes and the deadline is watched while they work. Requests of at most
`inline_request_bytes` that need nothing stored are the exception once their profile is loaded:
their engine work (up to about two milliseconds) costs less than the hop to a thread, so they run
on the event loop, to completion. The hop is dear under load: the engine thread and the loop hand
the GIL to each other at every release, and a shift on a thread took twice its time on the loop.

A shift that names a model, profile or role reads its configuration and calibration through the
process's read cache, on the event loop when the cache holds them. A ShiftContext of a chat is made
against the chat's last prompt as the process knows it (it wrote or read the chat's audit last),
on the event loop when small, else on a thread that reads it (and the chat's stored history, when
asked); its generation and audit go to the process's group writer (`audit.writer`), which stores
them with those of the calls at the same moment in one transaction, checking that the chat's audit
is still the one the shift was made against (else the shift is made again), and wakes the call
once they are committed: one hop off the event loop per call. A call cancelled by its client or
its deadline leaves the chat's previous audit, or its own marked CANCELLED (`audits.AuditWrite`).

Plugin strategies and interceptors may take up to their time limit, and llm-compact waits on its
endpoint: such shifts never run on the event loop, and run on the I/O threads rather than the
engine threads.

The tenant of every store call is the caller's, as the API key says (`auth.current_tenant`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from google.rpc import code_pb2

from contextshift import engine, history, plugins, profiles
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api import metrics, rules
from contextshift.api.auth import current_tenant
from contextshift.api.service import audits, counting, ids, listings, model_configs, shifts
from contextshift.api.service.blocks import block_dict, typed_field
from contextshift.api.service.calls import call_stats
from contextshift.api.service.errors import RequestError, bad_fields, invalid
from contextshift.api.service.read_cache import CacheMiss, ReadCache
from contextshift.api.service.requests import ShiftRequest, resolve_model
from contextshift.api.service.store_view import Caches, TenantStore
from contextshift.audit.provider_errors import ErrorCode, normalize
from contextshift.audit.store import (
    UNCHECKED,
    AuditChanged,
    AuditKey,
    NotFound,
    Report,
    Role,
    ShiftRecord,
    Status,
    Store,
    StoredAudit,
    StoredBlock,
    StoreError,
    Unchecked,
    now_ms,
)
from contextshift.audit.writer import GroupWriter, Outcome
from contextshift.budget import Budget
from contextshift.cache_stable import PreviousPrompt
from contextshift.calibration import ALPHA, Calibration
from contextshift.errors import FieldViolation
from contextshift.result import ShiftResult
from contextshift.strategies import DEFAULT_STRATEGY, runs_inline

T = TypeVar("T")

log = logging.getLogger("contextshift.api")

# (profile, model) pairs a process remembers having served, so their small requests run inline;
# bounded because clients choose the strings.
MAX_SERVED_PROFILES = 1024
# Tries of a chat's shift whose write finds the chat's audit changed (another process shifted the
# chat meanwhile); the last writes unchecked.
SHIFT_TRIES = 4
# A shift, and the outcome of its write (None: stored).
Written = tuple[shifts.Shifted[pb.ShiftContextRequest], Outcome]

_TERMINAL = {
    pb.GENERATION_STATUS_COMPLETED: Status.COMPLETED,
    pb.GENERATION_STATUS_FAILED: Status.FAILED,
    pb.GENERATION_STATUS_CANCELLED: Status.CANCELLED,
}


def _calibration_message(calibration: Calibration | None) -> pb.Calibration | None:
    if calibration is None:
        return None
    return pb.Calibration(model=calibration.model, factor=calibration.factor, samples=calibration.samples)


def _checked(violations: Sequence[FieldViolation]) -> None:
    if violations:
        raise bad_fields(violations)


def _error_code(request: pb.FinishGenerationRequest) -> ErrorCode | None:
    """The normalized provider error of a report (None unless FAILED); only this is stored."""
    if request.status != pb.GENERATION_STATUS_FAILED:
        return None
    if request.HasField("provider_error"):
        e = request.provider_error
        return normalize(e.http_status, e.type, e.code, e.message)
    return normalize(code=request.error_code) if request.error_code else ErrorCode.UNKNOWN


def _stable_counts(profile: str) -> bool:
    """Whether block counts under `profile` may be stored: not for profiles read from a file that
    can change under the same name (`hf:<path>`, and `llama3` from its environment variable)."""
    return not profile.startswith(profiles.HF_PREFIX) and profile != "llama3"


def _reads_chat(request: ShiftRequest) -> bool:
    """Whether a shift reads its chat from the store (its last prompt, for cache-stable shifts, or
    its stored history): never cached, so on a thread."""
    return bool(request.chat_id or request.use_stored_history)


def _last_prompt(chat_id: str, view: TenantStore) -> tuple[AuditKey | None, PreviousPrompt]:
    return view.last_prompt(chat_id)


def _prompt_of(
    chat_id: str, stored: StoredAudit | None, view: TenantStore
) -> tuple[AuditKey | None, PreviousPrompt]:
    return view.prompt_of(chat_id, stored)


def _as_previous(result: ShiftResult) -> PreviousPrompt:
    """`result.as_previous()`, short of the kept blocks' list when it left nothing out: a next
    shift carries only what its previous prompt left out (`cache_stable.carried`), so such a
    prompt is the empty one, and the decisions of a chat within its budget are never built."""
    return result.as_previous() if result.excluded_count else PreviousPrompt()


@dataclass(frozen=True, slots=True)
class _ShiftContextCall:
    """One ShiftContext call: what its shift and its write need, handed down whole."""

    read: pb.ShiftContextRequest
    blocks_json: bytes
    store: TenantStore  # as the caller's tenant sees it
    generation_id: str  # the request's, else a new one
    write: audits.AuditWrite  # whether its audit may still be written (see its doc)
    size: int  # of the encoded request


class _Wakeups:
    """Futures of one event loop settled from other threads, with one wake-up of the loop for all
    those settled since its last one: the calls of a group the writer stored wake it once."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._due: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []

    def settle(self, future: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
        with self._lock:
            self._due.append((future, result, error))
            if len(self._due) > 1:
                return  # the loop is woken already
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server stopped
            self._loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        with self._lock:
            due, self._due = self._due, []
        for future, result, error in due:
            if future.done():  # its call gave up on it
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)


_WAKEUPS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Wakeups] = weakref.WeakKeyDictionary()
_WAKEUPS_LOCK = threading.Lock()


def _settle_soon(
    future: asyncio.Future[T], result: T | None = None, error: BaseException | None = None
) -> None:
    """Settles `future` from any thread, on its event loop (unless its call gave up on it)."""
    loop = future.get_loop()
    with _WAKEUPS_LOCK:
        wakeups = _WAKEUPS.get(loop) or _WAKEUPS.setdefault(loop, _Wakeups(loop))
    wakeups.settle(future, result, error)


def _reads_model(request: ShiftRequest) -> bool:
    """Whether a shift reads a model's configuration and calibration (a profile can name a model,
    a role names one): cached by the process (`ReadCache`)."""
    return bool(request.model or request.profile or request.model_role)


class ContextShiftService:
    """The methods of contextshift.v1.ContextShiftService, served by both surfaces (`api.grpc`,
    `api.http`) through the call gate (`calls.Gate`): a request message in, its response out
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
        self._executor = executor
        self._writer = writer or GroupWriter(store)
        # Shifts whose strategy waits (an LLM endpoint, a plugin) run here, not on the engine threads.
        self._io_executor = io_executor or executor
        self._defaults = defaults
        self._store = store
        self._caches = Caches(ReadCache(store_cache_seconds))
        self._inline_request_bytes = inline_request_bytes
        self._audit_messages = audit_messages
        self._served_profiles: set[tuple[str, str]] = set()

    async def _on_thread(self, fn: Callable[[], T], executor: ThreadPoolExecutor | None = None) -> T:
        return await asyncio.get_running_loop().run_in_executor(executor or self._executor, fn)

    def _shift_executor(self, request: ShiftRequest) -> ThreadPoolExecutor | None:
        """The I/O threads for a strategy that waits, else None (the engine threads, or the loop)."""
        return None if runs_inline(request.strategy or DEFAULT_STRATEGY) else self._io_executor

    def _inline_bytes(self, request: ShiftRequest, size: int) -> int | None:
        """The request's size when it may run on the event loop (see `_run`), else None."""
        inline = runs_inline(request.strategy or DEFAULT_STRATEGY) and not plugins.interceptors()
        return size if inline else None

    def _small(self, request_bytes: int | None) -> bool:
        return request_bytes is not None and request_bytes <= self._inline_request_bytes

    async def _run(
        self,
        fn: Callable[[], T],
        request_bytes: int | None = None,
        profile: tuple[str, str] | None = None,
        executor: ThreadPoolExecutor | None = None,
    ) -> T:
        """Runs `fn` on `executor` (default: the engine threads). A request of at most
        `inline_request_bytes` runs on the event loop instead, once this process has served its
        `(profile, model)`: for a small request the hop to a thread and back (two wake-ups, and the
        GIL handed between the threads) costs more than the engine work itself, but a first use
        loads a vocabulary or a tokenizer.json (up to seconds), which must not stall the loop."""
        small = self._small(request_bytes)
        if small and profile in self._served_profiles:
            return fn()
        result = await self._on_thread(fn, executor)
        if small and profile is not None and len(self._served_profiles) < MAX_SERVED_PROFILES:
            self._served_profiles.add(profile)
        return result

    async def _run_reading(
        self,
        fn: Callable[[TenantStore], T],
        store: TenantStore,
        reads_model: bool,
        request_bytes: int | None,
        profile: tuple[str, str],
        executor: ThreadPoolExecutor | None = None,
    ) -> T:
        """`fn(store)` as `_run` runs it, for work that reads no chat. One that reads a model's
        configuration and calibration runs on the event loop only from the process's cache; a read
        the cache does not hold sends it to a thread, which reads (and caches) it."""
        if reads_model and self._small(request_bytes) and profile in self._served_profiles:
            try:
                return fn(store.cached())
            except CacheMiss:
                return await self._on_thread(functools.partial(fn, store), executor)
        return await self._run(functools.partial(fn, store), request_bytes, profile, executor)

    def _report_stats(self, shifted: shifts.Shifted[Any]) -> None:
        stats = call_stats()
        stats.blocks = shifted.blocks
        stats.tokens = shifted.result.prompt_tokens
        stats.shift_seconds = shifted.seconds
        metrics.record_shift(shifted.result.strategy, shifted.result.diagnostics)

    def _read_shift(
        self, request: bytes, request_type: type[shifts.R]
    ) -> tuple[shifts.R, bytes, TenantStore]:
        """The request, its `blocks_json`, and the store as the caller's tenant sees it."""
        # Read here, as grpc's own deserializer would: a copy of the JSON, and a small message.
        read, blocks_json = shifts.read_shift_request(request, request_type)
        _checked(rules.id_violations("chat_id", read.chat_id, required=False))
        return read, blocks_json, TenantStore(self._store, current_tenant(), self._caches)

    async def _shift_cached(
        self, read: shifts.R, blocks_json: bytes, store: TenantStore, size: int
    ) -> shifts.Shifted[shifts.R]:
        """A shift that reads no chat (see `_run_reading`)."""
        return await self._run_reading(
            functools.partial(shifts.shift, read, blocks_json, self._defaults),
            store,
            _reads_model(read),
            self._inline_bytes(read, size),
            (read.profile, read.model),
            self._shift_executor(read),
        )

    async def ShiftContext(self, request: bytes) -> bytes:
        """An encoded ShiftContextRequest in, an encoded ShiftContextResponse out (see
        `add_context_service`). A shift of a chat is made against the chat's last prompt and
        written by the group writer before the reply (`_shift_chat`); one without a chat shifts as
        PreviewContext does, and has its generation written when FinishGeneration can calibrate
        with it."""
        read, blocks_json, store = self._read_shift(request, pb.ShiftContextRequest)
        _checked(rules.id_violations("generation_id", read.generation_id, required=False))
        call = _ShiftContextCall(
            read, blocks_json, store, read.generation_id or ids.uuid7(), audits.AuditWrite(), len(request)
        )
        try:
            if read.chat_id:
                shifted = await self._shift_chat(call)
            else:
                shifted = await self._shift_cached(read, blocks_json, store, call.size)
                if audits.stores_generation(shifted):
                    await self._written(shifted, call)
        except asyncio.CancelledError:
            if call.write.cancel():  # written, but the reply will not be sent
                with contextlib.suppress(RuntimeError):  # unless the server is stopping
                    self._executor.submit(self._mark_cancelled, store.tenant, call.generation_id)
            raise
        self._report_stats(shifted)
        head = pb.ShiftContextResponse(generation_id=call.generation_id).SerializeToString()
        return engine.encode_pieces(
            [head, (pb.ShiftContextResponse.PLAN_FIELD_NUMBER, shifted.plan.pieces())]
        )

    async def _shift_chat(self, call: _ShiftContextCall) -> shifts.Shifted[pb.ShiftContextRequest]:
        """A ShiftContext of a chat, made against the chat's last prompt as this process knows it
        (else read from the store), and written with the check that the chat's audit is still
        the one that prompt is of. When another worker or replica shifted the chat meanwhile, the
        write changes nothing and hands back the chat's audit as it is: the shift is made again
        against that, and the last try writes unchecked (the last write wins, as two calls of one
        chat at once can only)."""
        read, chat_id = call.read, call.read.chat_id
        last = functools.partial(_last_prompt, chat_id)
        # On the event loop when small, and when this process holds the chat's last prompt and
        # what the request reads of a model; a stored history is read on a thread.
        inline = None if read.use_stored_history else self._inline_bytes(read, call.size)
        for attempt in range(SHIFT_TRIES):
            checked = attempt < SHIFT_TRIES - 1
            shifted, outcome = await self._shift_and_write(call, inline, last, checked)
            if not isinstance(outcome, AuditChanged):
                if outcome is not None:
                    raise outcome
                return shifted
            metrics.record_reshift(self._store.dialect)
            last = functools.partial(_prompt_of, chat_id, outcome.current)
        raise AssertionError("not reached: the last try writes unchecked")

    async def _shift_and_write(
        self,
        call: _ShiftContextCall,
        inline: int | None,
        last: Callable[[TenantStore], tuple[AuditKey | None, PreviousPrompt]],
        checked: bool,
    ) -> Written:
        """One try of `_shift_chat`: the shift against the chat's prompt `last` gives, on the event
        loop or on a thread, and its write. The call leaves the event loop once: a shift on a
        thread hands its record to the writer from there, and the writer wakes the call."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Written] = loop.create_future()

        def shift_then_write(view: TenantStore) -> None:
            made_on, view.previous = last(view)
            shifted = shifts.shift(call.read, call.blocks_json, self._defaults, view)
            self._write(shifted, call, view, made_on if checked else UNCHECKED, done)

        def on_thread() -> None:
            try:
                shift_then_write(call.store)
            except BaseException as e:
                _settle_soon(done, error=e)

        profile = (call.read.profile, call.read.model)
        small = self._small(inline)
        if small and profile in self._served_profiles:
            try:
                shift_then_write(call.store.cached())
                return await done
            except CacheMiss:  # a read this process does not hold: on a thread
                pass
        (self._shift_executor(call.read) or self._executor).submit(on_thread)
        written = await done
        if small and len(self._served_profiles) < MAX_SERVED_PROFILES:
            self._served_profiles.add(profile)
        return written

    def _write(
        self,
        shifted: shifts.Shifted[pb.ShiftContextRequest],
        call: _ShiftContextCall,
        view: TenantStore,
        made_on: AuditKey | Unchecked | None,
        done: asyncio.Future[Written],
    ) -> None:
        """Hands what a shift stores to the group writer (from the event loop or a thread), read
        through `view`; `done` gets the shift and its outcome once it is stored (or why not). With
        a chat: its generation and audit (encoded on the writer thread); without one: its
        generation (only called when `audits.stores_generation`)."""
        chat_id, created, generation_id = shifted.request.chat_id, now_ms(), call.generation_id

        def record() -> ShiftRecord | None:
            if not call.write.begin():  # the call was cancelled: nothing to write
                return None
            payload = None
            if chat_id:
                timings = pb.AuditTimings(
                    store_read_ms=view.read_seconds * 1e3, shift_ms=shifted.seconds * 1e3
                )
                payload = audits.encode(
                    shifted, generation_id, created, timings, messages=self._audit_messages
                )
            return ShiftRecord(
                view.tenant, audits.generation(shifted, generation_id, created), payload, made_on
            )

        def written(outcome: Outcome) -> None:
            if outcome is None:
                if chat_id:  # its next shift is made against this prompt
                    view.keep_prompt(chat_id, (generation_id, created), _as_previous(shifted.result))
                if call.write.end():  # the call was cancelled while this was written
                    with contextlib.suppress(RuntimeError):  # unless the server is stopping
                        self._executor.submit(self._mark_cancelled, view.tenant, generation_id)
            _settle_soon(done, (shifted, outcome))

        self._writer.write(record, written)

    async def _written(
        self, shifted: shifts.Shifted[pb.ShiftContextRequest], call: _ShiftContextCall
    ) -> None:
        """`_write` of a shift without a chat, from the event loop, and its outcome."""
        done: asyncio.Future[Written] = asyncio.get_running_loop().create_future()
        self._write(shifted, call, call.store, UNCHECKED, done)
        _, outcome = await done
        if outcome is not None:
            raise outcome

    def _mark_cancelled(self, tenant: str, generation_id: str) -> None:
        """A generation whose ShiftContext call was cancelled after its audit was written: its
        caller never got the reply. A newer shift or a report may have overtaken it; then so be it."""
        try:
            self._store.finish(tenant, Report(generation_id, Status.CANCELLED), ALPHA)
        except StoreError as e:
            log.info("cancelled call's generation not marked", extra={"fields": {"reason": str(e)}})

    async def PreviewContext(self, request: bytes) -> bytes:
        """An encoded PreviewContextRequest in, an encoded PreviewContextResponse out. Reads the
        store like ShiftContext, writes nothing."""
        read, blocks_json, store = self._read_shift(request, pb.PreviewContextRequest)
        if _reads_chat(read):
            shift = functools.partial(shifts.shift, read, blocks_json, self._defaults, store)
            shifted = await self._on_thread(shift, self._shift_executor(read))
        else:
            shifted = await self._shift_cached(read, blocks_json, store, len(request))
        self._report_stats(shifted)
        return engine.encode_pieces([(pb.PreviewContextResponse.PLAN_FIELD_NUMBER, shifted.plan.pieces())])

    async def CountTokens(self, request: pb.CountTokensRequest) -> pb.CountTokensResponse:
        # A model's stored configuration may name the profile.
        store = TenantStore(self._store, current_tenant(), self._caches)
        response = await self._run_reading(
            functools.partial(counting.count, request),
            store,
            bool(request.model),
            request.ByteSize(),
            (request.profile, request.model),
        )
        stats = call_stats()
        stats.blocks = len(response.counts)
        stats.tokens = response.total
        return response

    async def ListTokenizerProfiles(
        self, request: pb.ListTokenizerProfilesRequest
    ) -> pb.ListTokenizerProfilesResponse:
        return await self._run(listings.profiles)

    async def GetContextAudit(self, request: pb.GetContextAuditRequest) -> pb.GetContextAuditResponse:
        _checked(rules.violations(request))
        tenant = current_tenant()

        def read() -> pb.ContextAudit | None:
            stored = self._store.audit(tenant, request.chat_id)
            return audits.decode(stored) if stored else None

        audit = await self._on_thread(read)
        if audit is None:
            raise RequestError(code_pb2.NOT_FOUND, f"chat {request.chat_id!r} has no audit")
        return pb.GetContextAuditResponse(audit=audit)

    async def FinishGeneration(self, request: pb.FinishGenerationRequest) -> pb.FinishGenerationResponse:
        """Moves the generation to its terminal status and feeds the calibration, in the store."""
        _checked(rules.violations(request))  # ids, status, error_code / provider_error, tokens
        code = _error_code(request)
        report = Report(
            request.generation_id,
            _TERMINAL[request.status],
            request.chat_id,
            code.value if code else None,
            request.reported_prompt_tokens if request.HasField("reported_prompt_tokens") else None,
        )
        tenant = current_tenant()
        try:
            finished = await self._on_thread(functools.partial(self._store.finish, tenant, report, ALPHA))
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
            calibration=_calibration_message(finished.calibration),
            status=audits.STATUSES[g.status],
        )
        if g.error_code:
            response.provider_error_code = audits.ERROR_CODES[ErrorCode(g.error_code)]
        return response

    async def DeleteChat(self, request: pb.DeleteChatRequest) -> pb.DeleteChatResponse:
        _checked(rules.violations(request))
        store = TenantStore(self._store, current_tenant(), self._caches)
        deleted = await self._on_thread(
            functools.partial(self._store.delete_chat, store.tenant, request.chat_id)
        )
        store.forget_prompt(request.chat_id)
        if deleted:
            metrics.record_deleted_chats("request")
        return pb.DeleteChatResponse(deleted=deleted)

    async def AppendBlocks(self, request: pb.AppendBlocksRequest) -> pb.AppendBlocksResponse:
        _checked(rules.violations(request))
        store = TenantStore(self._store, current_tenant(), self._caches)

        def append() -> pb.AppendBlocksResponse:
            profile = resolve_model(
                request.profile, request.model, request.model_role, store
            ).resolution.profile
            typed = [block_dict(b, f"blocks[{i}]") for i, b in enumerate(request.blocks)]
            new = history.typed_texts(typed) if typed else history.request_texts(request.blocks_json.encode())
            if not new:
                raise invalid("blocks_json", "nothing to append: an empty array")
            rename = typed_field if typed else None
            counted: list[StoredBlock] = []

            def prepare(stored: Sequence[StoredBlock]) -> Sequence[StoredBlock]:
                counted[:] = history.appended(stored, new, profile, rename)
                if _stable_counts(profile):
                    return counted
                return [StoredBlock(block.json) for block in counted]

            total = self._store.append_blocks(store.tenant, request.chat_id, profile, prepare)
            return pb.AppendBlocksResponse(
                block_count=total, tokens=[b.tokens or 0 for b in counted], profile=profile
            )

        response = await self._on_thread(append)
        call_stats().blocks = len(response.tokens)
        return response

    async def SetModelConfig(self, request: pb.SetModelConfigRequest) -> pb.SetModelConfigResponse:
        _checked(rules.violations(request) if not request.HasField("config") else [])
        config = model_configs.from_proto(request.config)
        _checked(model_configs.check(config, "config"))
        tenant = current_tenant()
        stored = await self._on_thread(functools.partial(self._store.set_model_config, tenant, config))
        self._caches.models.forget("config")
        return pb.SetModelConfigResponse(config=model_configs.to_proto(stored))

    async def GetModelConfig(self, request: pb.GetModelConfigRequest) -> pb.GetModelConfigResponse:
        role = model_configs.role_of(request.role, "role")
        if bool(request.model) == (role is not Role.NONE):
            raise invalid("model", "set either model or role")
        _checked(rules.violations(request))
        tenant = current_tenant()
        found = await self._on_thread(
            functools.partial(self._store.get_model_config, tenant, request.model, role)
        )
        if found is None:
            what = f"model {request.model!r}" if request.model else f"role {role.value!r}"
            raise RequestError(code_pb2.NOT_FOUND, f"no model configuration for {what}")
        return pb.GetModelConfigResponse(config=model_configs.to_proto(found))

    async def ListModelConfigs(self, request: pb.ListModelConfigsRequest) -> pb.ListModelConfigsResponse:
        found = await self._on_thread(functools.partial(self._store.model_configs, current_tenant()))
        return pb.ListModelConfigsResponse(configs=[model_configs.to_proto(c) for c in found])

    async def DeleteModelConfig(self, request: pb.DeleteModelConfigRequest) -> pb.DeleteModelConfigResponse:
        _checked(rules.violations(request))
        tenant = current_tenant()
        deleted = await self._on_thread(
            functools.partial(self._store.delete_model_config, tenant, request.model)
        )
        self._caches.models.forget("config")
        return pb.DeleteModelConfigResponse(deleted=deleted)

    async def ListStrategies(self, request: pb.ListStrategiesRequest) -> pb.ListStrategiesResponse:
        # On a thread: the first listing loads the plugins' entry points.
        return await self._run(listings.strategies)

    async def BenchmarkProfiles(self, request: pb.BenchmarkProfilesRequest) -> pb.BenchmarkProfilesResponse:
        """Profiles measured on the caller's corpus, on an engine thread (bounded in size and time
        by `profile_bench`)."""
        return await self._run(functools.partial(counting.benchmark_profiles, request))


# ShiftContext and PreviewContext take and return encoded messages: `shifts` takes the request's
# `blocks_json` out as bytes and builds the reply's encoding around the kept blocks' bytes, so the
# JSON is never decoded into a Python str, re-encoded, or copied through a parsed reply message.
ENCODED_METHODS = frozenset({"ShiftContext", "PreviewContext"})

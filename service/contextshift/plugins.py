"""Plugins: third-party strategies and prompt interceptors, and the host that keeps them honest.

A plugin strategy is `fn(view: ShiftView)` returning the ids of blocks to leave out, or a
`StrategyPlan` (ids to leave out, replacement text for blocks, one summary text), or None (no
change). It sees a read-only view and never touches the engine's state. The host guards it:
- a plan that leaves out or rewrites a protected block is rejected: the block is restored and the
  shift falls back to truncate (`PLAN_REJECTED`); ids the conversation does not have, or a return
  value of another type, are rejected the same way (`PLAN_INVALID`);
- a plan that splits a tool-call group is extended to the whole group (`GROUP_EXTENDED`);
- a plugin that raises (`PLUGIN_ERROR`) or runs past `plugin_timeout_ms` (`PLUGIN_TIMEOUT`) falls
  back to truncate; a timed-out call cannot be stopped, so it finishes on its plugin thread and
  its answer is dropped, while later calls get other threads (`PluginThreads`); while
  MAX_HUNG_CALLS such calls still run, new ones are not made (`PLUGINS_SATURATED`, truncate);
- the plan is counted by the core, which goes on oldest-first when it is still over the budget
  (`FINAL_SHIFT`); shift_context then recounts the prompt independently.

An interceptor is `fn(messages, context: InterceptorContext)` run after the shift on (copies of)
the final provider messages, returning the messages to send instead, or None (no change). The
host recounts what it returns and shifts again when it is over the budget (the pins the pinned
cap removed stay removed), so an interceptor cannot push the prompt past the limit; one that
raises, runs past the time limit, returns something else than a list of messages or messages that
cannot be read, drops a protected message, or grows the protected ones past the budget, is skipped
(the messages before it stay).

Register at run time with `register_strategy(name, fn)` / `register_interceptor(fn)` (each
returns a cleanup that unregisters), or from an installed package's entry points in the groups
`contextshift.strategies` and `contextshift.interceptors` (loaded on first use; an entry point's
name is the strategy's or interceptor's name; a strategy may carry `description` and `options`
attributes). A plugin strategy runs only when a request names it, but an interceptor changes
every prompt of the process: one from an entry point runs only once enabled by name, in
`CONTEXTSHIFT_INTERCEPTORS` (comma-separated) or with `enable_interceptors`. Every event is a
`Diagnostic` in the result.
"""

from __future__ import annotations

import copy
import logging
import os
import queue
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from typing import Any, TypeVar

from contextshift import engine
from contextshift.diagnostics import Diagnostic
from contextshift.errors import InvalidBlocks, TokenBudgetExceeded
from contextshift.options import OptionSpec
from contextshift.strategies import registry
from contextshift.strategies.context import Outcome, Rewrite, StrategyContext, Summary, excluded_for
from contextshift.strategies.summarize import divider, summary_id, summary_message
from contextshift.summarizer.extractive import Turn, facts_newest_first

log = logging.getLogger("contextshift.plugins")

STRATEGY_GROUP = "contextshift.strategies"
INTERCEPTOR_GROUP = "contextshift.interceptors"
# Idle plugin threads kept for the next calls, and the abandoned (timed-out) calls that may still
# be running before new calls are refused: what runaway plugins can hold is bounded.
STANDING_THREADS = 4
MAX_HUNG_CALLS = 32
# What a final shift of the host leaves out (not the repair after a plugin's own exclusions).
FINAL_SHIFT_REASONS = frozenset({"BUDGET_OLDEST_FIRST", "UNPINNED_BY_CAP"})
# Ids listed in a diagnostic's detail at most.
_MAX_LISTED = 10

T = TypeVar("T")


@dataclass(frozen=True)
class BlockView:
    """One block as a plugin sees it."""

    index: int
    id: str
    role: str
    kind: str
    tokens: int
    group: int  # tool-call group number; blocks of a group are kept or left out together
    protection: str  # "system", "mandatory", "pinned" or "" (the current input counts as pinned)
    protected: bool  # the block or a member of its group is protected: never left out
    calls: tuple[tuple[str, str], ...]  # (id, name) of the tool calls it issues
    result_ids: tuple[str, ...]  # ids of the calls it answers


class ShiftView:
    """A read-only view of a counted conversation and its budget, for a plugin strategy."""

    def __init__(self, ctx: StrategyContext) -> None:
        layout = ctx.layout
        tokens = ctx.counts.tokens
        self._ctx = ctx
        self.blocks: tuple[BlockView, ...] = tuple(
            BlockView(
                i,
                layout.ids[i],
                layout.roles[i],
                layout.kinds[i],
                tokens[i],
                layout.groups[i],
                layout.protection[i],
                layout.group_protected[i],
                tuple(layout.calls[i]),
                tuple(layout.result_ids[i]),
            )
            for i in range(len(tokens))
        )
        self.budget = ctx.budget
        self.target = ctx.target()
        self.profile = ctx.profile
        self.prompt_tokens = sum(tokens)  # every block, before anything is left out
        # The strategy's own options (given or default).
        self.options: Mapping[str, Any] = dict(ctx.options.strategy)

    def text(self, index: int) -> str:
        """Block `index`'s text (its text pieces joined by newlines)."""
        return self._ctx.conversation.texts([index])[0]

    def message(self, index: int) -> dict[str, Any]:
        """A copy of block `index` as it would be sent."""
        return copy.deepcopy(dict(self._ctx.message(index)))


@dataclass(frozen=True)
class StrategyPlan:
    """What a plugin strategy decides: block ids to leave out, replacement text by block id, and
    the text of one summary block (placed before the current input)."""

    exclude: Collection[str] = ()
    replace: Mapping[str, str] = field(default_factory=dict)
    summary: str | None = None


@dataclass(frozen=True)
class InterceptorContext:
    """What an interceptor knows besides the messages: the block id of each message, in order."""

    ids: tuple[str, ...]
    budget: int
    prompt_tokens: int
    profile: str
    strategy: str


Interceptor = Callable[[list[dict[str, Any]], InterceptorContext], Sequence[Mapping[str, Any]] | None]


@dataclass(frozen=True)
class _Registered:
    name: str
    fn: Interceptor


_interceptors_lock = threading.Lock()
_interceptors: list[_Registered] = []


class PluginsSaturated(Exception):
    """Too many earlier plugin calls are still running past their time limit: a new call is
    refused at once rather than adding one more thread."""


class _Call:
    """One plugin call: what to run and, once done, its value or error."""

    __slots__ = ("abandoned", "args", "done", "error", "finished", "fn", "value")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.done = threading.Event()
        self.finished = False  # under the threads' lock
        self.abandoned = False  # under the threads' lock: its caller stopped waiting
        self.value: Any = None
        self.error: BaseException | None = None


class PluginThreads:
    """Daemon threads that run plugin calls, so each call keeps its own time limit.

    A call takes an idle thread, or starts one: calls never queue behind each other. A call past
    its limit cannot be stopped, so it is abandoned: its thread no longer counts as available
    (the next call starts a fresh one) and finishes on its own. Hung calls therefore never delay
    later ones; at most `max_hung` may be running at once, past that a call is refused at once
    with `PluginsSaturated` until some finish. Up to `standing` finished threads stay idle for
    the next calls; others exit."""

    def __init__(self, standing: int, max_hung: int, name: str = "contextshift-plugin") -> None:
        self._standing = standing
        self._max_hung = max_hung
        self._name = name
        self.reset()

    def reset(self) -> None:
        """Forget every thread (a forked child has none of its parent's)."""
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._idle = 0  # threads waiting for a call, each one reserved by one `run`
        self._hung = 0  # abandoned calls still running
        self._started = 0

    @property
    def hung(self) -> int:
        """Abandoned calls still running."""
        with self._lock:
            return self._hung

    def wait_hung_at_most(self, count: int, timeout: float) -> bool:
        """Waits until at most `count` abandoned calls still run; False after `timeout` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: self._hung <= count, timeout)

    def run(self, fn: Callable[..., T], args: tuple[Any, ...], timeout_ms: int) -> T:
        """`fn(*args)` on a plugin thread; `TimeoutError` after `timeout_ms`, `PluginsSaturated`
        (without running it) when too many abandoned calls still run."""
        call = _Call(fn, args)
        with self._lock:
            if self._hung >= self._max_hung:
                raise PluginsSaturated(
                    f"{self._hung} earlier plugin calls are still running past their time limit"
                )
            start = not self._idle
            if start:
                self._started += 1
                number = self._started
            else:
                self._idle -= 1
        if start:
            threading.Thread(target=self._work, name=f"{self._name}-{number}", daemon=True).start()
        self._calls.put(call)
        if not call.done.wait(timeout_ms / 1000):
            with self._lock:
                if not call.finished:  # else it finished just now: its answer counts
                    call.abandoned = True
                    self._hung += 1
                    raise TimeoutError(f"ran past {timeout_ms} ms")
        if call.error is not None:
            raise call.error
        return call.value  # type: ignore[no-any-return]

    def _work(self) -> None:
        while True:
            call = self._calls.get()
            try:
                call.value = call.fn(*call.args)
            except BaseException as error:  # the caller's to judge, in its own thread
                call.error = error
            with self._changed:
                call.finished = True
                if call.abandoned:
                    self._hung -= 1
                    self._changed.notify_all()
                stay = self._idle < self._standing
                if stay:
                    self._idle += 1
            call.done.set()
            if not stay:
                return


# Plugin calls run here, so a time limit can be kept.
_threads = PluginThreads(STANDING_THREADS, MAX_HUNG_CALLS)
os.register_at_fork(after_in_child=_threads.reset)


def call_with_timeout(fn: Callable[..., T], args: tuple[Any, ...], timeout_ms: int) -> T:
    """`fn(*args)` on a plugin thread; `TimeoutError` after `timeout_ms`, `PluginsSaturated` when
    too many earlier calls are still running past their limit."""
    return _threads.run(fn, args, timeout_ms)


def _listed(ids: Sequence[str]) -> str:
    shown = ", ".join(repr(i) for i in ids[:_MAX_LISTED])
    return shown + (f" and {len(ids) - _MAX_LISTED} more" if len(ids) > _MAX_LISTED else "")


class _Rejected(Exception):
    """A plugin's answer the host does not apply: the event and why."""

    def __init__(self, event: str, detail: str) -> None:
        super().__init__(detail)
        self.event = event
        self.detail = detail


def _as_plan(returned: object) -> StrategyPlan:
    if returned is None:
        return StrategyPlan()
    if isinstance(returned, StrategyPlan):
        plan = returned
    elif isinstance(returned, Iterable) and not isinstance(returned, str | bytes | Mapping):
        plan = StrategyPlan(exclude=list(returned))
    else:
        raise _Rejected(
            "PLAN_INVALID", f"returned {type(returned).__name__}, not block ids or a StrategyPlan"
        )
    texts = [*plan.replace.values(), *([] if plan.summary is None else [plan.summary])]
    if not all(isinstance(i, str) for i in [*plan.exclude, *plan.replace]) or not all(
        isinstance(t, str) for t in texts
    ):
        raise _Rejected("PLAN_INVALID", "block ids and texts must be strings")
    return plan


@dataclass(frozen=True)
class PluginStrategy:
    """A plugin strategy under the host's guard: called with a `StrategyContext`, it returns an
    `Outcome` like a built-in."""

    name: str
    fn: Callable[[ShiftView], object]

    def __call__(self, ctx: StrategyContext) -> Outcome:
        source = f"strategy:{self.name}"
        try:
            returned = call_with_timeout(self.fn, (ShiftView(ctx),), ctx.options.plugin_timeout_ms)
            return self._apply(ctx, _as_plan(returned), source)
        except TimeoutError:
            event, detail = (
                "PLUGIN_TIMEOUT",
                f"ran past plugin_timeout_ms ({ctx.options.plugin_timeout_ms} ms)",
            )
        except PluginsSaturated as saturated:
            log.warning(
                "plugin strategy not run", extra={"fields": {"strategy": self.name, "why": str(saturated)}}
            )
            event, detail = "PLUGINS_SATURATED", f"not run: {saturated}"
        except _Rejected as rejected:
            event, detail = rejected.event, rejected.detail
        except TokenBudgetExceeded:
            raise  # protected blocks alone do not fit: no strategy can help
        except Exception as error:
            # The plugin's own message may quote conversation text: only its type goes out.
            log.warning(
                "plugin strategy failed",
                extra={"fields": {"strategy": self.name, "error": type(error).__name__}},
            )
            event, detail = "PLUGIN_ERROR", f"raised {type(error).__name__}"
        fallback = Diagnostic(source, event, f"{detail}; fell back to truncate")
        return Outcome(ctx.plan(), ctx.counts, diagnostics=[fallback])

    def _apply(self, ctx: StrategyContext, plan: StrategyPlan, source: str) -> Outcome:
        layout = ctx.layout
        index_of = {block_id: i for i, block_id in enumerate(layout.ids)}
        unknown = [i for i in [*plan.exclude, *plan.replace] if i not in index_of]
        if unknown:
            raise _Rejected("PLAN_INVALID", f"no blocks with ids {_listed(unknown)}")
        protected = [i for i in plan.exclude if layout.group_protected[index_of[i]]]
        protected += [i for i in plan.replace if layout.protection[index_of[i]]]
        if protected:
            raise _Rejected(
                "PLAN_REJECTED", f"would leave out or rewrite protected blocks {_listed(protected)}; restored"
            )

        diagnostics: list[Diagnostic] = []
        excluded = sorted({index_of[i] for i in plan.exclude})
        chosen_groups = {layout.groups[i] for i in excluded}
        added = [
            layout.ids[i] for i, g in enumerate(layout.groups) if g in chosen_groups and i not in excluded
        ]
        if added:
            detail = f"left out {_listed(added)} too, to keep tool-call groups whole"
            diagnostics.append(Diagnostic(source, "GROUP_EXTENDED", detail))

        rewritten = {index_of[i]: text for i, text in plan.replace.items() if index_of[i] not in excluded}
        messages = {i: _rewrite(ctx, i, text) for i, text in rewritten.items()}
        after = dict(zip(messages, ctx.block_tokens(list(messages.values())), strict=True))
        counts = ctx.counts.replaced(after)
        forced = [(i, "PLUGIN_EXCLUDED") for i in excluded]

        summary = None
        if plan.summary:
            message = summary_message(summary_id(layout.ids), plan.summary)
            [tokens] = ctx.block_tokens([message])
            try:
                if tokens > ctx.budget:
                    raise TokenBudgetExceeded(tokens, ctx.budget)
                core_plan = ctx.plan(
                    counts, budget=ctx.budget - tokens, target=ctx.target() - tokens, forced=forced
                )
                kept = set(core_plan.kept)
                before = ctx.current_input if ctx.current_input in kept else None
                turns = [Turn("", text) for text in ctx.conversation.texts(excluded)]
                facts = facts_newest_first(turns)
                kept_facts = ctx.facts_kept(core_plan, facts, plan.summary)
                summary = Summary(
                    message, tokens, before, len(excluded), kept_facts, len(facts), divider(len(excluded))
                )
            except TokenBudgetExceeded:
                detail = f"the summary ({tokens} tokens) does not fit beside the protected blocks; dropped"
                diagnostics.append(Diagnostic(source, "SUMMARY_DROPPED", detail, tokens))
        if summary is None:
            core_plan = ctx.plan(counts, forced=forced)

        shifted = excluded_for(core_plan, layout.groups, FINAL_SHIFT_REASONS)
        if shifted:
            tokens_removed = sum(counts.tokens[i] for i in shifted)
            detail = f"the plan was over the budget: {len(shifted)} more blocks left out, oldest first"
            diagnostics.append(Diagnostic("host", "FINAL_SHIFT", detail, tokens_removed))
        kept = set(core_plan.kept)
        rewrites = {
            i: Rewrite(messages[i], ctx.counts.tokens[i], after[i], "PLUGIN_REPLACED")
            for i in messages
            if i in kept
        }
        return Outcome(core_plan, counts, rewrites=rewrites, summary=summary, diagnostics=diagnostics)


def _rewrite(ctx: StrategyContext, index: int, text: str) -> Mapping[str, Any]:
    return engine.rewrite_block(ctx.message(index), text)


def register_strategy(
    name: str,
    fn: Callable[[ShiftView], object],
    *,
    description: str = "",
    options: Sequence[OptionSpec] = (),
) -> Callable[[], None]:
    """Registers plugin strategy `name` (see the module doc); returns the cleanup that removes it.
    `options` are the options it takes beyond the common ones."""
    if not name or not isinstance(name, str):
        raise ValueError("a strategy needs a non-empty name")
    info = registry.StrategyInfo(
        name, description or f"plugin strategy {name}", tuple(options), PluginStrategy(name, fn)
    )
    return registry.add(info)


def register_interceptor(fn: Interceptor, *, name: str | None = None) -> Callable[[], None]:
    """Registers a prompt interceptor (run in registration order after every shift of this
    process); returns the cleanup that removes it."""
    entry = _Registered(name or str(getattr(fn, "__name__", "interceptor")), fn)
    with _interceptors_lock:
        _interceptors.append(entry)

    def cleanup() -> None:
        with _interceptors_lock:
            if entry in _interceptors:
                _interceptors.remove(entry)

    return cleanup


def interceptors() -> list[tuple[str, Interceptor]]:
    registry.ensure_loaded()  # the entry points of both groups
    with _interceptors_lock:
        return [(r.name, r.fn) for r in _interceptors]


@dataclass(frozen=True)
class Intercepted:
    """Messages after the interceptors, the block id of each (new messages get `<name>:<n>`), and
    what happened."""

    messages: list[Mapping[str, Any]]
    ids: list[str]
    diagnostics: list[Diagnostic]
    changed: bool


# Called on each interceptor's changed messages (and their block ids) before they are taken;
# raises TokenBudgetExceeded (its protected messages alone do not fit) or InvalidBlocks (they
# cannot be read) to have the interceptor skipped.
Acceptance = Callable[[list[Mapping[str, Any]], list[str]], None]


def run_interceptors(
    messages: Sequence[Mapping[str, Any]],
    ids: Sequence[str],
    protected: Collection[str],
    context: InterceptorContext,
    timeout_ms: int,
    accept: Acceptance | None = None,
) -> Intercepted:
    """Runs every registered interceptor in turn on copies of `messages`, guarded; a change
    `accept` refuses is skipped like any other bad answer, so one interceptor cannot break the
    shift."""
    current, current_ids = list(messages), list(ids)
    diagnostics: list[Diagnostic] = []
    changed = False
    for name, fn in interceptors():
        source = f"interceptor:{name}"
        copies = copy.deepcopy([dict(m) for m in current])
        call_context = replace(context, ids=tuple(current_ids))
        try:
            returned = call_with_timeout(fn, (copies, call_context), timeout_ms)
            if returned is None:
                continue
            new_ids = _ids_of(returned, copies, current_ids, name)
        except TimeoutError:
            diagnostics.append(
                Diagnostic(source, "INTERCEPTOR_TIMEOUT", f"ran past {timeout_ms} ms; skipped")
            )
            continue
        except PluginsSaturated as saturated:
            log.warning("interceptor not run", extra={"fields": {"interceptor": name, "why": str(saturated)}})
            diagnostics.append(Diagnostic(source, "PLUGINS_SATURATED", f"not run: {saturated}; skipped"))
            continue
        except _Rejected as rejected:
            diagnostics.append(Diagnostic(source, rejected.event, f"{rejected.detail}; skipped"))
            continue
        except Exception as error:
            log.warning(
                "interceptor failed", extra={"fields": {"interceptor": name, "error": type(error).__name__}}
            )
            diagnostics.append(
                Diagnostic(source, "INTERCEPTOR_ERROR", f"raised {type(error).__name__}; skipped")
            )
            continue
        dropped = [i for i in current_ids if i in protected and i not in new_ids]
        if dropped:
            detail = f"dropped protected messages {_listed(dropped)}; skipped"
            diagnostics.append(Diagnostic(source, "INTERCEPTOR_REJECTED", detail))
            continue
        candidate = list(returned)
        if candidate != current or new_ids != current_ids:
            if accept is not None:
                try:
                    accept(candidate, new_ids)
                except TokenBudgetExceeded as e:
                    detail = (
                        f"its protected messages take {e.protected_tokens} tokens, over the budget of "
                        f"{e.budget}; skipped"
                    )
                    diagnostics.append(Diagnostic(source, "INTERCEPTOR_REJECTED", detail, e.protected_tokens))
                    continue
                except InvalidBlocks as e:
                    fields = ", ".join(v.field for v in e.violations)
                    detail = f"returned messages that cannot be read ({fields}); skipped"
                    diagnostics.append(Diagnostic(source, "INTERCEPTOR_INVALID", detail))
                    continue
            changed = True
            diagnostics.append(
                Diagnostic(source, "INTERCEPTED", f"{len(candidate)} messages out of {len(current)}")
            )
        current, current_ids = candidate, new_ids
    return Intercepted(current, current_ids, diagnostics, changed)


def _ids_of(returned: object, given: list[dict[str, Any]], ids: list[str], name: str) -> list[str]:
    """The block id of each returned message: a message given (the same object) keeps its
    block's id; a new one gets its own `id` when free, else `<name>:<n>`."""
    if not isinstance(returned, list) or not all(isinstance(m, Mapping) for m in returned):
        raise _Rejected("INTERCEPTOR_INVALID", f"returned {type(returned).__name__}, not a list of messages")
    by_object = {id(m): block_id for m, block_id in zip(given, ids, strict=True)}
    out: list[str] = []
    for n, message in enumerate(returned):
        block_id = by_object.get(id(message))
        if block_id is None or block_id in out:
            own = message.get("id")
            block_id = (
                own if isinstance(own, str) and own and own not in ids and own not in out else f"{name}:{n}"
            )
        out.append(block_id)
    return out


INTERCEPTORS_ENV = "CONTEXTSHIFT_INTERCEPTORS"
_enabled: set[str] = set()


def _load_strategies() -> None:
    """Registers every strategy of the installed packages' entry points, and the interceptors
    `CONTEXTSHIFT_INTERCEPTORS` enables (called once, on first use of the registry)."""
    for point in entry_points(group=STRATEGY_GROUP):
        try:
            loaded = point.load()
            register_strategy(
                point.name,
                loaded,
                description=getattr(loaded, "description", ""),
                options=getattr(loaded, "options", ()),
            )
        except Exception as error:  # a broken plugin must not take the service down
            _not_loaded(STRATEGY_GROUP, point.name, error)
    names = [n.strip() for n in os.environ.get(INTERCEPTORS_ENV, "").split(",") if n.strip()]
    try:
        enable_interceptors(names)
    except ValueError as error:
        _not_loaded(INTERCEPTOR_GROUP, ",".join(names), error)


def enable_interceptors(names: Iterable[str]) -> None:
    """Registers the interceptors of these entry-point names (each once). A name no installed
    package declares is a ValueError naming what is installed."""
    wanted = [n for n in names if n not in _enabled]
    if not wanted:
        return
    points = {p.name: p for p in entry_points(group=INTERCEPTOR_GROUP)}
    missing = [n for n in wanted if n not in points]
    if missing:
        raise ValueError(f"no interceptor entry points named {missing} (installed: {sorted(points)})")
    for name in wanted:
        try:
            register_interceptor(points[name].load(), name=name)
            _enabled.add(name)
        except Exception as error:
            _not_loaded(INTERCEPTOR_GROUP, name, error)


def _not_loaded(group: str, name: str, error: Exception) -> None:
    what = f"{type(error).__name__}: {error}"
    fields = {"group": group, "entry_point": name, "error": what}
    log.error("plugin not loaded: %s %r: %s", group, name, what, extra={"fields": fields})


registry.entry_point_loader = _load_strategies

"""Prompt interceptors: `fn(messages, context: InterceptorContext)` run after the shift on copies of
the final provider messages, returning the messages to send instead, or None. The host recounts
what they return and shifts it again when it is over the budget (`intercept`), so an interceptor
cannot push the prompt past the limit; one that fails, or whose answer cannot be taken, is skipped
(see `contextshift.plugins`)."""

from __future__ import annotations

import copy
import logging
import sys
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from contextshift import calibration, engine, reasoning, reasons
from contextshift.diagnostics import Diagnostic
from contextshift.engine import BlockDecision
from contextshift.errors import InternalError, InvalidBlocks, TokenBudgetExceeded
from contextshift.options import ShiftOptions
from contextshift.plugins.calls import PluginsSaturated, Rejected, call_with_timeout, listed
from contextshift.reasons import Reason
from contextshift.result import Cuts, ListedDecisions, ListedMessages, ShiftResult, kept_images
from contextshift.strategies import registry

log = logging.getLogger("contextshift.plugins")


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
        except Rejected as rejected:
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
            detail = f"dropped protected messages {listed(dropped)}; skipped"
            diagnostics.append(Diagnostic(source, "INTERCEPTOR_REJECTED", detail))
            continue
        split = _split_groups(current, current_ids, set(current_ids).difference(new_ids))
        if split:
            detail = f"kept {listed(split)} without the rest of their tool-call groups; skipped"
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


def _split_groups(messages: Sequence[Mapping[str, Any]], ids: Sequence[str], dropped: set[str]) -> list[str]:
    """The ids of messages kept whose tool-call group (reasoning items with their output items
    included) lost a member to `dropped`."""
    if not dropped:
        return []
    named = [{**m, "id": block_id} for m, block_id in zip(messages, ids, strict=True)]
    groups = engine.Conversation(named, sys.maxsize).layout([], protect_current_input=False).groups
    broken = {groups[k] for k, block_id in enumerate(ids) if block_id in dropped}
    return [block_id for k, block_id in enumerate(ids) if groups[k] in broken and block_id not in dropped]


def _ids_of(returned: object, given: list[dict[str, Any]], ids: list[str], name: str) -> list[str]:
    """The block id of each returned message: a message given (the same object) keeps its
    block's id; a new one gets its own `id` when free, else `<name>:<n>`."""
    if not isinstance(returned, list) or not all(isinstance(m, Mapping) for m in returned):
        raise Rejected("INTERCEPTOR_INVALID", f"returned {type(returned).__name__}, not a list of messages")
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


class _Replanner:
    """The `Acceptance` of `intercept`: plans each interceptor's changed messages, raising (and so
    having the interceptor skipped) when they cannot be read or their protected messages alone
    exceed the budget, and keeps the last plan it accepted."""

    def __init__(
        self, profile: str, reasoning: str, budget: int, opts: ShiftOptions, unpinned_ids: frozenset[str]
    ) -> None:
        self._profile = profile
        self._reasoning = reasoning
        self._budget = budget
        self._opts = opts
        self._unpinned_ids = unpinned_ids
        self._accepted: tuple[engine.Conversation, engine.Counts, engine.Plan] | None = None

    def __call__(self, messages: list[Mapping[str, Any]], message_ids: list[str]) -> None:
        opts = self._opts
        # Parsed with their block ids, so decisions keep naming the blocks the caller sent.
        named = [{**m, "id": block_id} for m, block_id in zip(messages, message_ids, strict=True)]
        conversation = engine.Conversation(named, opts.max_block_chars, opts.tool_result_max_chars or None)
        counts = conversation.count(self._profile, reasoning=self._reasoning)
        # Pins the pinned cap removed stay removed: a re-plan reading the messages' own pins
        # would protect them again.
        unpinned = [k for k, block_id in enumerate(message_ids) if block_id in self._unpinned_ids]
        plan = conversation.plan(
            counts,
            budget=self._budget,
            unpinned=unpinned,
            protect_current_input=opts.protect_current_input,
            start_on_user=opts.start_on_user,
        )
        self._accepted = (conversation, counts, plan)

    def accepted(self) -> tuple[engine.Conversation, engine.Counts, engine.Plan]:
        """The last change accepted: what the interceptors left, planned."""
        if self._accepted is None:  # `changed` is set only for an accepted change
            raise InternalError("interceptors changed the messages, but no change was accepted")
        return self._accepted


def intercept(
    result: ShiftResult, budget: int, opts: ShiftOptions, unpinned_ids: frozenset[str]
) -> ShiftResult:
    """The result after the prompt interceptors: what they return is parsed, counted and shifted
    again (truncate) so it fits `budget`; blocks they drop are PLUGIN_EXCLUDED. An interceptor
    whose messages cannot be read, or whose protected messages alone exceed the budget, is skipped
    (the messages before it stay), so no interceptor can fail the shift."""
    kept = result.kept
    ids = [d.id for d in kept]
    context = InterceptorContext(tuple(ids), budget, result.prompt_tokens, result.profile, result.strategy)
    protected = {d.id for d in kept if d.reason in reasons.PROTECTED}
    replanner = _Replanner(result.profile, result.reasoning_rule, budget, opts, unpinned_ids)
    run = run_interceptors(result.messages, ids, protected, context, opts.plugin_timeout_ms, replanner)
    if not run.changed:
        return (
            replace(result, diagnostics=result.diagnostics + run.diagnostics) if run.diagnostics else result
        )

    conversation, counts, plan = replanner.accepted()
    prompt_tokens = conversation.recount(counts, plan.kept)
    if prompt_tokens != plan.total or prompt_tokens > budget:
        raise InternalError(f"recount after interceptors gave {prompt_tokens}, the plan {plan.total}")
    cuts = Cuts.of(conversation, counts)
    return replace(
        result,
        truncated=result.truncated + list(cuts.truncations.values()),
        prompt_tokens=prompt_tokens,
        calibrated_prompt_tokens=calibration.calibrated(prompt_tokens, result.calibration_factor),
        diagnostics=result.diagnostics + run.diagnostics + _final_shift(plan),
        reasoning=reasoning.kept(plan, counts, {}),
        images=kept_images(plan, counts),
        decisions=_decisions_after(result, run, conversation, plan),
        kept_messages=ListedMessages([cuts.messages.get(i, run.messages[i]) for i in plan.kept]),
    )


def _final_shift(plan: engine.Plan) -> list[Diagnostic]:
    """What the shift after the interceptors left out, when their prompt was over the budget."""
    dropped = plan.excluded_decisions
    if not dropped:
        return []
    detail = f"the intercepted prompt was over the budget: {len(dropped)} blocks left out"
    return [Diagnostic("host", "FINAL_SHIFT", detail, sum(d.tokens for d in dropped))]


def _decisions_after(
    result: ShiftResult, run: Intercepted, conversation: engine.Conversation, plan: engine.Plan
) -> ListedDecisions:
    """Every block's decision after the interceptors, in the prompt's order: a kept block keeps
    its reason, one the final shift left out says why, one an interceptor dropped is
    PLUGIN_EXCLUDED; the blocks the shift had left out stay where they were, and the messages
    an interceptor added follow the block before them."""
    original = {d.id: d for d in result.kept}
    final = {
        d.id: (BlockDecision(d.id, d.tokens, original[d.id].reason) if d.id in original else d)
        for d in plan.kept_decisions
    }
    excluded_now = {d.id: d for d in plan.excluded_decisions}
    new_after: dict[str | None, list[str]] = {}
    previous: str | None = None
    for block_id in run.ids:
        if block_id not in original:
            new_after.setdefault(previous, []).append(block_id)
        else:
            previous = block_id

    def placed(block_id: str) -> tuple[BlockDecision, bool]:
        if block_id in final:
            return final[block_id], True
        if block_id in excluded_now:
            return excluded_now[block_id], False
        return BlockDecision(block_id, original[block_id].tokens, Reason.PLUGIN_EXCLUDED.value), False

    ordered = [placed(i) for i in new_after.get(None, [])]
    for decision, was_kept in result.ordered_decisions():
        if not was_kept:
            ordered.append((decision, False))
            continue
        ordered.append(placed(decision.id))
        ordered += [placed(i) for i in new_after.get(decision.id, [])]
    return ListedDecisions([final[conversation.block_id(k)] for k in plan.kept], ordered)

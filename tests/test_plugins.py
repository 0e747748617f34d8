"""The plugin host: each guard case of a plugin strategy, the interceptors, and the sample plugin
package (examples/plugin-sample, installed by `make install-dev`) loaded through its entry
points."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import contextshift
from contextshift import InterceptorContext, ShiftView, StrategyPlan, plugins


def turn(block_id: str, role: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"id": block_id, "role": role, "content": text, **extra}


CHAT = [
    turn("sys", "system", "You are helpful."),
    turn("u0", "user", "hello"),
    turn("a0", "assistant", "Hi! How can I help?"),
    turn("u1", "user", "Look up order 42."),
    {
        "id": "call",
        "role": "assistant",
        "tool_calls": [{"id": "c1", "function": {"name": "orders", "arguments": "{}"}}],
    },
    {"id": "result", "role": "tool", "tool_call_id": "c1", "content": "order 42: shipped"},
    turn("a1", "assistant", "Order 42 has shipped."),
    turn("u2", "user", "thanks, and order 43?"),
]


def reasons(result: contextshift.ShiftResult) -> dict[str, str]:
    return {d.id: d.reason for d in [*result.kept, *result.excluded]}


def events(result: contextshift.ShiftResult) -> list[str]:
    return [d.event for d in result.diagnostics]


@pytest.fixture
def register() -> Iterator[Callable[..., None]]:
    """Registers strategies (by name "plugin") and interceptors for one test, removed after it."""
    cleanups: list[Callable[[], None]] = []

    def add(fn: Callable[..., Any], *, interceptor: bool = False, **kwargs: Any) -> None:
        if interceptor:
            cleanups.append(contextshift.register_interceptor(fn, **kwargs))
        else:
            cleanups.append(contextshift.register_strategy("plugin", fn, **kwargs))

    yield add
    for cleanup in cleanups:
        cleanup()


def shift(blocks: Any = CHAT, budget: int = 10_000, **kwargs: Any) -> contextshift.ShiftResult:
    return contextshift.shift_context(blocks, budget=budget, strategy="plugin", **kwargs)


# --- plugin strategies --------------------------------------------------------------------------


def test_a_registered_strategy_runs_and_its_cleanup_removes_it() -> None:
    cleanup = contextshift.register_strategy(
        "plugin", lambda view: ["u0", "a0"], description="drops the greeting"
    )
    try:
        result = shift()
        assert reasons(result)["u0"] == reasons(result)["a0"] == "PLUGIN_EXCLUDED"
        assert result.diagnostics == [] and result.strategy == "plugin"
        listed = {s.name: s for s in contextshift.list_strategies()}
        assert listed["plugin"].description == "drops the greeting" and not listed["plugin"].builtin
        with pytest.raises(ValueError, match="already registered"):
            contextshift.register_strategy("plugin", lambda view: [])
    finally:
        cleanup()
    with pytest.raises(contextshift.InvalidOptions) as caught:
        shift()
    assert caught.value.violations[0].field == "strategy"
    with pytest.raises(ValueError, match="already registered"):
        contextshift.register_strategy("truncate", lambda view: [])


def test_the_view_is_read_only_and_complete(register: Callable[..., None]) -> None:
    seen: dict[str, Any] = {}

    def look(view: ShiftView) -> None:
        seen["ids"] = [b.id for b in view.blocks]
        seen["protected"] = {b.id for b in view.blocks if b.protected}
        seen["groups"] = {b.id for b in view.blocks if b.group == view.blocks[4].group}
        seen["text"] = view.text(5)
        message = view.message(1)
        message["content"] = "changed"  # a copy: the caller's block is untouched
        seen["budget"], seen["target"] = view.budget, view.target

    register(look)
    blocks = json.loads(json.dumps(CHAT))
    result = shift(blocks, budget=1000, options={"target_ratio": 0.5})
    assert seen["ids"] == [b["id"] for b in CHAT]
    assert seen["protected"] == {"sys", "u2"}
    assert seen["groups"] == {"call", "result"}
    assert seen["text"] == "order 42: shipped"
    assert (seen["budget"], seen["target"]) == (1000, 500)
    assert blocks == CHAT and result.excluded == []


def test_a_plan_that_drops_a_protected_block_is_rejected_and_truncate_runs(
    register: Callable[..., None],
) -> None:
    register(lambda view: ["sys", "u0"])
    result = shift(budget=40)
    assert events(result) == ["PLAN_REJECTED"]
    assert "'sys'" in result.diagnostics[0].detail and "truncate" in result.diagnostics[0].detail
    assert reasons(result)["sys"] == "PROTECTED_SYSTEM"
    assert reasons(result) == reasons(contextshift.shift_context(CHAT, budget=40))


def test_a_plan_that_splits_a_tool_group_is_extended_to_the_whole_group(
    register: Callable[..., None],
) -> None:
    register(lambda view: ["result"])
    result = shift()
    assert events(result) == ["GROUP_EXTENDED"]
    assert "'call'" in result.diagnostics[0].detail
    assert (reasons(result)["call"], reasons(result)["result"]) == ("PLUGIN_EXCLUDED", "TOOL_GROUP")


@pytest.mark.parametrize(
    ("returned", "event"),
    [
        (["nope"], "PLAN_INVALID"),
        ("u0", "PLAN_INVALID"),
        (42, "PLAN_INVALID"),
        (StrategyPlan(replace={"u0": 5}), "PLAN_INVALID"),  # type: ignore[dict-item]
    ],
)
def test_a_plan_the_host_cannot_read_falls_back(
    register: Callable[..., None], returned: Any, event: str
) -> None:
    register(lambda view: returned)
    result = shift()
    assert events(result) == [event]
    assert result.excluded == []


def test_a_plugin_that_raises_falls_back_without_quoting_it(register: Callable[..., None]) -> None:
    def broken(view: ShiftView) -> None:
        raise RuntimeError("secret conversation text")

    register(broken)
    result = shift(budget=40)
    assert events(result) == ["PLUGIN_ERROR"]
    assert result.diagnostics[0].detail == "raised RuntimeError; fell back to truncate"
    assert reasons(result) == reasons(contextshift.shift_context(CHAT, budget=40))


def test_a_plugin_past_its_time_limit_falls_back(register: Callable[..., None]) -> None:
    release = threading.Event()
    register(lambda view: release.wait(10) and [])
    try:
        result = shift(options={"plugin_timeout_ms": 50})
    finally:
        release.set()
    assert events(result) == ["PLUGIN_TIMEOUT"]
    assert result.diagnostics[0].detail == "ran past plugin_timeout_ms (50 ms); fell back to truncate"


def test_a_call_after_four_hung_ones_runs_within_its_own_time_limit(register: Callable[..., None]) -> None:
    release = threading.Event()
    lock = threading.Lock()
    hung: list[int] = []
    four_hung = threading.Event()
    ran = threading.Event()

    def plugin(view: ShiftView) -> list[str]:
        with lock:
            hanging = len(hung) < 4
            if hanging:
                hung.append(1)
                if len(hung) == 4:
                    four_hung.set()
        if hanging:
            release.wait(120)  # hangs until the test ends
        else:
            ran.set()
        return []

    register(plugin)
    try:
        for _ in range(4):
            assert events(shift(options={"plugin_timeout_ms": 20})) == ["PLUGIN_TIMEOUT"]
        assert four_hung.wait(10)  # four calls hold their threads
        # A fifth call gets a thread of its own: it runs, well within its (long) limit.
        result = shift(options={"plugin_timeout_ms": 60_000})
        assert ran.is_set() and events(result) == []
    finally:
        release.set()
    assert plugins.calls.threads.wait_hung_at_most(0, 10)


def test_plugin_threads_refuse_calls_while_too_many_hang() -> None:
    threads = plugins.PluginThreads(standing=1, max_hung=2, name="test-plugin")
    release = threading.Event()
    for _ in range(2):
        with pytest.raises(TimeoutError):
            threads.run(release.wait, (120,), 10)
    assert threads.hung == 2
    ran = threading.Event()
    with pytest.raises(plugins.PluginsSaturated, match="2 earlier plugin calls"):
        threads.run(ran.set, (), 60_000)
    assert not ran.is_set()  # refused, not run
    release.set()
    assert threads.wait_hung_at_most(0, 10)
    assert threads.run(lambda: 42, (), 60_000) == 42
    with pytest.raises(ZeroDivisionError):  # a plugin's error reaches its caller
        threads.run(lambda: 1 / 0, (), 60_000)


def test_a_saturated_host_falls_back_without_running_the_plugin(register: Callable[..., None]) -> None:
    release = threading.Event()
    ran = threading.Event()
    register(lambda view: ran.set() or [])
    assert plugins.calls.threads.wait_hung_at_most(0, 10)  # calls earlier tests abandoned have ended
    try:
        for _ in range(plugins.MAX_HUNG_CALLS):
            with pytest.raises(TimeoutError):
                plugins.call_with_timeout(release.wait, (120,), 5)
        result = shift(budget=40, options={"plugin_timeout_ms": 60_000})
    finally:
        release.set()
    assert not ran.is_set()
    assert events(result) == ["PLUGINS_SATURATED"]
    detail = f"not run: {plugins.MAX_HUNG_CALLS} earlier plugin calls are still running past their time limit"
    assert result.diagnostics[0].detail == f"{detail}; fell back to truncate"
    assert reasons(result) == reasons(contextshift.shift_context(CHAT, budget=40))
    assert plugins.calls.threads.wait_hung_at_most(0, 10)


def test_replacement_text_and_a_summary(register: Callable[..., None]) -> None:
    register(
        lambda view: StrategyPlan(exclude=["u0", "a0"], replace={"result": "[shipped]"}, summary="greeted")
    )
    result = shift()
    messages = {m["id"]: m for m in result.messages}
    assert messages["result"]["content"] == "[shipped]"
    assert [(t.id, t.how) for t in result.truncated] == [("result", "PLUGIN_REPLACED")]
    assert result.summary is not None and result.summary.text == "greeted"
    assert [d.id for d in result.kept][-2:] == ["summary", "u2"]
    assert result.prompt_tokens == sum(d.tokens for d in result.kept)


def test_a_plan_still_over_budget_gets_a_final_shift(register: Callable[..., None]) -> None:
    register(lambda view: ["u0"])
    budget = 40
    result = shift(budget=budget)
    assert reasons(result)["u0"] == "PLUGIN_EXCLUDED"
    assert "FINAL_SHIFT" in events(result)
    assert result.prompt_tokens <= budget


def test_a_summary_that_cannot_fit_is_dropped(register: Callable[..., None]) -> None:
    register(lambda view: StrategyPlan(summary="word " * 400))
    result = shift(budget=40)
    assert "SUMMARY_DROPPED" in events(result) and result.summary is None
    assert result.prompt_tokens <= 40


def test_a_summary_larger_than_the_target_still_fits(register: Callable[..., None]) -> None:
    # The summary's room leaves less than nothing of target_ratio x budget: the shift goes as low
    # as it can, rather than failing the plugin.
    register(lambda view: StrategyPlan(exclude=["u0", "a0"], summary="the user greeted " * 6))
    result = shift(budget=60, options={"target_ratio": 0.3})
    assert "PLUGIN_ERROR" not in events(result)
    assert result.summary is not None and result.summary.tokens > 0.3 * 60
    assert result.prompt_tokens <= 60


# --- interceptors -------------------------------------------------------------------------------


def test_an_interceptor_edits_the_final_messages_and_is_recounted(register: Callable[..., None]) -> None:
    def stamp(messages: list[dict[str, Any]], context: InterceptorContext) -> list[dict[str, Any]]:
        assert context.ids[0] == "sys" and context.strategy == "truncate"
        messages[0]["content"] += " Today is Monday."
        return messages

    register(stamp, interceptor=True, name="stamp")
    result = contextshift.shift_context(CHAT, budget=10_000)
    assert result.messages[0]["content"] == "You are helpful. Today is Monday."
    assert CHAT[0]["content"] == "You are helpful."  # the caller's dict is untouched
    assert result.prompt_tokens == sum(d.tokens for d in result.kept)
    assert result.kept[0].tokens > contextshift.count_tokens([CHAT[0]])[0]
    assert events(result) == ["INTERCEPTED"]
    assert json.loads(result.messages_json()) == result.messages


def test_an_interceptor_cannot_push_the_prompt_past_the_limit(register: Callable[..., None]) -> None:
    register(
        lambda messages, context: [*messages[:-1], {"role": "user", "content": "x" * 400}, messages[-1]],
        interceptor=True,
    )
    budget = 60
    result = contextshift.shift_context(CHAT, budget=budget)
    assert result.prompt_tokens <= budget
    assert events(result) == ["INTERCEPTED", "FINAL_SHIFT"]
    assert reasons(result)["u2"] == "PINNED"
    assert {d.id for d, _ in result.ordered_decisions()} >= {"sys", "u2"}


def test_an_interceptor_that_drops_a_message(register: Callable[..., None]) -> None:
    register(lambda messages, context: [m for m in messages if m.get("id") != "a1"], interceptor=True)
    result = contextshift.shift_context(CHAT, budget=10_000)
    assert reasons(result)["a1"] == "PLUGIN_EXCLUDED"
    assert [d.id for d, kept in result.ordered_decisions() if not kept] == ["a1"]


def grow_system_prompt(messages: list[dict[str, Any]], context: InterceptorContext) -> list[dict[str, Any]]:
    messages[0]["content"] += " policy" * 200  # a protected message, past any budget here
    return messages


def stamp_last(messages: list[dict[str, Any]], context: InterceptorContext) -> list[dict[str, Any]]:
    messages[-1]["content"] += " (stamped)"
    return messages


def test_an_interceptor_that_grows_a_protected_message_past_the_budget_is_skipped(
    register: Callable[..., None],
) -> None:
    budget = 60
    before = contextshift.shift_context(CHAT, budget=budget)
    register(grow_system_prompt, interceptor=True, name="grow")
    register(stamp_last, interceptor=True, name="stamp")  # a later, good one still applies
    result = contextshift.shift_context(CHAT, budget=budget)  # does not raise
    assert [(d.source, d.event) for d in result.diagnostics] == [
        ("interceptor:grow", "INTERCEPTOR_REJECTED"),
        ("interceptor:stamp", "INTERCEPTED"),
    ]
    rejected = result.diagnostics[0]
    assert rejected.detail.endswith(f"over the budget of {budget}; skipped")
    assert rejected.tokens is not None and rejected.tokens > budget
    assert result.messages[0] == CHAT[0]  # the system prompt as it was
    assert result.messages[-1]["content"] == CHAT[-1]["content"] + " (stamped)"
    assert [d.id for d in result.kept] == [d.id for d in before.kept]
    assert result.prompt_tokens <= budget


def test_an_interceptor_alone_over_the_budget_leaves_the_result_as_shifted(
    register: Callable[..., None],
) -> None:
    before = contextshift.shift_context(CHAT, budget=60)
    register(grow_system_prompt, interceptor=True, name="grow")
    result = contextshift.shift_context(CHAT, budget=60)
    assert events(result) == ["INTERCEPTOR_REJECTED"]
    assert result.messages == before.messages and result.kept == before.kept
    assert result.prompt_tokens == before.prompt_tokens


def test_an_interceptor_whose_messages_cannot_be_read_is_skipped(register: Callable[..., None]) -> None:
    register(lambda messages, context: [*messages, {"role": "robot", "content": "beep"}], interceptor=True)
    result = contextshift.shift_context(CHAT, budget=10_000)
    assert events(result) == ["INTERCEPTOR_INVALID"]
    assert "role" in result.diagnostics[0].detail and "beep" not in result.diagnostics[0].detail
    assert result.messages == CHAT


def test_the_final_shift_after_interceptors_keeps_the_pins_the_cap_removed(
    register: Callable[..., None],
) -> None:
    blocks = [
        turn("sys", "system", "Be brief."),
        turn("p0", "user", "old note " * 40, pinned=True, injected=True),
        turn("u0", "user", "hello there"),
        turn("a0", "assistant", "hi, how can I help"),
        turn("p1", "user", "new note " * 40, pinned=True, injected=True),
        turn("now", "user", "go on"),
    ]
    pins = contextshift.count_tokens([blocks[1], blocks[4]])
    total = sum(contextshift.count_tokens(blocks))
    budget = total + 20  # everything fits, but the two pins exceed half of it: p0 loses its pin
    assert sum(pins) > 0.5 * budget >= pins[1]
    before = contextshift.shift_context(blocks, budget=budget)
    assert before.warnings == ["unpinned p0 by pinned_cap"] and reasons(before)["p0"] == "FITS"

    def add_turn(messages: list[dict[str, Any]], context: InterceptorContext) -> list[dict[str, Any]]:
        return [*messages[:-1], {"role": "assistant", "content": "extra " * 30}, messages[-1]]

    register(add_turn, interceptor=True, name="add")
    result = contextshift.shift_context(blocks, budget=budget)
    # Over the budget now: the final shift takes the oldest unprotected block, p0 (unpinned).
    assert events(result) == ["INTERCEPTED", "FINAL_SHIFT"]
    assert [(d.id, d.reason) for d in result.excluded] == [("p0", "UNPINNED_BY_CAP")]
    assert reasons(result)["p1"] == "PINNED" and reasons(result)["u0"] == "FITS"
    assert result.prompt_tokens <= budget


@pytest.mark.parametrize(
    ("interceptor", "event"),
    [
        (lambda messages, context: messages[1:], "INTERCEPTOR_REJECTED"),  # drops the system prompt
        (lambda messages, context: 1 / 0, "INTERCEPTOR_ERROR"),
        (lambda messages, context: "text", "INTERCEPTOR_INVALID"),
    ],
)
def test_a_bad_interceptor_is_skipped(register: Callable[..., None], interceptor: Any, event: str) -> None:
    register(interceptor, interceptor=True)
    result = contextshift.shift_context(CHAT, budget=10_000)
    assert events(result) == [event]
    assert result.messages == CHAT


# --- the sample plugin package, through its entry points ----------------------------------------


def test_the_sample_strategy_comes_from_its_entry_point() -> None:
    result = contextshift.shift_context(CHAT, budget=10_000, strategy="drop-greetings")
    # The greeting goes; the reply it leaves at the head of history goes with it (start_on_user).
    assert [(d.id, d.reason) for d in result.excluded] == [
        ("u0", "PLUGIN_EXCLUDED"),
        ("a0", "LEADING_ASSISTANT"),
    ]
    listed = {s.name: s for s in contextshift.list_strategies()}["drop-greetings"]
    assert [o.name for o in listed.options] == ["max_greeting_chars"]
    with pytest.raises(contextshift.InvalidOptions):
        contextshift.shift_context(
            CHAT, budget=10_000, strategy="drop-greetings", options={"max_greeting_chars": 0}
        )


SHIFT_WITH_SECRET = """
import json, contextshift
blocks = [{"role": "system", "content": "key sk-abcdefgh1234"}, {"role": "user", "content": "hi"}]
result = contextshift.shift_context(blocks, budget=1000)
print(json.dumps({"messages": result.messages, "events": [d.event for d in result.diagnostics]}))
"""


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)


def test_an_entry_point_interceptor_runs_only_once_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    base = {k: v for k, v in os.environ.items() if k != "CONTEXTSHIFT_INTERCEPTORS"}
    off = json.loads(run_python(SHIFT_WITH_SECRET, base).stdout)
    assert off["messages"][0]["content"] == "key sk-abcdefgh1234" and off["events"] == []
    on = json.loads(
        run_python(SHIFT_WITH_SECRET, base | {"CONTEXTSHIFT_INTERCEPTORS": "redact-secrets"}).stdout
    )
    assert on["messages"][0]["content"] == "key [redacted]" and on["events"] == ["INTERCEPTED"]
    missing = run_python(SHIFT_WITH_SECRET, base | {"CONTEXTSHIFT_INTERCEPTORS": "nope"})
    assert json.loads(missing.stdout)["events"] == []
    assert "plugin not loaded" in missing.stderr and "'nope'" in missing.stderr
    assert "redact-secrets" in missing.stderr  # what is installed

"""What the metrics record from the diagnostics of real shifts (in process, from the library's own
results): every fallback to truncate counted by strategy and cause, the other diagnostics only as
events; the audit store's operations and a shift's own time timed. The server-level counts, a fallback among them,
are in tests/integration/test_metrics.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fake_llm import closed_port_url
from prometheus_client.parser import text_string_to_metric_families
from test_strategies import long_chat

import contextshift
from contextshift import plugins as plugin_host
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api import metrics
from contextshift.api.service import shift_rpc
from contextshift.api.service.store_view import NoStore
from contextshift.audit.store import ModelConfig, Role
from contextshift.budget import Budget

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples() -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }


def added(before: Samples, after: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """What `name`'s samples gained between two scrapes, by labels (the unchanged left out)."""
    gained = {labels: v - before.get((n, labels), 0.0) for (n, labels), v in after.items() if n == name}
    return {labels: v for labels, v in gained.items() if v}


def labels(**values: str) -> frozenset[tuple[str, str]]:
    return frozenset(values.items())


@pytest.fixture
def plugins() -> Iterator[Callable[[str, Callable[..., Any]], None]]:
    cleanups: list[Callable[[], None]] = []
    yield lambda name, fn: cleanups.append(contextshift.register_strategy(name, fn))
    for cleanup in cleanups:
        cleanup()


def raises(view: Any) -> list[str]:
    raise RuntimeError("a plugin bug quoting Question 3: the invoice INV-1003")


def test_fallbacks_are_counted_from_the_diagnostics_of_real_shifts(
    plugins: Callable[[str, Callable[..., Any]], None],
) -> None:
    plugins("raises", raises)
    plugins("drops-system", lambda view: ["sys"])  # the system block is protected: rejected
    plugins("unknown-ids", lambda view: ["no-such-block"])
    plugins("splits-nothing", lambda view: ["u0", "a0"])  # a good plan: no fallback
    blocks = long_chat(12)
    runs = [
        ("raises", {}),
        ("raises", {}),
        ("drops-system", {}),
        ("unknown-ids", {}),
        ("splits-nothing", {}),
        ("llm-compact", {"compact_base_url": closed_port_url(), "compact_model": "m1"}),
    ]
    before = samples()
    for strategy, options in runs:
        result = contextshift.shift_context(blocks, budget=700, strategy=strategy, options=options)
        metrics.record_shift(result.strategy, result.diagnostics)
    after = samples()

    assert added(before, after, "contextshift_fallbacks_total") == {
        labels(strategy="raises", cause="PLUGIN_ERROR"): 2,
        labels(strategy="drops-system", cause="PLAN_REJECTED"): 1,
        labels(strategy="unknown-ids", cause="PLAN_INVALID"): 1,
        labels(strategy="llm-compact", cause="LLM_FALLBACK"): 1,
    }
    events = added(before, after, "contextshift_shift_events_total")
    for event, count in [("PLUGIN_ERROR", 2), ("PLAN_REJECTED", 1), ("PLAN_INVALID", 1), ("LLM_FALLBACK", 1)]:
        assert events[labels(event=event)] == count
    assert added(before, after, "contextshift_shifts_total")[labels(strategy="splits-nothing")] == 1
    # Nothing the conversation or the plugin's error said is in a label.
    text = metrics.render().decode()
    assert "INV-1003" not in text and "Question" not in text


def test_a_saturated_plugin_strategy_is_a_fallback_and_a_saturated_interceptor_is_not(
    plugins: Callable[[str, Callable[..., Any]], None],
) -> None:
    plugins("never-run", lambda view: [])
    cleanup = contextshift.register_interceptor(lambda messages, context: messages)
    release = threading.Event()
    assert plugin_host.calls.threads.wait_hung_at_most(0, 10)  # calls earlier tests abandoned have ended
    try:
        for _ in range(plugin_host.MAX_HUNG_CALLS):  # that many hung calls: the host runs no more
            with pytest.raises(TimeoutError):
                plugin_host.call_with_timeout(release.wait, (120,), 5)
        before = samples()
        for strategy in ("never-run", "truncate"):  # a plugin strategy, then only the interceptor
            result = contextshift.shift_context(long_chat(4), budget=700, strategy=strategy)
            assert [d.source for d in result.diagnostics if d.event == "PLUGINS_SATURATED"] == (
                ["strategy:never-run", f"interceptor:{plugin_host.interceptors()[0][0]}"]
                if strategy == "never-run"
                else [f"interceptor:{plugin_host.interceptors()[0][0]}"]
            )
            metrics.record_shift(result.strategy, result.diagnostics)
        after = samples()
    finally:
        release.set()
        cleanup()
    assert added(before, after, "contextshift_fallbacks_total") == {
        labels(strategy="never-run", cause="PLUGINS_SATURATED"): 1
    }
    assert added(before, after, "contextshift_shift_events_total") == {labels(event="PLUGINS_SATURATED"): 3}
    assert plugin_host.calls.threads.wait_hung_at_most(0, 10)


def test_store_operations_are_timed() -> None:
    store = ("contextshift_store_operation_duration_seconds_count", labels(operation="get_audit"))
    before = samples()
    with metrics.observe_store("get_audit"):
        pass
    assert samples()[store] - before.get(store, 0) == 1


class SlowConfigStore(NoStore):
    """A store view whose model configuration takes READ_SECONDS to read, timed as the server's
    TenantStore times its reads."""

    READ_SECONDS = 0.2

    def __init__(self) -> None:
        self.read_seconds = 0.0

    def model_config(self, model: str, role: Role) -> ModelConfig | None:
        time.sleep(self.READ_SECONDS)
        self.read_seconds += self.READ_SECONDS
        return None


def test_a_shifts_own_time_leaves_its_store_reads_out() -> None:
    """What contextshift_shift_duration_seconds and an audit's shift_ms report: the shift's time
    without the store's reads (here a slow configuration read)."""
    request = pb.ShiftContextRequest(blocks_json=json.dumps(long_chat(6)), model="some-model")
    store = SlowConfigStore()
    start = time.perf_counter()
    call = shift_rpc.read_request(request.SerializeToString(), pb.ShiftContextRequest)
    shifted = shift_rpc.shift(call, Budget(), store)
    elapsed = time.perf_counter() - start
    assert store.read_seconds == SlowConfigStore.READ_SECONDS
    assert 0 < shifted.seconds <= elapsed - store.read_seconds

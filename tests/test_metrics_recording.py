"""What the metrics record for events no server traffic produces yet: strategy diagnostics (no
strategy reports one today) and audit store latency (no store yet). In process; the server-level
counts are in tests/integration/test_metrics.py."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from contextshift.api import metrics
from contextshift.diagnostics import Diagnostic


def samples() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }


def test_diagnostics_count_by_event_and_store_operations_are_timed() -> None:
    fallback = ("contextshift_shift_events_total", frozenset({("event", "FALLBACK_TO_TRUNCATE")}))
    shifts = ("contextshift_shifts_total", frozenset({("strategy", "summarize")}))
    store = ("contextshift_store_operation_duration_seconds_count", frozenset({("operation", "get_audit")}))
    before = samples()
    metrics.record_shift(
        "summarize",
        [
            Diagnostic("host", "FALLBACK_TO_TRUNCATE", "the strategy raised"),
            Diagnostic("host", "GROUP_EXTENDED", "a tool group went whole", tokens=12),
        ],
    )
    with metrics.observe_store("get_audit"):
        pass
    after = samples()
    assert after[fallback] - before.get(fallback, 0) == 1
    assert after[shifts] - before.get(shifts, 0) == 1
    assert after[store] - before.get(store, 0) == 1

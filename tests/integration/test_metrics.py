"""/metrics after known traffic, counted exactly: one worker, then two (prometheus_client's
multiprocess mode, whatever worker answers the scrape). No message content in labels or logs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from fake_llm import closed_port_url
from prometheus_client.parser import text_string_to_metric_families

from contextshift import profiles, shift_context
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift._proto.contextshift.v1 import context_service_pb2_grpc

from .conftest import ServerProcess, start_server
from .test_grpc_service import AS_JSON
from .test_grpc_strategies import chat

SERVICE = "/contextshift.v1.ContextShiftService/"
PREVIEW_ROUTE = "POST /api/v2/context-preview"
TEXT = json.dumps(AS_JSON)


def scrape(server: ServerProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with httpx.Client(base_url=server.http_url, timeout=10) as client:  # a new connection: any worker
        response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of its own: nothing but this test's traffic in its metrics."""
    running = start_server(tmp_path)
    yield running
    assert running.terminate() == 0


def test_counts_after_known_traffic(fresh: ServerProcess) -> None:
    stub = context_service_pb2_grpc.ContextShiftServiceStub(grpc.insecure_channel(fresh.address))
    tokens = 0
    for _ in range(3):
        tokens += stub.PreviewContext(
            pb.PreviewContextRequest(blocks_json=TEXT, context_limit=1200)
        ).plan.prompt_tokens
    tokens += stub.ShiftContext(
        pb.ShiftContextRequest(blocks_json=TEXT, chat_id="chat-secret-id")
    ).plan.prompt_tokens
    with pytest.raises(grpc.RpcError):
        stub.PreviewContext(pb.PreviewContextRequest(blocks_json=TEXT, context_limit=20, response_reserve=0))
    with pytest.raises(grpc.RpcError):
        stub.PreviewContext(pb.PreviewContextRequest(blocks_json="[", strategy="truncate"))
    with httpx.Client(base_url=fresh.http_url, timeout=10) as client:
        http_tokens = 0
        for _ in range(2):
            http_tokens += int(
                client.post(PREVIEW_ROUTE.split()[1], json={"blocksJson": TEXT}).json()["plan"][
                    "promptTokens"
                ]
            )
        too_small = {"blocksJson": TEXT, "contextLimit": 20, "responseReserve": 0}
        assert client.post("/api/v2/context-preview", json=too_small).status_code == 422
        assert client.get("/api/v2/chats/chat-secret-id/context-audit").status_code == 200

    samples = scrape(fresh)
    requests = "contextshift_requests_total"
    assert value(samples, requests, surface="grpc", method=SERVICE + "PreviewContext", status="OK") == 3
    assert value(samples, requests, surface="grpc", method=SERVICE + "ShiftContext", status="OK") == 1
    assert (
        value(
            samples, requests, surface="grpc", method=SERVICE + "PreviewContext", status="FAILED_PRECONDITION"
        )
        == 1
    )
    assert (
        value(samples, requests, surface="grpc", method=SERVICE + "PreviewContext", status="INVALID_ARGUMENT")
        == 1
    )
    assert value(samples, requests, surface="http", method=PREVIEW_ROUTE, status="200") == 2
    assert value(samples, requests, surface="http", method=PREVIEW_ROUTE, status="422") == 1
    audit_route = "GET /api/v2/chats/{id}/context-audit"  # the route, never the chat id
    assert value(samples, requests, surface="http", method=audit_route, status="200") == 1
    # The store's operations, timed: the chat's last audit read (for a cache-stable shift: none
    # yet; at once, on the event loop, since the previews loaded the profile), the shift's audit
    # written (by the group writer), then read back.
    store_latency = "contextshift_store_operation_duration_seconds_count"
    assert value(samples, store_latency, operation="audit_at_once") == 1
    assert value(samples, store_latency, operation="record_shifts") == 1
    assert value(samples, store_latency, operation="audit") == 1
    latency = "contextshift_request_duration_seconds_count"
    assert value(samples, latency, surface="grpc", method=SERVICE + "PreviewContext") == 5
    assert value(samples, latency, surface="http", method=PREVIEW_ROUTE) == 3
    # The shift's own time: once per successful shift, and never more than the call that ran it.
    for surface, method, calls in (
        ("grpc", SERVICE + "PreviewContext", 3),
        ("grpc", SERVICE + "ShiftContext", 1),
        ("http", PREVIEW_ROUTE, 2),
    ):
        shift = value(samples, "contextshift_shift_duration_seconds_count", surface=surface, method=method)
        assert shift == calls, (surface, method)
        shift_seconds = value(
            samples, "contextshift_shift_duration_seconds_sum", surface=surface, method=method
        )
        call_seconds = value(
            samples, "contextshift_request_duration_seconds_sum", surface=surface, method=method
        )
        assert 0 < shift_seconds < call_seconds, (surface, method)

    assert value(samples, "contextshift_blocks_total", method=SERVICE + "PreviewContext") == 3 * len(AS_JSON)
    assert value(samples, "contextshift_blocks_total", method=PREVIEW_ROUTE) == 2 * len(AS_JSON)
    grpc_tokens = value(samples, "contextshift_tokens_total", method=SERVICE + "PreviewContext") + value(
        samples, "contextshift_tokens_total", method=SERVICE + "ShiftContext"
    )
    assert grpc_tokens == tokens
    assert value(samples, "contextshift_tokens_total", method=PREVIEW_ROUTE) == http_tokens
    assert value(samples, "contextshift_shifts_total", strategy="truncate") == 6
    assert value(samples, "contextshift_budget_exceeded_total", method=SERVICE + "PreviewContext") == 1
    assert value(samples, "contextshift_budget_exceeded_total", method=PREVIEW_ROUTE) == 1
    # A plain truncate reports no diagnostics: no events, no fallbacks.
    assert not [key for key in samples if key[0] == "contextshift_shift_events_total"]
    assert not [key for key in samples if key[0] == "contextshift_fallbacks_total"]


def test_a_compaction_endpoint_that_refuses_counts_fallbacks(tmp_path: Path) -> None:
    """llm-compact against an endpoint where nothing listens: every shift falls back to truncate
    (LLM_FALLBACK), and each one is a fallback by strategy and cause, on both surfaces."""
    env = {"CONTEXTSHIFT_COMPACT_URL": closed_port_url(), "CONTEXTSHIFT_COMPACT_MODEL": "big"}
    running = start_server(tmp_path, env=env)
    try:
        blocks = json.dumps(chat(12))
        stub = context_service_pb2_grpc.ContextShiftServiceStub(grpc.insecure_channel(running.address))
        for _ in range(2):
            plan = stub.ShiftContext(
                pb.ShiftContextRequest(
                    blocks_json=blocks, strategy="llm-compact", context_limit=700, response_reserve=0
                )
            ).plan
            assert [d.event for d in plan.diagnostics] == ["LLM_FALLBACK"]
        # A plain truncate of the same chat: no fallback.
        stub.PreviewContext(
            pb.PreviewContextRequest(blocks_json=blocks, context_limit=700, response_reserve=0)
        )
        with httpx.Client(base_url=running.http_url, timeout=10) as client:
            body = {
                "blocksJson": blocks,
                "strategy": "llm-compact",
                "contextLimit": 700,
                "responseReserve": 0,
            }
            answer = client.post("/api/v2/context-preview", json=body)
            assert answer.status_code == 200
            assert [d["event"] for d in answer.json()["plan"]["diagnostics"]] == ["LLM_FALLBACK"]
        samples = scrape(running)
    finally:
        assert running.terminate() == 0
    fallbacks = {
        frozenset(labels): v
        for (name, labels), v in samples.items()
        if name == "contextshift_fallbacks_total"
    }
    assert fallbacks == {frozenset({("strategy", "llm-compact"), ("cause", "LLM_FALLBACK")}): 3}
    assert value(samples, "contextshift_shift_events_total", event="LLM_FALLBACK") == 3
    assert value(samples, "contextshift_shifts_total", strategy="llm-compact") == 3
    assert value(samples, "contextshift_shifts_total", strategy="truncate") == 1


def test_count_cache_lookups_and_hit_ratio(fresh: ServerProcess) -> None:
    # The same two shifts in this process, from an empty cache, say what the server must count.
    profiles.clear_cache()
    for _ in range(2):
        shift_context(TEXT, budget=100_000, profile="o200k_base")
    expected = profiles.cache_stats()
    assert expected.hits and expected.misses
    blocks = profiles.block_cache_stats()  # the second shift found the first's blocks
    assert blocks.hits and blocks.misses

    stub = context_service_pb2_grpc.ContextShiftServiceStub(grpc.insecure_channel(fresh.address))
    for _ in range(2):
        stub.PreviewContext(
            pb.PreviewContextRequest(
                blocks_json=TEXT, profile="o200k_base", context_limit=100_000, response_reserve=0
            )
        )
    samples = scrape(fresh)
    assert value(samples, "contextshift_count_cache_lookups_total", result="hit") == expected.hits
    assert value(samples, "contextshift_count_cache_lookups_total", result="miss") == expected.misses
    (ratio,) = [v for (name, _), v in samples.items() if name == "contextshift_count_cache_hit_ratio"]
    assert ratio == pytest.approx(expected.hit_ratio)
    (ratio,) = [v for (name, _), v in samples.items() if name == "contextshift_block_cache_hit_ratio"]
    assert ratio == pytest.approx(blocks.hit_ratio)


def test_two_workers_add_up_and_nothing_says_what_was_sent(tmp_path: Path) -> None:
    running = start_server(tmp_path, "--workers", "2")
    try:
        running.wait_serving(2)

        def shifts() -> None:  # a gRPC and an HTTP shift, each on a new connection
            with grpc.insecure_channel(
                running.address, options=[("grpc.use_local_subchannel_pool", 1)]
            ) as chan:
                stub = context_service_pb2_grpc.ContextShiftServiceStub(chan)
                # A profile whose counts are cached, so each worker has a hit ratio.
                request = pb.ShiftContextRequest(
                    blocks_json=TEXT, chat_id="chat-secret-id", profile="o200k_base"
                )
                stub.ShiftContext(request, timeout=10)
            with httpx.Client(base_url=running.http_url, timeout=10) as client:
                body = {"blocksJson": TEXT, "profile": "o200k_base"}
                assert client.post("/api/v2/context-shift", json=body).status_code == 200

        made = running.until_every_worker_answers(shifts, SERVICE + "ShiftContext")
        answered = {
            line["pid"] for line in running.log_lines() if line.get("method") == SERVICE + "ShiftContext"
        }
        assert len(answered) == 2
        metrics_dir = Path(
            next(line for line in running.log_lines() if line["msg"] == "serving")["metrics_dir"]
        )
        assert metrics_dir.is_dir()
        for _ in range(6):  # whichever worker answers the scrape, it reports both
            samples = scrape(running)
            requests = "contextshift_requests_total"
            assert (
                value(samples, requests, surface="grpc", method=SERVICE + "ShiftContext", status="OK") == made
            )
            assert (
                value(samples, requests, surface="http", method="POST /api/v2/context-shift", status="200")
                == made
            )
            assert value(samples, "contextshift_shifts_total", strategy="truncate") == 2 * made
            ratios = [key for key in samples if key[0] == "contextshift_count_cache_hit_ratio"]
            assert {int(dict(labels)["pid"]) for _, labels in ratios} == answered
        text = httpx.get(running.http_url + "/metrics").text
        for secret in ("bicycle", "sealant", "chat-secret-id", "Ada"):
            assert secret not in text and secret not in running.log_path.read_text()
    finally:
        assert running.terminate() == 0
    assert not metrics_dir.exists(), "the server removes its metrics directory when it stops"

"""The servicer's memory of ShiftContext generations for FinishGeneration: bounded (oldest out
first), a reused id starts over, and a generation's report is taken once even under concurrency."""

from __future__ import annotations

import asyncio
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from contextshift import calibration
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api import convert
from contextshift.api.errors import RequestError
from contextshift.api.servicer import ContextShiftServicer, Generation, Generations


def test_oldest_generation_goes_first_when_full() -> None:
    generations = Generations(capacity=2)
    for name in ("a", "b", "c"):
        generations.add("", name, Generation("m", 10, approximate=True))
    assert len(generations) == 2
    assert generations.finish("", "a", report=False) is None
    assert generations.finish("", "b", report=False) is not None
    assert generations.finish("", "c", report=False) is not None


def test_reused_id_starts_over() -> None:
    generations = Generations(capacity=2)
    generations.add("", "a", Generation("m", 10, approximate=True))
    assert generations.finish("", "a", report=True) == Generation("m", 10, approximate=True, reported=False)
    generations.add("", "a", Generation("n", 20, approximate=False))
    assert generations.finish("", "a", report=False) == Generation("n", 20, approximate=False, reported=False)


def test_a_report_is_claimed_once_across_threads() -> None:
    generations = Generations()
    generations.add("", "g", Generation("m", 10, approximate=True))
    seen: list[bool] = []
    lock = threading.Lock()

    def claim() -> None:
        before = generations.finish("", "g", report=True)
        assert before is not None
        with lock:
            seen.append(before.reported)

    threads = [threading.Thread(target=claim) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == [False] + [True] * 15


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Generations(capacity=0)


def test_evicted_generation_is_not_found_and_a_kept_one_calibrates() -> None:
    model = f"claude-sonnet-4-test-{uuid.uuid4().hex[:8]}"
    with ThreadPoolExecutor(1) as executor:
        servicer = ContextShiftServicer(executor, convert.BudgetDefaults(None, None), max_generations=1)
        servicer._generations.add("", "old", Generation(model, 100, approximate=True))
        servicer._generations.add("", "new", Generation(model, 100, approximate=True))
        context: Any = None  # FinishGeneration raises RequestError; the interceptor turns it into a status

        def finish(generation_id: str) -> pb.FinishGenerationResponse:
            request = pb.FinishGenerationRequest(
                generation_id=generation_id,
                status=pb.GENERATION_STATUS_COMPLETED,
                reported_prompt_tokens=150,
            )
            return asyncio.run(servicer.FinishGeneration(request, context))

        with pytest.raises(RequestError) as caught:
            finish("old")
        assert caught.value.code == grpc.StatusCode.NOT_FOUND
        assert "'old'" in str(caught.value) and "last 1 ShiftContext generations" in str(caught.value)
        response = finish("new")
    try:
        assert response.calibration_recorded
        assert response.calibration.factor == pytest.approx(1.1)  # 1.0 + 0.2 * (1.5 - 1.0)
        assert calibration.DEFAULT.factor(model) == pytest.approx(1.1)
    finally:
        calibration.DEFAULT.reset(model)

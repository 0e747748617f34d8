"""A bug in the engine (a Rust panic surfaces as InternalError) becomes INTERNAL with a log line,
never a hung call. In process, so the engine can be made to panic."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import grpc
import pytest

import contextshift
from contextshift import _core
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift._proto.contextshift.v1 import context_service_pb2_grpc
from contextshift.api import config, server
from contextshift.api.service import shift_rpc


def panicking_shift(*args: Any, **kwargs: Any) -> Any:
    _core._panic_for_tests()


def test_engine_panic_is_internal_with_a_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setattr(shift_rpc, "shift_context", panicking_shift)
    settings = config.load(
        {"drain_seconds": 0, "http_port": 0, "store": f"sqlite:///{tmp_path}/store.db"}, env={}
    )

    async def call() -> tuple[grpc.StatusCode, str]:
        running = await server.start(settings, 0)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as chan:
                stub = context_service_pb2_grpc.ContextShiftServiceStub(chan)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.ShiftContext(pb.ShiftContextRequest(blocks_json="[]"), timeout=10)
                return caught.value.code(), caught.value.details() or ""
        finally:
            await running.stop(settings)

    with caplog.at_level(logging.ERROR, logger="contextshift.api"):
        code, message = asyncio.run(call())
    assert code == grpc.StatusCode.INTERNAL
    assert "InternalError" in message
    (record,) = [r for r in caplog.records if r.getMessage() == "unexpected error"]
    assert record.exc_info and isinstance(record.exc_info[1], contextshift.InternalError)

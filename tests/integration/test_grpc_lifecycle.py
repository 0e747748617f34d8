"""How the server starts and stops: SIGTERM drain with a call in flight, workers sharing a port,
a port clash that fails loudly."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift._proto.contextshift.v1 import context_service_pb2_grpc

from .conftest import Gate, ServerProcess, free_port, health_status, start_server
from .test_grpc_service import TYPED


def test_sigterm_drains_a_call_in_flight_then_exits_zero(tmp_path: Path) -> None:
    gate = Gate(tmp_path / "gate")
    running = start_server(tmp_path, "--drain-seconds", "0.5", "--grace-seconds", "20", gate=gate)
    outcome: dict[str, Any] = {}

    def call() -> None:
        with grpc.insecure_channel(running.address) as chan:
            stub = context_service_pb2_grpc.ContextShiftServiceStub(chan)
            request = pb.ShiftContextRequest(blocks=TYPED, context_limit=1200, response_reserve=200)
            outcome["plan"] = stub.ShiftContext(request, timeout=60).plan

    caller = threading.Thread(target=call)
    caller.start()
    gate.wait_entered()  # the call is in the engine
    running.proc.send_signal(signal.SIGTERM)
    # During the drain delay health says NOT_SERVING, so balancers move away first.
    wait_until(lambda: health_status(running.address) == health_pb2.HealthCheckResponse.NOT_SERVING)
    gate.open()
    caller.join(60)
    assert outcome["plan"].kept and outcome["plan"].prompt_tokens <= outcome["plan"].budget
    assert running.proc.wait(30) == 0
    events = [line.get("method", line["msg"]) for line in running.log_lines()]
    shift = "/contextshift.v1.ContextShiftService/ShiftContext"
    assert events.index("draining") < events.index(shift) < events.index("stopped")


def wait_until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_two_workers_share_one_port(tmp_path: Path) -> None:
    running = start_server(tmp_path, "--workers", "2")
    try:
        running.wait_serving(2)
        for _ in range(24):  # a new connection each time: the kernel spreads them over the workers
            with grpc.insecure_channel(
                running.address, options=[("grpc.use_local_subchannel_pool", 1)]
            ) as chan:
                stub = context_service_pb2_grpc.ContextShiftServiceStub(chan)
                assert stub.PreviewContext(pb.PreviewContextRequest(blocks=TYPED), timeout=10).plan.kept
    finally:
        assert running.terminate() == 0
    lines = running.log_lines()
    serving = {line["pid"] for line in lines if line["msg"] == "serving"}
    assert len(serving) == 2 and {line["port"] for line in lines if line["msg"] == "serving"} == {
        running.port
    }
    answered = {line["pid"] for line in lines if line.get("method", "").endswith("/PreviewContext")}
    assert answered == serving
    assert sum(line["msg"] == "stopped" for line in lines) == 2


@pytest.mark.parametrize("workers", ["1", "2"])
def test_port_clash_fails_loudly_naming_the_port(server: ServerProcess, tmp_path: Path, workers: str) -> None:
    clash = start_server(tmp_path, "--workers", workers, port=server.port, wait=False)
    assert clash.proc.wait(30) == 1
    (error,) = [line for line in clash.log_lines() if line["msg"] == "cannot serve"]
    assert (error["setting"], error["port"]) == ("port", server.port)
    assert error["error"].startswith(f"cannot listen on 127.0.0.1:{server.port} (port {server.port}): ")
    assert "Traceback" not in clash.log_path.read_text()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_http_port_clash_names_the_http_port(server: ServerProcess, tmp_path: Path, workers: str) -> None:
    clash = start_server(tmp_path, "--workers", workers, http_port=server.http_port, wait=False)
    assert clash.proc.wait(30) == 1
    (error,) = [line for line in clash.log_lines() if line["msg"] == "cannot serve"]
    port = server.http_port
    assert (error["setting"], error["port"]) == ("http_port", port)
    assert error["error"] == f"cannot listen on 127.0.0.1:{port} (http_port {port}): Address already in use"


def test_bad_setting_is_a_usage_error(tmp_path: Path) -> None:
    clash = start_server(tmp_path, "--workers", "0", port=free_port(), wait=False)
    assert clash.proc.wait(30) == 2
    assert "--workers: must be >= 1" in clash.log_path.read_text()

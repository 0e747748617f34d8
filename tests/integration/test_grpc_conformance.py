"""The gRPC surface as tools nobody here wrote see it: request bytes that are no message, and
server reflection asked for a method by its full name, by a raw reflection client and by ghz."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import MethodDescriptor
from google.rpc import error_details_pb2, status_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb

from .conftest import ServerProcess

SERVICE = pb.DESCRIPTOR.services_by_name["ContextShiftService"]
HEALTH_CHECK = descriptor_pool.Default().FindServiceByName("grpc.health.v1.Health").methods_by_name["Check"]
# Every unary method a client may call: the service's, read from its descriptor (a new RPC is
# covered without a change here), and health's Check.
METHODS = [*SERVICE.methods, HEALTH_CHECK]
# Field 1, length-delimited, announcing five bytes where two follow: no message of any type.
UNDECODABLE = b"\x0a\x05ab"
GHZ = Path(sys.executable).parent / "ghz"


def path_of(method: MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


def requests_counted(server: ServerProcess, method: str, status: str) -> float:
    text = httpx.get(server.http_url + "/metrics", timeout=10).text
    pattern = re.compile(
        r'^contextshift_requests_total\{(?=[^}]*surface="grpc")(?=[^}]*method="'
        + re.escape(method)
        + r'")(?=[^}]*status="'
        + status
        + r'")[^}]*\} ([0-9.e+]+)$',
        re.MULTILINE,
    )
    return sum(float(value) for value in pattern.findall(text))


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.full_name)
def test_undecodable_bytes_are_invalid_argument_on_every_rpc_logged_and_counted(
    server: ServerProcess, channel: grpc.Channel, method: MethodDescriptor
) -> None:
    path = path_of(method)
    before = requests_counted(server, path, "INVALID_ARGUMENT")
    call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as caught:
        call(UNDECODABLE, timeout=10)
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (path, error.code(), error.details())
    expected = (
        f"not an encoded {method.input_type.full_name}: field runs past the end of the message at byte 0"
    )
    assert error.details() == f"request: {expected}"
    detail = dict(error.trailing_metadata() or ())["grpc-status-details-bin"]
    info, bad = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
    first, second = status_pb2.Status.FromString(detail).details
    assert first.Unpack(info) and second.Unpack(bad)
    assert info.reason == "INVALID_INPUT"
    assert [(v.field, v.description) for v in bad.field_violations] == [("request", expected)]
    # Logged as a call, and counted under its own status.
    assert requests_counted(server, path, "INVALID_ARGUMENT") == before + 1
    logged = [line for line in server.log_lines() if line.get("method") == path and line.get("msg") == "rpc"]
    assert logged and logged[-1]["status"] == "INVALID_ARGUMENT"


def test_well_framed_bytes_that_are_no_message_say_so_without_an_offset(channel: grpc.Channel) -> None:
    # Field 1 (chat_id, a string) holding bytes that are not UTF-8: the framing is fine.
    call = channel.unary_unary(path_of(SERVICE.methods_by_name["DeleteChat"]))
    with pytest.raises(grpc.RpcError) as caught:
        call(b"\x0a\x02\xff\xfe", timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not an encoded contextshift.v1.DeleteChatRequest: its fields are framed well" in (
        caught.value.details() or ""
    )


def reflect(channel: grpc.Channel, symbol: str) -> reflection_pb2.ServerReflectionResponse:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)
    (response,) = stub.ServerReflectionInfo(iter([request]), timeout=10)
    return response


def file_names(response: reflection_pb2.ServerReflectionResponse) -> set[str]:
    protos = response.file_descriptor_response.file_descriptor_proto
    return {descriptor_pb2.FileDescriptorProto.FromString(p).name for p in protos}


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.full_name)
def test_reflection_finds_every_method_by_its_full_name(
    channel: grpc.Channel, method: MethodDescriptor
) -> None:
    response = reflect(channel, method.full_name)
    assert response.WhichOneof("message_response") == "file_descriptor_response", response
    assert method.containing_service.file.name in file_names(response)


def test_reflection_still_says_not_found_for_what_is_not_there(channel: grpc.Channel) -> None:
    for symbol in ("contextshift.v1.ContextShiftService.NoSuchMethod", "contextshift.v1.NoSuchService.Shift"):
        response = reflect(channel, symbol)
        assert response.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0], symbol


# A request each method answers with OK from an empty store (the others: a status of theirs).
GHZ_DATA = {
    "ShiftContext": {"blocks_json": '[{"role": "user", "content": "hi"}]', "context_limit": 8000},
    "PreviewContext": {"blocks_json": '[{"role": "user", "content": "hi"}]'},
    "CountTokens": {"items": [{"text": "hello"}]},
    "BenchmarkProfiles": {"documents": ["a few words"], "profiles": ["heuristic"]},
    "DeleteChat": {"chat_id": "ghz-chat"},
    "GetContextAudit": {"chat_id": "ghz-chat-without-audit"},
    "FinishGeneration": {"generation_id": "ghz-unknown", "status": "GENERATION_STATUS_COMPLETED"},
    "AppendBlocks": {"chat_id": "ghz-chat", "blocks_json": '[{"role": "user", "content": "hi"}]'},
    "SetModelConfig": {"config": {"model": "ghz-model", "context_size": 8000}},
    "GetModelConfig": {"model": "ghz-model-not-set"},
    "DeleteModelConfig": {"model": "ghz-model-not-set"},
}


@pytest.fixture(scope="module")
def ghz() -> Iterator[Path]:
    assert GHZ.exists() or shutil.which("ghz"), "ghz is installed by `make go-tools` (make test does it)"
    yield GHZ if GHZ.exists() else Path(str(shutil.which("ghz")))


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.full_name)
def test_ghz_calls_every_method_by_its_full_name_through_reflection_alone(
    ghz: Path, server: ServerProcess, method: MethodDescriptor
) -> None:
    # Bounded: one call, one connection, 127.0.0.1 only, a 10 s timeout.
    data = GHZ_DATA.get(method.name, {}) if method.containing_service is SERVICE else {}
    done = subprocess.run(
        [
            str(ghz),
            "--insecure",
            "--call",
            method.full_name,
            "--data",
            json.dumps(data),
            "--total",
            "1",
            "--concurrency",
            "1",
            "--connections",
            "1",
            "--timeout",
            "10s",
            "--format",
            "json",
            server.address,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    report = json.loads(done.stdout)
    expected = {"GetContextAudit": "NotFound", "FinishGeneration": "NotFound", "GetModelConfig": "NotFound"}
    assert report["count"] == 1
    assert report["statusCodeDistribution"] == {expected.get(method.name, "OK"): 1}, report

"""The HTTP/JSON surface over a real socket, against the real server: every route, the same
answers and error codes as gRPC, the OpenAPI document, limits, draining and two workers."""

from __future__ import annotations

import json
import re
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format
from openapi_spec_validator import validate
from starlette.routing import Mount, Route

from contextshift import profiles
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift._proto.contextshift.v1 import context_service_pb2_grpc
from contextshift.api.http.app import HttpApi
from contextshift.api.http.routes import OPERATIONS
from contextshift.api.service import gate as call_gate
from contextshift.api.service.servicer import ContextShiftService
from contextshift.audit import open_store
from contextshift.budget import Budget

from .conftest import Gate, ServerProcess, start_server
from .test_grpc_service import AS_JSON, TYPED

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "support-chat.json"


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.http_url, timeout=30) as client:
        yield client


def grpc_json(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(message, always_print_fields_with_no_presence=True)


def error_of(response: httpx.Response, http_status: int, grpc_status: str) -> dict[str, Any]:
    assert response.status_code == http_status, response.text
    assert response.headers["content-type"] == "application/json"
    error: dict[str, Any] = response.json()["error"]
    assert (error["code"], error["status"]) == (http_status, grpc_status)
    return error


# --- the RPC routes ---------------------------------------------------------------------------


def test_preview_answers_what_grpc_answers_in_every_spelling(
    http: httpx.Client, channel: grpc.Channel
) -> None:
    stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
    text = json.dumps(AS_JSON)
    expected = grpc_json(
        stub.PreviewContext(
            pb.PreviewContextRequest(blocks_json=text, context_limit=1200, response_reserve=200), timeout=10
        )
    )
    bodies = [
        {"blocksJson": text, "contextLimit": 1200, "responseReserve": 200},
        {"blocks_json": text, "context_limit": "1200", "response_reserve": 200},  # names of the .proto
        {"blocksJson": AS_JSON, "contextLimit": 1200, "responseReserve": 200},  # the array itself
    ]
    for body in bodies:
        response = http.post("/api/v2/context-preview", json=body)
        assert response.status_code == 200, response.text
        assert response.json() == expected
    assert expected["plan"]["excluded"], "the budget must make the shift drop something"


def test_typed_blocks_in_the_json_mapping(http: httpx.Client, channel: grpc.Channel) -> None:
    request = pb.PreviewContextRequest(blocks=TYPED, context_limit=1200, response_reserve=200)
    expected = grpc_json(context_service_pb2_grpc.ContextShiftServiceStub(channel).PreviewContext(request))
    response = http.post("/api/v2/context-preview", json=json_format.MessageToDict(request))
    assert response.json() == expected


def test_shift_then_finish_its_generation(http: httpx.Client) -> None:
    body = {"blocksJson": AS_JSON, "model": "claude-sonnet-4-5-http", "contextLimit": 1200}
    shifted = http.post("/api/v2/context-shift", json=body).json()
    generation = shifted["generationId"]
    assert generation and shifted["plan"]["kept"]
    finished = http.post(
        f"/api/v2/generations/{generation}/finish",
        json={"status": "GENERATION_STATUS_COMPLETED", "reportedPromptTokens": 500},
    )
    assert finished.status_code == 200, finished.text
    assert finished.json()["calibrationRecorded"] is True
    unknown = http.post("/api/v2/generations/nope/finish", json={"status": "GENERATION_STATUS_COMPLETED"})
    assert "is not stored" in error_of(unknown, 404, "NOT_FOUND")["message"]


def test_count_tokens_and_profiles(http: httpx.Client) -> None:
    counted = http.post(
        "/api/v2/count-tokens",
        json={"items": [{"text": "abcde"}, {"block": {"role": "ROLE_USER", "content": "hi"}}]},
    ).json()
    assert counted["counts"] == ["2", "5"] and counted["total"] == "7" and counted["profile"] == "heuristic"
    listed = http.get("/api/v2/tokenizer-profiles").json()["profiles"]
    assert [p["name"] for p in listed] == [p.name for p in profiles.list_profiles()]
    assert {p["exactness"] for p in listed} <= {
        "EXACTNESS_EXACT",
        "EXACTNESS_TEXT_EXACT",
        "EXACTNESS_APPROXIMATE",
    }


def test_profile_benchmark_on_the_callers_documents(http: httpx.Client) -> None:
    body = {
        "documents": ["Hello there.\n\nA second paragraph, 日本語も。"],
        "profiles": ["heuristic", "o200k_base"],
    }
    report = http.post("/api/v2/profile-benchmarks", json=body).json()
    assert (report["documents"], report["messages"]) == ("1", "2")  # int64 as strings (protobuf JSON)
    assert [t["profile"] for t in report["throughput"]] == ["heuristic", "o200k_base"]
    (accuracy,) = report["accuracy"]
    assert (accuracy["profile"], accuracy["reference"]) == ("heuristic", "o200k_base")
    unknown = http.post("/api/v2/profile-benchmarks", json={"profiles": ["no-such-profile"]})
    assert error_of(unknown, 400, "INVALID_ARGUMENT")["field_violations"][0]["field"] == "profiles[0]"


def test_strategies_and_a_summarize_preview(http: httpx.Client) -> None:
    listed = http.get("/api/v2/strategies").json()
    by_name = {s["name"]: s for s in listed["strategies"]}
    assert {"truncate", "summarize", "vector-recall", "manual", "clear-tool-results"} <= set(by_name)
    assert by_name["summarize"]["options"][0] == {
        "name": "summary_max_tokens",
        "type": "int",
        "defaultValue": 0,
        "description": "the summary block's tokens at most (0: 1/8 of the budget, 256 to 4096, at most half "
        "of what was left out)",
    }
    blocks = [{"role": "system", "content": "s"}]
    blocks += [
        {"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n} " + "words " * 30}
        for n in range(10)
    ]
    blocks.append({"role": "user", "content": "now?"})
    plan = http.post(
        "/api/v2/context-preview",
        json={"blocksJson": blocks, "contextLimit": 200, "responseReserve": 0, "strategy": "summarize"},
    ).json()["plan"]
    assert plan["strategy"] == "summarize"
    assert plan["summary"]["text"].startswith("[Conversation summary]")
    assert [d["reason"] for d in plan["kept"]][-2:] == ["SUMMARY", "PINNED"]


def test_audit_routes_answer_what_grpc_answers(http: httpx.Client, channel: grpc.Channel) -> None:
    stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
    body = {"blocksJson": AS_JSON, "chatId": "http-chat", "contextLimit": 1200, "provider": "openai"}
    generation = http.post("/api/v2/context-shift", json=body).json()["generationId"]
    audit = http.get("/api/v2/chats/http-chat/context-audit").json()
    assert audit == grpc_json(stub.GetContextAudit(pb.GetContextAuditRequest(chat_id="http-chat")))
    assert audit["audit"]["generationId"] == generation
    assert audit["audit"]["status"] == "GENERATION_STATUS_PENDING"
    assert [b["id"] for b in audit["audit"]["blocks"]] == [b["id"] for b in AS_JSON]
    failed = http.post(
        f"/api/v2/generations/{generation}/finish",
        json={
            "chatId": "http-chat",
            "status": "GENERATION_STATUS_FAILED",
            "providerError": {"httpStatus": 429},
        },
    ).json()
    assert failed["providerErrorCode"] == "PROVIDER_ERROR_CODE_RATE_LIMITED"
    # Finishing it again with another status conflicts with the stored one.
    again = http.post(
        f"/api/v2/generations/{generation}/finish", json={"status": "GENERATION_STATUS_COMPLETED"}
    )
    assert error_of(again, 409, "FAILED_PRECONDITION")["reason"] == "GENERATION_ALREADY_FINISHED"
    assert http.delete("/api/v2/chats/http-chat").json() == {"deleted": True}
    gone = error_of(http.get("/api/v2/chats/http-chat/context-audit"), 404, "NOT_FOUND")
    with pytest.raises(grpc.RpcError) as caught:
        stub.GetContextAudit(pb.GetContextAuditRequest(chat_id="http-chat"))
    assert gone["message"] == caught.value.details()
    assert http.delete("/api/v2/chats/http-chat").json() == {"deleted": False}


def test_history_and_model_configurations_over_http(http: httpx.Client) -> None:
    appended = http.post("/api/v2/chats/history-chat/blocks", json={"blocksJson": AS_JSON[:3]}).json()
    assert appended["blockCount"] == "3" and appended["profile"] == "heuristic"  # int64: a string
    rest = {
        "blocksJson": AS_JSON[3:],
        "chatId": "history-chat",
        "useStoredHistory": True,
        "contextLimit": 100_000,
    }
    whole = http.post("/api/v2/context-preview", json=rest).json()["plan"]
    assert whole["compaction"]["originalCount"] == len(AS_JSON)
    config = {
        "config": {
            "model": "http-model",
            "contextSize": 9000,
            "maxOutputTokens": 1000,
            "role": "MODEL_ROLE_FAST",
        }
    }
    assert http.put("/api/v2/model-configs", json=config).json()["config"]["contextSize"] == "9000"
    assert http.get("/api/v2/model-configs/http-model").json()["config"]["role"] == "MODEL_ROLE_FAST"
    assert "http-model" in {c["model"] for c in http.get("/api/v2/model-configs").json()["configs"]}
    planned = http.post(
        "/api/v2/context-preview", json={"blocksJson": AS_JSON, "modelRole": "MODEL_ROLE_FAST"}
    )
    assert planned.json()["plan"]["contextLimit"] == "9000"
    assert http.delete("/api/v2/model-configs/http-model").json() == {"deleted": True}
    error_of(http.get("/api/v2/model-configs/http-model"), 404, "NOT_FOUND")


# --- errors -----------------------------------------------------------------------------------


def test_budget_exceeded_is_422_with_the_numbers(http: httpx.Client) -> None:
    response = http.post(
        "/api/v2/context-preview", json={"blocksJson": AS_JSON, "contextLimit": 20, "responseReserve": 0}
    )
    error = error_of(response, 422, "FAILED_PRECONDITION")
    assert error["reason"] == "TOKEN_BUDGET_EXCEEDED"
    assert error["budget"] == 20 and error["protected_tokens"] == 32 and error["tools_tokens"] == 0
    (info,) = error["details"]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    assert info["metadata"] == {"protected_tokens": "32", "budget": "20", "tools_tokens": "0"}


@pytest.mark.parametrize(
    ("body", "field", "description"),
    [
        ({"blocksJson": [{"role": "user", "content": "hi"}, {"role": "robot"}]}, "blocks[1].role", "robot"),
        ({"blocks": [{"role": "ROLE_USER", "parts": [{}]}]}, "blocks[0].parts[0]", "empty part"),
        ({"blocksJson": "[", "strategy": "truncate"}, "blocks_json", ""),
        ({"blocksJson": [], "strategy": "nope"}, "strategy", "unknown strategy"),
        ({"blocksJson": [], "contextLimit": "many"}, "context_limit", "must be a whole number from 1 to"),
        ({"blocksJson": [], "colour": 1}, "colour", "unknown field"),
        ([1, 2], "body", "expected a JSON object"),
    ],
)
def test_bad_input_is_400_naming_the_field(
    http: httpx.Client, body: Any, field: str, description: str
) -> None:
    error = error_of(http.post("/api/v2/context-preview", json=body), 400, "INVALID_ARGUMENT")
    found = {v["field"]: v["description"] for v in error["field_violations"]}
    assert field in found and description in found[field], found
    info, bad = error["details"]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    assert info["reason"] == error["reason"] and error["reason"].startswith("INVALID_")
    assert bad["@type"] == "type.googleapis.com/google.rpc.BadRequest"


def test_a_body_that_is_not_json(http: httpx.Client) -> None:
    error = error_of(http.post("/api/v2/count-tokens", content=b"\xff{"), 400, "INVALID_ARGUMENT")
    assert error["field_violations"][0]["field"] == "body"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/api/v2/context-preview", "POST"),
        ("POST", "/api/v2/model-configs", "GET, PUT, HEAD"),
        ("PUT", "/api/v2/model-configs/gpt-4o", "GET, DELETE, HEAD"),
        ("POST", "/api/v2/chats/c1", "DELETE"),
        ("PUT", "/healthz", "GET, HEAD"),
    ],
)
def test_a_method_the_path_does_not_take_is_405_with_every_allowed_method(
    http: httpx.Client, method: str, path: str, allowed: str
) -> None:
    response = http.request(method, path)
    error = error_of(response, 405, "UNIMPLEMENTED")
    assert set(response.headers["allow"].split(", ")) == set(allowed.split(", "))
    assert error["message"] == f"{method} is not allowed on {path}: allowed {response.headers['allow']}"


def test_an_unknown_path_is_404_as_google_rpc_status(http: httpx.Client) -> None:
    error = error_of(http.get("/api/v2/nothing"), 404, "NOT_FOUND")
    assert error["message"] == "no route /api/v2/nothing (the routes: /openapi.json)"


def test_a_header_that_never_ends_is_cut_off(tmp_path: Path) -> None:
    """Slowloris: request headers that do not all arrive within --http-header-timeout-seconds get a
    408 and the connection closed, also while the client keeps sending header lines; an idle
    connection is closed without a word; a prompt request is served as before."""
    running = start_server(tmp_path, "--http-header-timeout-seconds", "1")
    try:
        # Part of a request, then nothing: the 408, then the close.
        with socket.create_connection(("127.0.0.1", running.http_port), timeout=20) as stalled:
            stalled.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            received = b""
            while chunk := stalled.recv(4096):  # bounded by the socket's 20 s timeout
                received += chunk
        status, _, body = received.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 408"), received
        assert json.loads(body)["error"] == {
            "code": 408,
            "status": "DEADLINE_EXCEEDED",
            "message": "the request's headers did not arrive within 1 s",
            "details": [],
        }
        # A header line every 0.2 s, forever: closed all the same (the 408 may be lost to the
        # reset the lines still coming cause).
        with socket.create_connection(("127.0.0.1", running.http_port), timeout=20) as dribbling:
            dribbling.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            started, closed = time.monotonic(), False
            while not closed and time.monotonic() - started < 20:
                try:
                    dribbling.sendall(b"X-Slow: 1\r\n")
                    readable, _, _ = select.select([dribbling], [], [], 0.2)
                    closed = bool(readable) and not dribbling.recv(
                        4096, socket.MSG_PEEK | socket.MSG_DONTWAIT
                    )
                    if readable and not closed:
                        assert dribbling.recv(4096).startswith(b"HTTP/1.1 408")
                except OSError:  # reset or broken pipe: closed
                    closed = True
            assert closed, "a header that never ends kept its connection for 20 s"
        with socket.create_connection(("127.0.0.1", running.http_port), timeout=20) as idle:
            assert idle.recv(1) == b""  # closed, nothing said
        with httpx.Client(base_url=running.http_url, timeout=10) as client:
            assert client.get("/healthz").status_code == 200
    finally:
        assert running.terminate() == 0


def test_oversize_bodies_are_413_with_or_without_a_length(tmp_path: Path) -> None:
    running = start_server(tmp_path, "--max-request-bytes", "65536")
    try:
        with httpx.Client(base_url=running.http_url, timeout=30) as client:
            body = json.dumps({"blocksJson": "[" + " " * 70_000 + "]"}).encode()
            error = error_of(client.post("/api/v2/context-preview", content=body), 413, "RESOURCE_EXHAUSTED")
            assert "65536 bytes" in error["message"]

            def chunks() -> Iterator[bytes]:  # no content-length: the server counts as it reads
                yield body[:40_000]
                yield body[40_000:]

            error_of(client.post("/api/v2/context-preview", content=chunks()), 413, "RESOURCE_EXHAUSTED")
            small = {"blocksJson": [{"role": "user", "content": "hi"}]}
            assert client.post("/api/v2/context-preview", json=small).status_code == 200
    finally:
        assert running.terminate() == 0


def test_calls_over_the_limit_in_flight_are_429(tmp_path: Path) -> None:
    gate = Gate(tmp_path / "gate")
    running = start_server(tmp_path, "--max-concurrent-rpcs", "1", gate=gate)
    try:
        held: dict[str, int] = {}

        def hold() -> None:
            with httpx.Client(base_url=running.http_url, timeout=30) as client:
                held["status"] = client.post(
                    "/api/v2/context-preview", json={"blocksJson": AS_JSON}
                ).status_code

        thread = threading.Thread(target=hold)
        thread.start()
        gate.wait_entered()
        with httpx.Client(base_url=running.http_url, timeout=30) as client:
            error = error_of(
                client.post("/api/v2/context-preview", json={"blocksJson": []}), 429, "RESOURCE_EXHAUSTED"
            )
        assert "limit of 1 calls in flight" in error["message"]
        gate.open()
        thread.join(30)
        assert held["status"] == 200
    finally:
        gate.open()
        assert running.terminate() == 0


# --- health, draining, the document, logs, workers ---------------------------------------------


def test_health_routes(http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "SERVING"}
    assert http.get("/readyz").json() == {"status": "SERVING"}


def test_readyz_is_503_while_draining_and_healthz_stays_up(tmp_path: Path) -> None:
    gate = Gate(tmp_path / "gate")
    running = start_server(tmp_path, "--drain-seconds", "3", gate=gate)
    try:
        with httpx.Client(base_url=running.http_url, timeout=30) as client:
            assert client.get("/readyz").status_code == 200
            running.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 3
            while client.get("/readyz").status_code != 503:
                assert time.monotonic() < deadline, "/readyz still 200 while draining"
                time.sleep(0.02)
            assert client.get("/readyz").json()["status"] == "NOT_SERVING"
            assert client.get("/healthz").status_code == 200
    finally:
        gate.open()
        assert running.terminate() == 0


def test_openapi_document_is_valid_and_lists_every_route(http: httpx.Client, tmp_path: Path) -> None:
    document = http.get("/openapi.json").json()
    validate(document)
    documented = {(path, method.upper()) for path, item in document["paths"].items() for method in item}
    with ThreadPoolExecutor(1) as executor:  # the routes as a server builds them
        store = open_store(f"sqlite:///{tmp_path}/routes.db")
        service = ContextShiftService(executor, Budget(), store)
        app = HttpApi(service, call_gate.Gate(None, max_in_flight=1), max_request_bytes=1024).app()
    routes = {
        (route.path, method)
        for route in app.routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    } | {(f"{route.path}/{{path}}", "GET") for route in app.routes if isinstance(route, Mount)}
    assert routes == documented
    assert {(op.path, op.http_method) for op in OPERATIONS} < documented
    # The errors each API route can answer, and no other: every RPC behind them is implemented, so
    # none answers 501.
    for op in OPERATIONS:
        responses = document["paths"][op.path][op.http_method.lower()]["responses"]
        assert set(responses) == {"200", "400", "401", "404", "409", "413", "422", "429", "500", "503", "507"}


@pytest.mark.parametrize(
    ("route", "body", "field", "description"),
    [
        ("PUT /api/v2/model-configs", {}, "config", "required"),
        ("PUT /api/v2/model-configs", {"config": {"contextSize": 8000}}, "config.model", "required"),
        ("POST /api/v2/generations/g1/finish", {}, "status", "required"),
        (
            "POST /api/v2/generations/g1/finish",
            {"status": "GENERATION_STATUS_PENDING"},
            "status",
            "is not one of",
        ),
        ("POST /api/v2/chats/c1/blocks", {}, "blocks", "nothing to append: set blocks or blocks_json"),
        ("POST /api/v2/context-preview", {"noSuchField": 1}, "no_such_field", "unknown field"),
        ("POST /api/v2/context-preview", {"chatId": "a\u0007b"}, "chat_id", "does not match"),
        (
            "POST /api/v2/context-preview",
            {"contextLimit": "0"},
            "context_limit",
            "from 1 to 9007199254740992",
        ),
        ("POST /api/v2/count-tokens", {"items": [{}]}, "items[0]", "empty item: set text or block"),
    ],
)
def test_the_server_refuses_what_its_document_refuses(
    http: httpx.Client, route: str, body: Any, field: str, description: str
) -> None:
    """Each body breaks a rule the OpenAPI document states (required, additionalProperties false,
    an id pattern, a range, a oneof): 400 naming the field, and the document's own schema of the
    message refuses it too."""
    from jsonschema import Draft202012Validator

    method, path = route.split()
    error = error_of(http.request(method, path, json=body), 400, "INVALID_ARGUMENT")
    found = {v["field"]: v["description"] for v in error["field_violations"]}
    assert field in found and description in found[field], found
    document = http.get("/openapi.json").json()
    operation = document["paths"][_template(method, path)][method.lower()]
    schema = dict(
        operation["requestBody"]["content"]["application/json"]["schema"], components=document["components"]
    )
    assert not Draft202012Validator(schema).is_valid(body)


def _template(method: str, path: str) -> str:
    """The route template of a path (`/api/v2/chats/c1/blocks` -> `/api/v2/chats/{id}/blocks`)."""
    for op in OPERATIONS:
        if op.http_method == method and re.fullmatch(re.escape(op.path).replace(r"\{id\}", "[^/]+"), path):
            return op.path
    raise AssertionError(path)


def test_null_is_not_set_as_the_document_says(http: httpx.Client) -> None:
    """The JSON mapping reads null as "not set"; the document says every optional field may be null."""
    body = {"blocksJson": AS_JSON, "chatId": None, "contextLimit": None, "options": None, "blocks": None}
    assert http.post("/api/v2/context-preview", json=body).status_code == 200
    schemas = http.get("/openapi.json").json()["components"]["schemas"]
    request = schemas["contextshift.v1.PreviewContextRequest"]
    assert request["additionalProperties"] is False
    for name in ("chatId", "contextLimit", "options", "blocks"):
        schema = request["properties"][name]
        assert {"type": "null"} in schema.get("anyOf", []) or "null" in schema.get("type", []), name
    # Required fields are not nullable, ids carry their pattern, path ids exclude "/".
    config = schemas["contextshift.v1.ModelConfig"]
    assert config["required"] == ["model"] and config["properties"]["model"]["maxLength"] == 256
    parameter = http.get("/openapi.json").json()["paths"]["/api/v2/chats/{id}"]["delete"]["parameters"][0]
    assert parameter["schema"]["pattern"].endswith("/]+$")


def test_answers_match_the_documented_schemas(http: httpx.Client) -> None:
    from jsonschema import Draft202012Validator

    document = http.get("/openapi.json").json()
    schemas = document["components"]["schemas"]

    def check(schema_name: str, instance: Any) -> None:
        schema = {"$ref": f"#/components/schemas/{schema_name}", "components": {"schemas": schemas}}
        Draft202012Validator(schema).validate(instance)

    check(
        "contextshift.v1.PreviewContextResponse",
        http.post("/api/v2/context-preview", json={"blocksJson": AS_JSON}).json(),
    )
    check("contextshift.v1.ListTokenizerProfilesResponse", http.get("/api/v2/tokenizer-profiles").json())
    check(
        "Error",
        http.post(
            "/api/v2/context-preview", json={"blocksJson": AS_JSON, "contextLimit": 20, "responseReserve": 0}
        ).json(),
    )


def test_http_log_lines_carry_no_message_content(server: ServerProcess, http: httpx.Client) -> None:
    http.post("/api/v2/context-shift", json={"blocksJson": AS_JSON, "chatId": "chat-secret-id"})
    http.get("/api/v2/chats/chat-secret-id/context-audit")
    text = server.log_path.read_text()
    assert "bicycle" not in text and "sealant" not in text and "chat-secret-id" not in text
    lines = [line for line in server.log_lines() if line["msg"] == "http"]
    shift = next(line for line in reversed(lines) if line["method"] == "POST /api/v2/context-shift")
    assert {"method", "status", "duration_ms", "shift_ms", "blocks", "tokens", "pid"} <= shift.keys()
    assert 0 < shift["shift_ms"] <= shift["duration_ms"]
    assert any(line["method"] == "GET /api/v2/chats/{id}/context-audit" for line in lines)


def test_two_workers_share_the_http_port(tmp_path: Path) -> None:
    running = start_server(tmp_path, "--workers", "2")
    try:
        running.wait_serving(2)

        def preview() -> None:  # on a new connection
            with httpx.Client(base_url=running.http_url, timeout=10) as client:
                assert client.post("/api/v2/context-preview", json={"blocksJson": AS_JSON}).status_code == 200

        running.until_every_worker_answers(preview, "POST /api/v2/context-preview")
    finally:
        assert running.terminate() == 0
    lines = running.log_lines()
    serving = {line["pid"] for line in lines if line["msg"] == "serving"}
    assert {line["http_port"] for line in lines if line["msg"] == "serving"} == {running.http_port}
    assert {line["pid"] for line in lines if line["msg"] == "http"} == serving and len(serving) == 2

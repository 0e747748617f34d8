"""API keys and tenants on both surfaces: every RPC and route refuses a call without a valid key,
health and metrics stay open, and a tenant reaches only its own generations, chats (audits and
stored history) and model configurations, even with the same ids. The chat matrix runs every chat
RPC and route of one tenant on the other's chat id (with and without a chat of its own under that
id), for each tenant as the owner, and checks the owner's data is unchanged after."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

import contextshift
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift._proto.contextshift.v1 import context_service_pb2_grpc
from contextshift.api.http.routes import OPERATIONS

from .conftest import ServerProcess, start_server
from .test_grpc_service import AS_JSON

KEYS = {"acme": "acme-key-0123456789abcdef", "globex": "globex-key-0123456789abcdef"}
TEXT = json.dumps(AS_JSON)
REQUESTS: dict[str, Any] = {
    "ShiftContext": pb.ShiftContextRequest(blocks_json=TEXT, chat_id="chat-1"),
    "PreviewContext": pb.PreviewContextRequest(blocks_json=TEXT),
    "CountTokens": pb.CountTokensRequest(items=[pb.CountItem(text="hi")]),
    "ListTokenizerProfiles": pb.ListTokenizerProfilesRequest(),
    "GetContextAudit": pb.GetContextAuditRequest(chat_id="chat-1"),
    "ListChats": pb.ListChatsRequest(),
    "FinishGeneration": pb.FinishGenerationRequest(generation_id="g", status=pb.GENERATION_STATUS_COMPLETED),
    "DeleteChat": pb.DeleteChatRequest(chat_id="chat-1"),
    "ListStrategies": pb.ListStrategiesRequest(),
    "AppendBlocks": pb.AppendBlocksRequest(chat_id="chat-1", blocks_json=TEXT),
    "SetModelConfig": pb.SetModelConfigRequest(config=pb.ModelConfig(model="m", context_size=9000)),
    "GetModelConfig": pb.GetModelConfigRequest(model="m"),
    "ListModelConfigs": pb.ListModelConfigsRequest(),
    "DeleteModelConfig": pb.DeleteModelConfigRequest(model="m"),
    "BenchmarkProfiles": pb.BenchmarkProfilesRequest(documents=["hello there"], profiles=["heuristic"]),
}
BODIES: dict[str, Any] = {
    "ShiftContext": {"blocksJson": TEXT, "chatId": "chat-1"},
    "PreviewContext": {"blocksJson": TEXT},
    "CountTokens": {"items": [{"text": "hi"}]},
    "FinishGeneration": {"status": "GENERATION_STATUS_COMPLETED"},
    "AppendBlocks": {"blocksJson": TEXT},
    "SetModelConfig": {"config": {"model": "m", "contextSize": 9000}},
}


def test_every_rpc_is_in_the_matrix() -> None:
    assert set(REQUESTS) == {m.name for m in pb.DESCRIPTOR.services_by_name["ContextShiftService"].methods}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("keys")
    keys = directory / "keys.txt"
    keys.write_text(f"acme:{KEYS['acme']}\n")
    # One tenant from the file, one from the environment.
    env = {"CONTEXTSHIFT_API_KEYS": f"globex:{KEYS['globex']}"}
    running = start_server(directory, "--api-keys-file", str(keys), env=env)
    yield running
    assert running.terminate() == 0


def metadata(tenant: str | None) -> tuple[tuple[str, str], ...]:
    return () if tenant is None else (("authorization", f"Bearer {KEYS[tenant]}"),)


def headers(tenant: str | None) -> dict[str, str]:
    return {} if tenant is None else {"authorization": f"Bearer {KEYS[tenant]}"}


def call_rpc(server: ServerProcess, rpc: str, request: Any, meta: tuple[tuple[str, str], ...]) -> Any:
    with grpc.insecure_channel(server.address) as channel:
        stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
        return getattr(stub, rpc)(request, metadata=meta, timeout=10)


def call_route(
    server: ServerProcess, rpc: str, auth: dict[str, str], path_id: str = "chat-1"
) -> httpx.Response:
    op = next(op for op in OPERATIONS if op.rpc == rpc)
    with httpx.Client(base_url=server.http_url, timeout=10) as client:
        return client.request(
            op.http_method,
            op.path.replace("{id}", path_id),
            json=BODIES.get(rpc) if op.body else None,
            headers=auth,
        )


@pytest.mark.parametrize("rpc", sorted(REQUESTS))
@pytest.mark.parametrize(
    "bad", [(), (("authorization", "Bearer not-a-key-of-anyone-at-all"),), (("authorization", KEYS["acme"]),)]
)
def test_every_rpc_refuses_a_call_without_a_valid_key(
    keyed: ServerProcess, rpc: str, bad: tuple[tuple[str, str], ...]
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call_rpc(keyed, rpc, REQUESTS[rpc], bad)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("rpc", sorted(op.rpc for op in OPERATIONS))
@pytest.mark.parametrize("bad", [{}, {"authorization": "Bearer not-a-key-of-anyone-at-all"}])
def test_every_route_refuses_a_call_without_a_valid_key(
    keyed: ServerProcess, rpc: str, bad: dict[str, str]
) -> None:
    response = call_route(keyed, rpc, bad)
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["status"] == "UNAUTHENTICATED"


def test_health_reflection_metrics_and_the_page_need_no_key(keyed: ServerProcess) -> None:
    with grpc.insecure_channel(keyed.address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert (
            "contextshift.v1.ContextShiftService" in ProtoReflectionDescriptorDatabase(channel).get_services()
        )
    with httpx.Client(base_url=keyed.http_url, timeout=10) as client:
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/", "/static/app.js"):
            assert client.get(path).status_code == 200, path


def test_a_valid_key_is_served_as_its_tenant(keyed: ServerProcess) -> None:
    for tenant in KEYS:
        assert call_rpc(keyed, "PreviewContext", REQUESTS["PreviewContext"], metadata(tenant)).plan.kept
        assert call_route(keyed, "PreviewContext", headers(tenant)).status_code == 200
    with contextshift.Client(keyed.address, api_key=KEYS["acme"]) as client:
        assert client.count_tokens(["abcde"]) == [2]
        assert client.list_profiles() and client.list_strategies().strategies

    async def listed() -> int:
        async with contextshift.AsyncClient(keyed.address, api_key=KEYS["acme"]) as client:
            return len((await client.list_strategies()).strategies)

    assert asyncio.run(listed()) > 0
    lines = keyed.log_lines()
    served = [line for line in lines if line.get("status") in ("OK", "200")]
    assert {
        line.get("tenant") for line in served if line["method"].endswith(("PreviewContext", "preview"))
    } == {
        "acme",
        "globex",
    }
    assert not any(key in keyed.log_path.read_text() for key in KEYS.values())


def test_a_tenant_finishes_only_its_own_generations_even_with_the_same_id(keyed: ServerProcess) -> None:
    models = {"acme": "claude-sonnet-4-5-acme", "globex": "claude-sonnet-4-5-globex"}
    with grpc.insecure_channel(keyed.address) as channel:
        stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
        # Both tenants choose the same generation id.
        for tenant, model in models.items():
            request = pb.ShiftContextRequest(blocks_json=TEXT, model=model, generation_id="shared-id")
            stub.ShiftContext(request, metadata=metadata(tenant), timeout=10)
        only_acme = pb.ShiftContextRequest(blocks_json=TEXT, model=models["acme"], generation_id="acme-only")
        stub.ShiftContext(only_acme, metadata=metadata("acme"), timeout=10)

        def finish(tenant: str, generation: str) -> pb.FinishGenerationResponse:
            request = pb.FinishGenerationRequest(
                generation_id=generation, status=pb.GENERATION_STATUS_COMPLETED, reported_prompt_tokens=400
            )
            response: pb.FinishGenerationResponse = stub.FinishGeneration(
                request, metadata=metadata(tenant), timeout=10
            )
            return response

        for tenant, model in models.items():  # each finds its own generation behind the shared id
            assert finish(tenant, "shared-id").calibration.model == model
        with pytest.raises(grpc.RpcError) as caught:
            finish("globex", "acme-only")
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    over_http = call_route(keyed, "FinishGeneration", headers("globex"), path_id="acme-only")
    assert over_http.status_code == 404
    assert call_route(keyed, "FinishGeneration", headers("acme"), path_id="acme-only").status_code == 200


def other(tenant: str) -> str:
    return next(t for t in KEYS if t != tenant)


def audit_of(server: ServerProcess, tenant: str, chat: str) -> pb.ContextAudit | None:
    try:
        response = call_rpc(
            server, "GetContextAudit", pb.GetContextAuditRequest(chat_id=chat), metadata(tenant)
        )
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.NOT_FOUND
        return None
    audit: pb.ContextAudit = response.audit
    return audit


# --- the chat matrix: every chat RPC and route, by one tenant on the other's chat id ------------

# The owner's stored history and the intruder's (when it has a chat of the same id) differ in
# length, so a shift on stored history says whose it read.
OWNER_HISTORY = [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "reply"}]
INTRUDER_HISTORY = [
    {"role": "user", "content": "other"},
    {"role": "assistant", "content": "answer"},
    {"role": "user", "content": "more"},
]


@dataclass(frozen=True)
class Case:
    server: ServerProcess
    owner: str
    intruder: str
    chat: str  # the owner's chat id, which the intruder uses
    generation: str  # the owner's pending generation of that chat
    intruder_has_chat: bool  # the intruder has a chat of the same id (history, an audit) of its own

    @property
    def intruder_history(self) -> int:
        """Blocks of stored history the intruder has under the chat id."""
        return len(INTRUDER_HISTORY) if self.intruder_has_chat else 0

    def rpc(self, name: str, request: Any) -> Any:
        return call_rpc(self.server, name, request, metadata(self.intruder))

    def route(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        with httpx.Client(base_url=self.server.http_url, timeout=10) as client:
            return client.request(method, path, json=body, headers=headers(self.intruder))

    def assert_intruders_audit(self, audit: pb.ContextAudit | None) -> None:
        """What the intruder reads under the chat id: its own audit, or none; never the owner's."""
        if self.intruder_has_chat:
            assert audit is not None and audit.provider == self.intruder
            assert audit.generation_id != self.generation
        else:
            assert audit is None


def _not_found(case: Case, name: str, request: Any) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        case.rpc(name, request)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def grpc_shift(case: Case) -> None:
    request = pb.ShiftContextRequest(blocks_json=TEXT, chat_id=case.chat, provider=case.intruder)
    generation = case.rpc("ShiftContext", request).generation_id
    assert generation != case.generation
    # The audit it wrote is the intruder's own, under its tenant.
    audit = audit_of(case.server, case.intruder, case.chat)
    assert audit is not None and audit.provider == case.intruder and audit.generation_id == generation


def grpc_shift_stored_history(case: Case) -> None:
    request = pb.ShiftContextRequest(blocks_json=TEXT, chat_id=case.chat, use_stored_history=True)
    plan = case.rpc("ShiftContext", request).plan
    assert plan.compaction.original_count == case.intruder_history + len(AS_JSON)


def grpc_preview_stored_history(case: Case) -> None:
    request = pb.PreviewContextRequest(blocks_json=TEXT, chat_id=case.chat, use_stored_history=True)
    plan = case.rpc("PreviewContext", request).plan
    assert plan.compaction.original_count == case.intruder_history + len(AS_JSON)


def grpc_audit(case: Case) -> None:
    case.assert_intruders_audit(audit_of(case.server, case.intruder, case.chat))


def grpc_finish(case: Case) -> None:
    completed = pb.GENERATION_STATUS_COMPLETED
    _not_found(
        case, "FinishGeneration", pb.FinishGenerationRequest(generation_id=case.generation, status=completed)
    )
    with_chat = pb.FinishGenerationRequest(chat_id=case.chat, generation_id=case.generation, status=completed)
    _not_found(case, "FinishGeneration", with_chat)


def grpc_delete(case: Case) -> None:
    assert case.rpc("DeleteChat", pb.DeleteChatRequest(chat_id=case.chat)).deleted == case.intruder_has_chat
    assert audit_of(case.server, case.intruder, case.chat) is None


def grpc_append(case: Case) -> None:
    request = pb.AppendBlocksRequest(chat_id=case.chat, blocks_json=json.dumps(OWNER_HISTORY[:1]))
    assert case.rpc("AppendBlocks", request).block_count == case.intruder_history + 1


def http_shift(case: Case) -> None:
    body = {"blocksJson": TEXT, "chatId": case.chat, "provider": case.intruder}
    answer = case.route("POST", "/api/v2/context-shift", body)
    assert answer.status_code == 200 and answer.json()["generationId"] != case.generation
    history = case.route("POST", "/api/v2/context-shift", {**body, "useStoredHistory": True})
    assert history.status_code == 200
    assert history.json()["plan"]["compaction"]["originalCount"] == case.intruder_history + len(AS_JSON)


def http_preview_stored_history(case: Case) -> None:
    body = {"blocksJson": TEXT, "chatId": case.chat, "useStoredHistory": True}
    answer = case.route("POST", "/api/v2/context-preview", body)
    assert answer.status_code == 200
    assert answer.json()["plan"]["compaction"]["originalCount"] == case.intruder_history + len(AS_JSON)


def http_audit(case: Case) -> None:
    answer = case.route("GET", f"/api/v2/chats/{case.chat}/context-audit")
    if case.intruder_has_chat:
        assert answer.status_code == 200
        audit = answer.json()["audit"]
        assert audit["provider"] == case.intruder and audit["generationId"] != case.generation
    else:
        assert answer.status_code == 404 and answer.json()["error"]["status"] == "NOT_FOUND"


def http_delete(case: Case) -> None:
    answer = case.route("DELETE", f"/api/v2/chats/{case.chat}")
    assert answer.status_code == 200 and answer.json() == {"deleted": case.intruder_has_chat}


def http_append(case: Case) -> None:
    answer = case.route(
        "POST", f"/api/v2/chats/{case.chat}/blocks", {"blocksJson": json.dumps(OWNER_HISTORY[:1])}
    )
    assert answer.status_code == 200
    assert int(answer.json()["blockCount"]) == case.intruder_history + 1


def http_finish(case: Case) -> None:
    for body in (
        {"status": "GENERATION_STATUS_COMPLETED"},
        {"status": "GENERATION_STATUS_FAILED", "chatId": case.chat},
    ):
        answer = case.route("POST", f"/api/v2/generations/{case.generation}/finish", body)
        assert answer.status_code == 404 and answer.json()["error"]["status"] == "NOT_FOUND"


# Each chat RPC and route, as the intruder calls it on the owner's chat id, with its expected
# answer: the intruder's own data under that id, or none.
CHAT_OPERATIONS: dict[str, Callable[[Case], None]] = {
    "grpc ShiftContext chat_id": grpc_shift,
    "grpc ShiftContext use_stored_history": grpc_shift_stored_history,
    "grpc PreviewContext use_stored_history": grpc_preview_stored_history,
    "grpc GetContextAudit": grpc_audit,
    "grpc FinishGeneration": grpc_finish,
    "grpc DeleteChat": grpc_delete,
    "grpc AppendBlocks": grpc_append,
    "POST /api/v2/context-shift": http_shift,
    "POST /api/v2/context-preview use_stored_history": http_preview_stored_history,
    "GET /api/v2/chats/{id}/context-audit": http_audit,
    "DELETE /api/v2/chats/{id}": http_delete,
    "POST /api/v2/chats/{id}/blocks": http_append,
    "POST /api/v2/generations/{id}/finish": http_finish,
}
CHAT_RPCS = {
    "ShiftContext",
    "PreviewContext",
    "GetContextAudit",
    "FinishGeneration",
    "DeleteChat",
    "AppendBlocks",
}


def test_every_chat_rpc_and_route_is_in_the_matrix() -> None:
    chat_routes = {f"{op.http_method} {op.path}" for op in OPERATIONS if op.rpc in CHAT_RPCS}
    assert chat_routes <= {name.removesuffix(" use_stored_history") for name in CHAT_OPERATIONS}
    assert {name.split()[1] for name in CHAT_OPERATIONS if name.startswith("grpc ")} == CHAT_RPCS


def owners_view(server: ServerProcess, owner: str, chat: str) -> tuple[bytes, tuple[Any, ...]]:
    """Everything the owner has under the chat id: its audit, whole, and its stored history as a
    shift on it sees it."""
    response = call_rpc(server, "GetContextAudit", pb.GetContextAuditRequest(chat_id=chat), metadata(owner))
    request = pb.PreviewContextRequest(blocks_json=TEXT, chat_id=chat, use_stored_history=True)
    plan = call_rpc(server, "PreviewContext", request, metadata(owner)).plan
    history = (
        plan.compaction.original_count,
        [(d.id, d.tokens, d.reason) for d in plan.kept],
        [(d.id, d.tokens, d.reason) for d in plan.excluded],
    )
    return response.SerializeToString(deterministic=True), history


@pytest.mark.parametrize(
    "intruder_has_chat", [False, True], ids=["intruder-without-chat", "intruder-same-id"]
)
@pytest.mark.parametrize("owner", sorted(KEYS))
@pytest.mark.parametrize("operation", list(CHAT_OPERATIONS))
def test_a_tenant_never_reaches_another_tenants_chat(
    keyed: ServerProcess, operation: str, owner: str, intruder_has_chat: bool
) -> None:
    """The owner has a chat (stored history and a pending generation's audit); the intruder calls
    one chat RPC or route with the same chat id (and the owner's generation id), and reads,
    finishes, appends to or deletes only its own data, if any; the owner's is unchanged after, and
    its generation is still its own to finish."""
    intruder = other(owner)
    chat = f"chat-{uuid.uuid4().hex}"
    call_rpc(
        keyed,
        "AppendBlocks",
        pb.AppendBlocksRequest(chat_id=chat, blocks_json=json.dumps(OWNER_HISTORY)),
        metadata(owner),
    )
    shifted = call_rpc(
        keyed,
        "ShiftContext",
        pb.ShiftContextRequest(blocks_json=TEXT, chat_id=chat, provider=owner),
        metadata(owner),
    )
    if intruder_has_chat:
        request = pb.AppendBlocksRequest(chat_id=chat, blocks_json=json.dumps(INTRUDER_HISTORY))
        call_rpc(keyed, "AppendBlocks", request, metadata(intruder))
        request_shift = pb.ShiftContextRequest(blocks_json=TEXT, chat_id=chat, provider=intruder)
        call_rpc(keyed, "ShiftContext", request_shift, metadata(intruder))
    before = owners_view(keyed, owner, chat)
    assert before[1][0] == len(OWNER_HISTORY) + len(AS_JSON)

    CHAT_OPERATIONS[operation](Case(keyed, owner, intruder, chat, shifted.generation_id, intruder_has_chat))

    assert owners_view(keyed, owner, chat) == before
    owners = audit_of(keyed, owner, chat)
    assert owners is not None and owners.provider == owner and owners.status == pb.GENERATION_STATUS_PENDING
    # Not finished, not made stale by the intruder's shifts: the owner finishes it now.
    finish = pb.FinishGenerationRequest(
        chat_id=chat, generation_id=shifted.generation_id, status=pb.GENERATION_STATUS_COMPLETED
    )
    assert (
        call_rpc(keyed, "FinishGeneration", finish, metadata(owner)).status == pb.GENERATION_STATUS_COMPLETED
    )


def listed_chats(server: ServerProcess, tenant: str, page_token: str = "") -> list[pb.ChatSummary]:
    """Every chat of the tenant's listing from `page_token` on, page by page (pages of 7)."""
    found: list[pb.ChatSummary] = []
    while True:
        request = pb.ListChatsRequest(page_size=7, page_token=page_token)
        page = call_rpc(server, "ListChats", request, metadata(tenant))
        found += page.chats
        page_token = page.next_page_token
        if not page_token:
            return found


def test_a_tenant_lists_only_its_own_chats_over_grpc_and_http(keyed: ServerProcess) -> None:
    """Each tenant has a chat of its own and one under an id both use: every page of its listing,
    over gRPC and HTTP, holds its own chats with its own generations, none of the other's, and a
    page token of the other's listing only says where its own listing goes on."""
    mark = uuid.uuid4().hex
    shifted: dict[str, dict[str, str]] = {}
    for tenant in KEYS:
        for chat in (f"{tenant}-only-{mark}", f"both-{mark}"):
            request = pb.ShiftContextRequest(blocks_json=TEXT, chat_id=chat, provider=tenant)
            response = call_rpc(keyed, "ShiftContext", request, metadata(tenant))
            shifted.setdefault(tenant, {})[chat] = response.generation_id
    listed = {tenant: listed_chats(keyed, tenant) for tenant in KEYS}
    for tenant, chats in listed.items():
        assert {c.chat_id: c.generation_id for c in chats if c.chat_id.endswith(mark)} == shifted[tenant]
        theirs = {c.generation_id for c in listed[other(tenant)]}
        assert theirs and not theirs & {c.generation_id for c in chats}
        with httpx.Client(base_url=keyed.http_url, timeout=10) as client:
            answer = client.get("/api/v2/chats", params={"pageSize": 1000}, headers=headers(tenant))
        assert [c["generationId"] for c in answer.json()["chats"]] == [c.generation_id for c in chats]
    # The other tenant's page token: where this tenant's own listing goes on, nothing of the other's.
    token = call_rpc(keyed, "ListChats", pb.ListChatsRequest(page_size=1), metadata("acme")).next_page_token
    assert token and {c.generation_id for c in listed_chats(keyed, "globex", token)} <= {
        c.generation_id for c in listed["globex"]
    }


@pytest.mark.parametrize("tenant", sorted(KEYS))
def test_model_configurations_are_the_tenants_own(keyed: ServerProcess, tenant: str) -> None:
    intruder = other(tenant)
    config = pb.ModelConfig(model=f"model-{tenant}", context_size=7000, max_output_tokens=500)
    call_rpc(keyed, "SetModelConfig", pb.SetModelConfigRequest(config=config), metadata(tenant))
    listed = call_rpc(keyed, "ListModelConfigs", pb.ListModelConfigsRequest(), metadata(intruder)).configs
    assert config.model not in {c.model for c in listed}
    with pytest.raises(grpc.RpcError) as caught:
        call_rpc(keyed, "GetModelConfig", pb.GetModelConfigRequest(model=config.model), metadata(intruder))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    # The same model name shifts with the owner's configuration only.
    request = pb.PreviewContextRequest(blocks_json=TEXT, model=config.model)
    assert call_rpc(keyed, "PreviewContext", request, metadata(tenant)).plan.context_limit == 7000
    assert call_rpc(keyed, "PreviewContext", request, metadata(intruder)).plan.context_limit != 7000
    assert not call_rpc(
        keyed, "DeleteModelConfig", pb.DeleteModelConfigRequest(model=config.model), metadata(intruder)
    ).deleted
    assert call_rpc(
        keyed, "DeleteModelConfig", pb.DeleteModelConfigRequest(model=config.model), metadata(tenant)
    ).deleted

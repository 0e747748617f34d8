"""The audit lifecycle against the real server and its SQLite store: ShiftContext writes the audit
before it replies, FinishGeneration moves it (with normalized provider errors, never their text),
GetContextAudit and DeleteChat, PreviewContext writes nothing, `audit_messages = false`, a shift cut
short by its deadline or its client, a store that cannot serve, and the server refusing to start on
a bad store."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

import contextshift
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift._proto.contextshift.v1 import context_service_pb2_grpc

from .conftest import Gate, ServerProcess, free_port, health_status, serving, start_server
from .test_grpc_service import AS_JSON, TYPED, details, stub, violations, wait_for_log

SECRET = "upstream said: the secret word is papaya"


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(tmp_path_factory.mktemp("audited")) as running:
        yield running


@pytest.fixture(scope="module")
def channel(audited: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(audited.address) as chan:
        yield chan


def chat() -> str:
    return f"chat-{uuid.uuid4()}"


def store_path(server: ServerProcess) -> Path:
    return Path(server.store.removeprefix("sqlite:///").partition("?")[0])


def store_rows(server: ServerProcess) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of a server's SQLite store, in a fixed order."""
    with sqlite3.connect(f"file:{store_path(server)}?mode=ro", uri=True) as connection:
        tables = [
            name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        return {table: sorted(connection.execute(f"SELECT * FROM {table}").fetchall()) for table in tables}


def store_bytes(server: ServerProcess) -> bytes:
    path = store_path(server)
    wal = path.with_name(path.name + "-wal")
    return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


def get_audit(channel: grpc.Channel, chat_id: str) -> pb.ContextAudit:
    return stub(channel).GetContextAudit(pb.GetContextAuditRequest(chat_id=chat_id), timeout=10).audit


def finish(
    channel: grpc.Channel, generation_id: str, status: int, **fields: Any
) -> pb.FinishGenerationResponse:
    request = pb.FinishGenerationRequest(generation_id=generation_id, status=status, **fields)
    response: pb.FinishGenerationResponse = stub(channel).FinishGeneration(request, timeout=10)
    return response


def error_reason(error: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    code, found = details(error)
    (info,) = found
    return code, info.reason


# --- the audit ----------------------------------------------------------------------------------


def test_shift_with_a_chat_writes_its_audit_before_it_replies(channel: grpc.Channel) -> None:
    chat_id = chat()
    request = pb.ShiftContextRequest(
        blocks=TYPED,
        chat_id=chat_id,
        provider="anthropic",
        model="claude-sonnet-4-5",
        context_limit=1200,
        response_reserve=200,
        output_format=pb.OUTPUT_FORMAT_ANTHROPIC_MESSAGES,
    )
    reply = stub(channel).ShiftContext(request, timeout=10)
    audit = get_audit(channel, chat_id)  # written before the reply came
    assert (audit.generation_id, audit.chat_id, audit.provider, audit.model) == (
        reply.generation_id,
        chat_id,
        "anthropic",
        "claude-sonnet-4-5",
    )
    assert audit.status == pb.GENERATION_STATUS_PENDING and audit.HasField("create_time")
    assert not audit.HasField("finish_time") and not audit.HasField("reported_prompt_tokens")
    assert audit.timings.shift_ms > 0 and audit.timings.store_read_ms > 0
    # Every block in the prompt's order, kept or excluded, as the plan decided.
    decided = {d.id: (d.tokens, d.reason, True) for d in reply.plan.kept}
    decided |= {d.id: (d.tokens, d.reason, False) for d in reply.plan.excluded}
    assert [b.id for b in audit.blocks] == [b.id for b in TYPED]
    assert [(b.tokens, b.reason, b.kept) for b in audit.blocks] == [decided[b.id] for b in TYPED]
    assert any(not b.kept for b in audit.blocks)
    # The plan as replied, without its kept and excluded lists: budget figures, raw and calibrated
    # tokens, profile, messages, compaction note, diagnostics.
    expected = pb.ContextPlan()
    expected.CopyFrom(reply.plan)
    del expected.kept[:]
    del expected.excluded[:]
    assert audit.plan == expected
    assert audit.plan.messages.system.startswith("You are Ada") and not audit.messages_omitted


def test_only_the_last_audit_of_a_chat_is_kept(channel: grpc.Channel) -> None:
    chat_id = chat()
    first = stub(channel).ShiftContext(pb.ShiftContextRequest(blocks=TYPED, chat_id=chat_id), timeout=10)
    second = stub(channel).ShiftContext(
        pb.ShiftContextRequest(blocks_json=json.dumps(AS_JSON[:3]), chat_id=chat_id), timeout=10
    )
    audit = get_audit(channel, chat_id)
    assert audit.generation_id == second.generation_id != first.generation_id
    assert [b.id for b in audit.blocks] == ["sys", "lore", "u1"]


def test_finish_generation_moves_the_audit_and_stores_only_the_normalized_error(
    audited: ServerProcess, channel: grpc.Channel
) -> None:
    chat_id = chat()
    first = stub(channel).ShiftContext(pb.ShiftContextRequest(blocks=TYPED, chat_id=chat_id), timeout=10)
    error = pb.ProviderError(
        http_status=400, type="invalid_request_error", message=f"prompt is too long; {SECRET}"
    )
    failed = finish(
        channel, first.generation_id, pb.GENERATION_STATUS_FAILED, chat_id=chat_id, provider_error=error
    )
    assert failed.status == pb.GENERATION_STATUS_FAILED
    assert failed.provider_error_code == pb.PROVIDER_ERROR_CODE_CONTEXT_LENGTH_EXCEEDED
    audit = get_audit(channel, chat_id)
    assert (audit.status, audit.provider_error_code) == (
        pb.GENERATION_STATUS_FAILED,
        pb.PROVIDER_ERROR_CODE_CONTEXT_LENGTH_EXCEEDED,
    )
    assert (
        audit.HasField("finish_time")
        and audit.finish_time.ToMilliseconds() >= audit.create_time.ToMilliseconds()
    )
    assert b"papaya" not in store_bytes(audited)

    # The same status again: accepted, unchanged; another status: refused, unchanged.
    again = finish(
        channel,
        first.generation_id,
        pb.GENERATION_STATUS_FAILED,
        provider_error=pb.ProviderError(http_status=429),
    )
    assert again.provider_error_code == pb.PROVIDER_ERROR_CODE_CONTEXT_LENGTH_EXCEEDED
    with pytest.raises(grpc.RpcError) as caught:
        finish(channel, first.generation_id, pb.GENERATION_STATUS_COMPLETED)
    assert error_reason(caught.value) == (grpc.StatusCode.FAILED_PRECONDITION, "GENERATION_ALREADY_FINISHED")
    assert get_audit(channel, chat_id) == audit

    # A newer shift replaces the audit; the old generation is stale and its report changes nothing.
    second = stub(channel).ShiftContext(pb.ShiftContextRequest(blocks=TYPED, chat_id=chat_id), timeout=10)
    with pytest.raises(grpc.RpcError) as caught:
        finish(channel, first.generation_id, pb.GENERATION_STATUS_FAILED)
    assert error_reason(caught.value) == (grpc.StatusCode.FAILED_PRECONDITION, "STALE_GENERATION")
    completed = finish(
        channel, second.generation_id, pb.GENERATION_STATUS_COMPLETED, reported_prompt_tokens=321
    )
    assert completed.status == pb.GENERATION_STATUS_COMPLETED and not completed.provider_error_code
    audit = get_audit(channel, chat_id)
    assert (audit.generation_id, audit.status, audit.reported_prompt_tokens) == (
        second.generation_id,
        pb.GENERATION_STATUS_COMPLETED,
        321,
    )


def test_delete_chat_removes_audit_generations_and_history(channel: grpc.Channel) -> None:
    chat_id = chat()
    stub(channel).AppendBlocks(
        pb.AppendBlocksRequest(chat_id=chat_id, blocks_json=json.dumps(AS_JSON[:2])), timeout=10
    )
    shifted = stub(channel).ShiftContext(
        pb.ShiftContextRequest(blocks_json=json.dumps(AS_JSON[2:]), chat_id=chat_id, use_stored_history=True),
        timeout=10,
    )
    assert len(get_audit(channel, chat_id).blocks) == len(AS_JSON)
    assert stub(channel).DeleteChat(pb.DeleteChatRequest(chat_id=chat_id), timeout=10).deleted
    with pytest.raises(grpc.RpcError) as caught:
        get_audit(channel, chat_id)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as caught:
        finish(channel, shifted.generation_id, pb.GENERATION_STATUS_COMPLETED)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    # The stored history went too: the chat now holds only what a request brings.
    preview = stub(channel).PreviewContext(
        pb.PreviewContextRequest(
            blocks_json=json.dumps(AS_JSON[2:]), chat_id=chat_id, use_stored_history=True
        ),
        timeout=10,
    )
    assert preview.plan.compaction.original_count == len(AS_JSON) - 2
    assert not stub(channel).DeleteChat(pb.DeleteChatRequest(chat_id=chat_id), timeout=10).deleted


def test_preview_context_writes_nothing_at_all(audited: ServerProcess, channel: grpc.Channel) -> None:
    chat_id = chat()
    model = f"claude-sonnet-4-5-preview-{uuid.uuid4().hex[:6]}"
    stub(channel).AppendBlocks(
        pb.AppendBlocksRequest(chat_id=chat_id, blocks=TYPED[:3], model=model), timeout=10
    )
    stub(channel).ShiftContext(pb.ShiftContextRequest(blocks=TYPED, chat_id=chat_id, model=model), timeout=10)
    before = store_rows(audited)
    for request in (
        pb.PreviewContextRequest(blocks=TYPED[3:], chat_id=chat_id, model=model, use_stored_history=True),
        pb.PreviewContextRequest(blocks=TYPED, chat_id=chat(), model=model),
        pb.PreviewContextRequest(blocks=TYPED, chat_id=chat_id, profile="o200k_base"),
    ):
        assert stub(channel).PreviewContext(request, timeout=10).plan.kept
    assert store_rows(audited) == before
    assert before["audits"] and before["chat_blocks"] and before["generations"]  # the comparison is not empty


def test_without_audit_messages_the_audit_keeps_no_text(tmp_path: Path) -> None:
    running = start_server(tmp_path, "--no-audit-messages")
    try:
        with grpc.insecure_channel(running.address) as chan:
            chat_id = chat()
            blocks = [
                {"id": "s", "role": "system", "content": f"Be brief. {SECRET}"},
                {"id": "u", "role": "user", "content": "hi"},
            ]
            reply = stub(chan).ShiftContext(
                pb.ShiftContextRequest(blocks_json=json.dumps(blocks), chat_id=chat_id), timeout=10
            )
            assert "papaya" in reply.plan.messages.messages_json  # the caller still gets its prompt
            audit = get_audit(chan, chat_id)
        assert audit.messages_omitted and not audit.plan.HasField("messages")
        assert [(b.id, b.kept) for b in audit.blocks] == [("s", True), ("u", True)]
        assert [b.reason for b in audit.blocks] == [d.reason for d in reply.plan.kept]
        assert (
            all(b.tokens > 0 for b in audit.blocks) and audit.plan.prompt_tokens == reply.plan.prompt_tokens
        )
        assert b"papaya" not in store_bytes(running)
    finally:
        assert running.terminate() == 0


# --- a shift cut short ----------------------------------------------------------------------------


def test_a_shift_whose_deadline_passes_leaves_the_previous_audit(tmp_path: Path) -> None:
    gate = Gate(tmp_path / "gate")
    gate.open()
    # One engine thread: a later call runs only once the held one is done.
    running = start_server(tmp_path, "--engine-threads", "1", gate=gate)
    try:
        with grpc.insecure_channel(running.address) as chan:
            chat_id = chat()
            first = stub(chan).ShiftContext(pb.ShiftContextRequest(blocks=TYPED, chat_id=chat_id), timeout=10)
            gate.close()
            with pytest.raises(grpc.RpcError) as caught:
                stub(chan).ShiftContext(
                    pb.ShiftContextRequest(blocks=TYPED, chat_id=chat_id, generation_id="late"), timeout=0.5
                )
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            # The server's copy of the deadline runs out a little after the client's.
            wait_for_log(running, "/contextshift.v1.ContextShiftService/ShiftContext", "DEADLINE_EXCEEDED")
            gate.open()  # the held shift finishes on its thread, after its call expired
            audit = get_audit(chan, chat_id)
            assert (audit.generation_id, audit.status) == (first.generation_id, pb.GENERATION_STATUS_PENDING)
            with pytest.raises(grpc.RpcError) as caught:
                finish(chan, "late", pb.GENERATION_STATUS_COMPLETED)
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        gate.open()
        running.terminate()


def test_a_shift_cancelled_while_its_audit_is_written_is_recorded_cancelled(tmp_path: Path) -> None:
    gate = Gate(tmp_path / "gate", at="record_shift")
    gate.open()
    running = start_server(tmp_path, gate=gate)
    try:
        chat_id = chat()
        with grpc.insecure_channel(running.address) as chan:
            stub(chan).ShiftContext(pb.ShiftContextRequest(blocks=TYPED, chat_id=chat_id), timeout=10)
        gate.close()

        async def cancel_while_writing() -> None:
            async with grpc.aio.insecure_channel(running.address) as chan:
                call = context_service_pb2_grpc.ContextShiftServiceStub(chan).ShiftContext(
                    pb.ShiftContextRequest(blocks=TYPED, chat_id=chat_id, generation_id="cancelled"),
                    timeout=30,
                )
                await asyncio.get_running_loop().run_in_executor(None, gate.wait_entered)
                call.cancel()
                assert await call.code() == grpc.StatusCode.CANCELLED

        asyncio.run(cancel_while_writing())
        # The client knows at once that it cancelled; the server learns it when the stream reset
        # arrives. Open the gate only once the server has seen it (its log line comes after the
        # call's cancellation handling): opened earlier, the write can finish and the reply go
        # out before the reset lands, and the server rightly records a shift it answered.
        wait_for_log(running, "/contextshift.v1.ContextShiftService/ShiftContext", "CANCELLED")
        gate.open()
        with grpc.insecure_channel(running.address) as chan:
            deadline = time.monotonic() + 10
            while (audit := get_audit(chan, chat_id)).generation_id != "cancelled" or (
                audit.status != pb.GENERATION_STATUS_CANCELLED
            ):
                assert time.monotonic() < deadline, (
                    f"audit not marked cancelled: {audit.generation_id} {audit.status}"
                )
                time.sleep(0.05)
            assert len(audit.blocks) == len(TYPED)  # the whole audit, marked
    finally:
        gate.open()
        running.terminate()


# --- a store that cannot serve --------------------------------------------------------------------


def test_a_locked_store_is_unavailable_and_never_blocks_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    running = start_server(tmp_path, store=f"sqlite:///{path}?busy_timeout_ms=3000")
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        with grpc.insecure_channel(running.address) as chan:
            chat_id = chat()
            stub(chan).ShiftContext(pb.ShiftContextRequest(blocks=TYPED, chat_id=chat_id), timeout=10)
            holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            finished: dict[str, float] = {}
            outcome: dict[str, Any] = {}

            def shift_waiting_for_the_lock() -> None:
                try:
                    stub(chan).ShiftContext(pb.ShiftContextRequest(blocks=TYPED, chat_id=chat_id), timeout=30)
                except grpc.RpcError as e:
                    outcome["error"] = e
                finished["shift"] = time.monotonic()

            waiting = threading.Thread(target=shift_waiting_for_the_lock)
            waiting.start()
            time.sleep(0.3)  # the shift is waiting for the lock on an engine thread
            # Meanwhile the event loop serves: a shift that needs no store, health, and a read
            # (WAL readers do not wait for the writer).
            assert stub(chan).PreviewContext(pb.PreviewContextRequest(blocks=TYPED), timeout=10).plan.kept
            assert health_status(running.address) == 1
            assert get_audit(chan, chat_id).status == pb.GENERATION_STATUS_PENDING
            finished["others"] = time.monotonic()
            waiting.join(30)
            assert finished["others"] < finished["shift"]
            error = outcome["error"]
            assert error.code() == grpc.StatusCode.UNAVAILABLE and "locked" in (error.details() or "")
            holder.execute("ROLLBACK")
            assert (
                stub(chan)
                .ShiftContext(pb.ShiftContextRequest(blocks=TYPED, chat_id=chat_id), timeout=10)
                .plan
            )
    finally:
        holder.close()
        assert running.terminate() == 0


@pytest.mark.parametrize(
    ("flags", "code", "message"),
    [
        (("--store", "mysql://localhost/contextshift"), 2, "unknown scheme 'mysql'"),
        (("--store", "sqlite:///x.db?synchronous=sometimes"), 2, "synchronous must be one of"),
        # Malformed PostgreSQL URLs: a configuration error at once, not "cannot connect" (exit 1).
        (("--store", "postgresql://someone:hunter2@127.0.0.1:notaport/db"), 2, "'notaport' is not a port"),
        (("--store", "postgresql://someone:hunter2@[::1/db"), 2, "IPv6 host address"),
        (("--store", "postgresql://127.0.0.1/db?no_such=1"), 2, 'invalid URI query parameter: "no_such"'),
        (("--model-config-file", "/nonexistent/models.toml"), 2, "No such file"),
    ],
)
def test_a_bad_store_setting_stops_the_start_with_one_error_line(
    tmp_path: Path, flags: tuple[str, ...], code: int, message: str
) -> None:
    running = start_server(tmp_path, *flags, wait=False)
    assert running.proc.wait(30) == code
    (line,) = [line for line in running.log_lines() if line["msg"] == "cannot open the store"]
    assert message in line["error"]
    assert "Traceback" not in running.log_path.read_text() and "hunter2" not in running.log_path.read_text()


def test_an_unreachable_postgresql_stops_the_start_with_one_error_line(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    running = start_server(
        tmp_path, store=f"postgresql://someone:hunter2@127.0.0.1:{port}/contextshift", wait=False
    )
    assert running.proc.wait(60) == 1
    (line,) = [line for line in running.log_lines() if line["msg"] == "cannot open the store"]
    assert "cannot connect to PostgreSQL" in line["error"] and "hunter2" not in running.log_path.read_text()
    assert "Traceback" not in running.log_path.read_text()


# --- bad input ------------------------------------------------------------------------------------


def test_bad_input_gets_its_documented_status(channel: grpc.Channel) -> None:
    chat_id = chat()
    stub(channel).ShiftContext(
        pb.ShiftContextRequest(blocks=TYPED, chat_id=chat_id, generation_id=f"g-{chat_id}"), timeout=10
    )
    long_id = "c" * 257
    invalid: list[tuple[str, Any, str]] = [
        ("GetContextAudit", pb.GetContextAuditRequest(), "chat_id"),
        ("GetContextAudit", pb.GetContextAuditRequest(chat_id=long_id), "chat_id"),
        ("GetContextAudit", pb.GetContextAuditRequest(chat_id="a\x00b"), "chat_id"),
        ("GetContextAudit", pb.GetContextAuditRequest(chat_id="a\x9fb"), "chat_id"),  # C1
        ("DeleteChat", pb.DeleteChatRequest(), "chat_id"),
        ("DeleteChat", pb.DeleteChatRequest(chat_id=long_id), "chat_id"),
        ("AppendBlocks", pb.AppendBlocksRequest(chat_id=chat_id), "blocks"),
        ("AppendBlocks", pb.AppendBlocksRequest(blocks=TYPED[:1]), "chat_id"),
        (
            "AppendBlocks",
            pb.AppendBlocksRequest(chat_id=chat_id, blocks=TYPED[:1], blocks_json="[]"),
            "blocks_json",
        ),
        ("ShiftContext", pb.ShiftContextRequest(blocks=TYPED, chat_id=long_id), "chat_id"),
        ("ShiftContext", pb.ShiftContextRequest(blocks=TYPED, generation_id="g\n"), "generation_id"),
        ("ShiftContext", pb.ShiftContextRequest(blocks=TYPED, use_stored_history=True), "use_stored_history"),
        (
            "ShiftContext",
            pb.ShiftContextRequest(blocks=TYPED, model="m", model_role=pb.MODEL_ROLE_FAST),
            "model_role",
        ),
        ("ShiftContext", pb.ShiftContextRequest(blocks=TYPED, model_role=7), "model_role"),
        ("ShiftContext", pb.ShiftContextRequest(blocks=TYPED, model="m" * 300), "model"),
        ("GetModelConfig", pb.GetModelConfigRequest(), "model"),
        ("GetModelConfig", pb.GetModelConfigRequest(model="m", role=pb.MODEL_ROLE_MAIN), "model"),
        ("DeleteModelConfig", pb.DeleteModelConfigRequest(), "model"),
        ("SetModelConfig", pb.SetModelConfigRequest(config=pb.ModelConfig(context_size=10)), "config.model"),
        (
            "SetModelConfig",
            pb.SetModelConfigRequest(config=pb.ModelConfig(model="m", context_size=0)),
            "config.context_size",
        ),
        (
            "SetModelConfig",
            pb.SetModelConfigRequest(config=pb.ModelConfig(model="m", max_output_tokens=-1)),
            "config.max_output_tokens",
        ),
        (
            "SetModelConfig",
            pb.SetModelConfigRequest(config=pb.ModelConfig(model="m", profile="nope")),
            "config.profile",
        ),
        ("SetModelConfig", pb.SetModelConfigRequest(config=pb.ModelConfig(model="m", role=9)), "config.role"),
    ]
    for rpc, request, field in invalid:
        with pytest.raises(grpc.RpcError) as caught:
            getattr(stub(channel), rpc)(request, timeout=10)
        assert field in violations(caught.value), (rpc, request)

    not_found: list[tuple[str, Any]] = [
        ("GetContextAudit", pb.GetContextAuditRequest(chat_id="no-such-chat")),
        (
            "FinishGeneration",
            pb.FinishGenerationRequest(generation_id="no-such", status=pb.GENERATION_STATUS_COMPLETED),
        ),
        (
            "FinishGeneration",
            pb.FinishGenerationRequest(
                generation_id=f"g-{chat_id}", chat_id="other", status=pb.GENERATION_STATUS_COMPLETED
            ),
        ),
        ("GetModelConfig", pb.GetModelConfigRequest(model="no-such-model")),
    ]
    for rpc, request in not_found:
        with pytest.raises(grpc.RpcError) as caught:
            getattr(stub(channel), rpc)(request, timeout=10)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND, (rpc, request)

    with pytest.raises(grpc.RpcError) as caught:  # another chat's generation id
        stub(channel).ShiftContext(
            pb.ShiftContextRequest(blocks=TYPED, chat_id=chat(), generation_id=f"g-{chat_id}"), timeout=10
        )
    assert error_reason(caught.value) == (grpc.StatusCode.ALREADY_EXISTS, "GENERATION_ID_IN_USE")
    with pytest.raises(grpc.RpcError) as caught:  # no configuration holds the role
        stub(channel).PreviewContext(
            pb.PreviewContextRequest(blocks=TYPED, model_role=pb.MODEL_ROLE_FAST), timeout=10
        )
    assert error_reason(caught.value) == (grpc.StatusCode.FAILED_PRECONDITION, "MODEL_ROLE_NOT_CONFIGURED")
    # Deleting what is not there is no error.
    assert not stub(channel).DeleteChat(pb.DeleteChatRequest(chat_id="no-such-chat"), timeout=10).deleted
    assert (
        not stub(channel)
        .DeleteModelConfig(pb.DeleteModelConfigRequest(model="no-such-model"), timeout=10)
        .deleted
    )


def test_the_python_client_reports_provider_errors(channel: grpc.Channel) -> None:
    client = contextshift.Client(channel=channel)  # not closed: the channel is the module's
    chat_id = chat()
    result = client.shift_context(AS_JSON, chat_id=chat_id, model="claude-sonnet-4-5")
    finished = client.finish_generation(
        result.generation_id,
        "failed",
        chat_id=chat_id,
        provider_error={"http_status": 429, "type": "rate_limit_error", "message": SECRET},
        reported_prompt_tokens=result.prompt_tokens,
    )
    assert (finished.status, finished.provider_error_code) == ("failed", "RATE_LIMITED")
    assert finished.calibration_recorded
    assert client.finish_generation(result.generation_id, "failed").provider_error_code == "RATE_LIMITED"

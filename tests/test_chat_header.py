"""The chat id as a header (`x-chat-id`, gRPC metadata and HTTP header) beside the body's, for a
balancer to hash on: the clients send it with every call naming a chat, the service refuses a
call whose header and body name different chats (INVALID_ARGUMENT naming both). In process; the
real surfaces and a real balancer are in tests/integration/test_balancer.py."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf.message import Message
from test_warm_chats import chat, executor, servicer, shifted, store  # noqa: F401  # fixtures

import contextshift
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api.service import chat_header
from contextshift.api.service.gate import begin_call_stats
from contextshift.api.service.servicer import ContextShiftService
from contextshift.errors import InvalidOptions


def with_header(sent: str | None, call: Callable[[], Any]) -> Any:
    """`call()` in a context whose call sent `sent` as its x-chat-id header."""

    def run() -> Any:
        chat_header.set_for_call(sent)
        return call()

    return contextvars.copy_context().run(run)


@pytest.mark.parametrize("chat_id", ["c1", "support/4711:a", "100% sure", "chat ü 𝄞", " padded "])
def test_the_header_value_names_the_chat_as_it_is_or_percent_encoded(chat_id: str) -> None:
    sent = chat_header.value(chat_id)
    assert sent.isascii() and sent.isprintable() and " " not in sent
    assert (sent == chat_id) == (chat_id in {"c1", "support/4711:a"})
    assert with_header(sent, lambda: chat_header.violations(chat_id)) == []
    assert with_header(chat_id, lambda: chat_header.violations(chat_id)) == []  # as it is, too


def test_a_header_naming_another_chat_names_both_fields() -> None:
    found = with_header("a", lambda: chat_header.violations("b"))
    assert [(v.field, v.description) for v in found] == [
        (
            "x-chat-id",
            "the x-chat-id header names chat 'a', the body's chat_id chat 'b': send one chat in both",
        ),
        ("chat_id", "names chat 'b', the x-chat-id header chat 'a'"),
    ]
    (header, body) = with_header("a", lambda: chat_header.violations(""))
    assert "the body's chat_id no chat" in header.description and body.description.startswith("names no chat")
    long = with_header("x" * 300, lambda: chat_header.violations("b"))
    assert "(300 characters)" in long[0].description
    # No header, or an empty one: nothing to compare.
    assert with_header(None, lambda: chat_header.violations("b")) == []
    assert with_header("", lambda: chat_header.violations("b")) == []


def test_the_requests_naming_a_chat_are_every_request_with_a_chat_id() -> None:
    with_chat = {
        name
        for name, message in pb.DESCRIPTOR.message_types_by_name.items()
        if name.endswith("Request") and "chat_id" in message.fields_by_name
    }
    assert {t.DESCRIPTOR.name for t in chat_header.ChatRequest.__args__} == with_chat


CHAT_CALLS: dict[str, Callable[[contextshift.Client], object]] = {
    "ShiftContext": lambda c: c.shift_context("[]", chat_id="chat ü"),
    "PreviewContext": lambda c: c.preview_context("[]", chat_id="chat ü"),
    "GetContextAudit": lambda c: c.get_context_audit("chat ü"),
    "FinishGeneration": lambda c: c.finish_generation("g", chat_id="chat ü"),
    "DeleteChat": lambda c: c.delete_chat("chat ü"),
    "AppendBlocks": lambda c: c.append_blocks("chat ü", "[]"),
}


class RecordingStub:
    """Stands in for the generated stub: records each call's metadata, answers an empty reply."""

    def __init__(self) -> None:
        self.metadata: dict[str, list[Any]] = {}

    def __getattr__(self, method: str) -> Callable[..., Message]:
        reply = getattr(pb, f"{method}Response", pb.ListTokenizerProfilesResponse)

        def call(request: Message, *, metadata: Any, timeout: float | None) -> Message:
            self.metadata.setdefault(method, []).append(metadata)
            return reply()

        return call


def test_the_client_sends_the_chat_with_every_call_naming_one() -> None:
    assert set(CHAT_CALLS) == {
        t.DESCRIPTOR.name.removesuffix("Request") for t in chat_header.ChatRequest.__args__
    }
    with contextshift.Client("127.0.0.1:1", api_key="k" * 16) as client:
        stub = RecordingStub()
        client._stub = stub  # type: ignore[assignment]
        for call in CHAT_CALLS.values():
            call(client)
        client.count_tokens(["a"])
        client.list_chats()
        client.finish_generation("g")  # names no chat
    key = ("authorization", "Bearer " + "k" * 16)
    for method in CHAT_CALLS:
        assert stub.metadata[method][0] == (key, ("x-chat-id", "chat%20%C3%BC")), method
    assert stub.metadata["CountTokens"] == stub.metadata["ListChats"] == [(key,)]
    assert stub.metadata["FinishGeneration"][1] == (key,)


@pytest.fixture
def worker(executor: Any, store: Any) -> ContextShiftService:  # noqa: F811  # the fixtures above
    return servicer(executor, store)


def refused(run: Callable[[], Any]) -> InvalidOptions:
    with pytest.raises(InvalidOptions) as caught:
        with_header("other", run)
    return caught.value


def test_a_call_whose_header_names_another_chat_is_refused_naming_both(worker: ContextShiftService) -> None:
    def shift() -> Any:
        begin_call_stats()
        request = pb.ShiftContextRequest(chat_id="c", blocks_json=chat(2))
        return asyncio.run(worker.ShiftContext(request.SerializeToString()))

    def preview() -> Any:
        request = pb.PreviewContextRequest(chat_id="c", blocks_json=chat(2))
        return asyncio.run(worker.PreviewContext(request.SerializeToString()))

    calls: dict[str, Callable[[], Any]] = {
        "ShiftContext": shift,
        "PreviewContext": preview,
        "GetContextAudit": lambda: asyncio.run(
            worker.GetContextAudit(pb.GetContextAuditRequest(chat_id="c"))
        ),
        "FinishGeneration": lambda: asyncio.run(
            worker.FinishGeneration(
                pb.FinishGenerationRequest(
                    chat_id="c", generation_id="g", status=pb.GENERATION_STATUS_COMPLETED
                )
            )
        ),
        "DeleteChat": lambda: asyncio.run(worker.DeleteChat(pb.DeleteChatRequest(chat_id="c"))),
        "AppendBlocks": lambda: asyncio.run(
            worker.AppendBlocks(pb.AppendBlocksRequest(chat_id="c", blocks_json="[]"))
        ),
    }
    for method, call in calls.items():
        assert [v.field for v in refused(call).violations] == ["x-chat-id", "chat_id"], method
    assert with_header("c", shift) and with_header(None, shift)  # the same chat, or no header: served

"""The chat a call names in its `x-chat-id` header (gRPC metadata, HTTP header), beside the chat its
body names. A balancer cannot read a chat id inside a protobuf body, so clients repeat it in this
header and the balancer hashes on it (deploy/haproxy: `balance hdr(x-chat-id)`): a chat's calls
stay on the worker whose memory holds its last prompt.

The surface reads the header and the gate sets it for the call (`Gate.serve`, beside the tenant);
where each request naming a chat is checked, once (`shift_rpc.read_request`, the servicer's other
chat RPCs: `request_violations`), a header naming another chat than the body is INVALID_ARGUMENT
with a BadRequest naming both. No header: nothing to compare. The header carries the chat id as it
is, or percent-encoded (UTF-8) when the id has characters a header value cannot carry as they are
(what the Python clients send: `value`).
"""

from __future__ import annotations

import contextvars
from urllib.parse import quote, unquote

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api import rules
from contextshift.errors import FieldViolation

HEADER = "x-chat-id"
# The requests that name a chat (their `chat_id`): the ones a client sends the header with.
ChatRequest = (
    pb.ShiftContextRequest
    | pb.PreviewContextRequest
    | pb.GetContextAuditRequest
    | pb.FinishGenerationRequest
    | pb.DeleteChatRequest
    | pb.AppendBlocksRequest
)
# What a header value carries as it is: printable ASCII but the space (trimmed at a value's ends)
# and '%' (the escape).
_AS_IS = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")
_SHOWN_CHARS = 64  # of a header value quoted in an error

_sent: contextvars.ContextVar[str | None] = contextvars.ContextVar("contextshift_chat_header", default=None)


def set_for_call(sent: str | None) -> None:
    """The current call's header (None or empty: it sent none); the gate sets it for every call."""
    _sent.set(sent or None)


def value(chat_id: str) -> str:
    """The header value naming `chat_id`: the id itself when it is printable ASCII without spaces or
    '%' (almost every id), else its UTF-8 percent-encoded."""
    return quote(chat_id, safe=_AS_IS)


def violations(chat_id: str, field: str = "chat_id") -> list[FieldViolation]:
    """The header and the body's `field` naming different chats, as two violations; none when the
    call sent no header or the header names `chat_id` (as it is or percent-encoded)."""
    sent = _sent.get()
    if sent is None or sent == chat_id or unquote(sent) == chat_id:
        return []
    shown = (
        repr(sent) if len(sent) <= _SHOWN_CHARS else f"{sent[:_SHOWN_CHARS]!r}... ({len(sent)} characters)"
    )
    body = f"chat {chat_id!r}" if chat_id else "no chat"
    return [
        FieldViolation(
            HEADER,
            f"the {HEADER} header names chat {shown}, the body's {field} {body}: send one chat in both",
        ),
        FieldViolation(field, f"names {body}, the {HEADER} header chat {shown}"),
    ]


def request_violations(request: ChatRequest) -> list[FieldViolation]:
    """What breaks the rules of a request naming a chat (`rules.violations`), and the header naming
    another chat."""
    return rules.violations(request) + violations(request.chat_id)

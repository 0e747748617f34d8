"""ListChats: a tenant's chats with an audit, newest first, a page at a time (AIP-158).

A page is one query of the store (`Store.chats`), which reads the audits' index and their
generations and never an audit's payload. It asks for one chat more than the page holds, to know
whether a next page exists: `next_page_token` is empty on the last page. The token is where the
next page starts: the last chat of this one (its shift's time and id), opaque to callers. A page
token says nothing a caller of the same tenant could not read anyway, and a crafted one only
moves where that tenant's own listing starts; one that does not decode is INVALID_ARGUMENT on
`page_token`.
"""

from __future__ import annotations

import base64
import binascii
import json

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api import rules
from contextshift.api.service.audit_payload import ERROR_CODES, STATUSES
from contextshift.api.service.ids import timestamp
from contextshift.api.service.rpc_status import invalid
from contextshift.audit.provider_errors import ErrorCode
from contextshift.audit.store import ChatCursor, ChatSummary, Store

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000  # a larger page_size is taken as this (AIP-158)
_TOKEN_VERSION = 1


def page_size(request: pb.ListChatsRequest) -> int:
    """The chats a page holds at most: the request's (checked >= 0 by `rules`), 0 the default."""
    return min(request.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def page_token(cursor: ChatCursor) -> str:
    """The token of the page that starts after `cursor`."""
    text = json.dumps([_TOKEN_VERSION, *cursor], ensure_ascii=False, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def cursor(token: str) -> ChatCursor | None:
    """Where the page of `token` starts (None: the first page); INVALID_ARGUMENT on `page_token`
    when it is not a token `page_token` made."""
    if not token:
        return None
    try:
        value = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError):
        value = None
    match value:
        case [1, int(created_ms), str(chat_id)] if (  # 1: _TOKEN_VERSION
            0 <= created_ms < 2**63 and not rules.id_violations("page_token", chat_id)
        ):
            return created_ms, chat_id
    raise invalid(
        "page_token",
        "not a page token of ListChats: pass the next_page_token of an earlier ListChats as it is",
    )


def _message(chat: ChatSummary) -> pb.ChatSummary:
    g = chat.generation
    summary = pb.ChatSummary(
        chat_id=g.chat_id,
        generation_id=g.generation_id,
        status=STATUSES[g.status],
        model=g.model,
        prompt_tokens=g.prompt_tokens,
        reported_prompt_tokens=g.reported_prompt_tokens,
        kept_count=chat.kept,
        excluded_count=chat.excluded,
        create_time=timestamp(g.created_ms),
        update_time=timestamp(g.finished_ms if g.finished_ms is not None else g.created_ms),
    )
    if g.error_code:
        summary.provider_error_code = ERROR_CODES[ErrorCode(g.error_code)]
    return summary


def list_chats(store: Store, tenant: str, request: pb.ListChatsRequest) -> pb.ListChatsResponse:
    """A page of the tenant's chats (blocking: on a thread). The request's fields are checked
    (`rules`), its token decoded (`cursor`) before."""
    size = page_size(request)
    found = store.chats(tenant, size + 1, cursor(request.page_token))
    response = pb.ListChatsResponse(chats=[_message(chat) for chat in found[:size]])
    if len(found) > size:
        last = found[size - 1]
        response.next_page_token = page_token((last.generation.created_ms, last.generation.chat_id))
    return response

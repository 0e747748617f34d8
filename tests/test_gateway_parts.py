"""The gateway's parts without a server (tests/integration/test_gateway*.py run them on a real one):
a body read once and spliced back byte for byte, whatever its bytes; the usage found in an event
stream however it is cut into chunks; the headers that go each way; where a request goes."""

from __future__ import annotations

import json

import httpx
import pytest

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api.gateway import formats, relay, upstreams
from contextshift.api.gateway.upstreams import Upstream
from contextshift.options import Secret

SUMMARY = "[Conversation summary]\nthe user asked about rivers"


def plan(kept: list[str], excluded: int = 1, summary: bool = False) -> pb.ContextPlan:
    found = pb.ContextPlan(
        kept=[pb.BlockDecision(id=i, reason="SUMMARY" if i == "summary" else "FITS") for i in kept],
        excluded=[pb.BlockDecision(id=f"x{n}") for n in range(excluded)],
    )
    if summary:
        found.summary.CopyFrom(pb.SummaryInfo(id="summary", text=SUMMARY))
    return found


def test_the_body_is_read_once_with_its_blocks_as_sent() -> None:
    raw = (
        '{"model": "claude-x", "système": "é", "system": [{"type": "text", "text": "règles"}],\n'
        ' "messages": [ {"role": "user", "content": "ça"} , {"role":"assistant","content":"ok"} ], '
        '"max_tokens": 512, "tools": [{"name": "f", "input_schema": {}}], "stream": true}'
    ).encode()
    body = formats.read(formats.MESSAGES, raw)
    assert (body.model, body.stream, body.reserve, body.reserve_field) == (
        "claude-x",
        True,
        512,
        "max_tokens",
    )
    assert body.tools == b'[{"name": "f", "input_schema": {}}]'
    blocks = json.loads(b"".join(body.blocks))
    assert blocks[0] == {"role": "system", "content": [{"type": "text", "text": "règles"}]}
    assert blocks[1:] == [{"role": "user", "content": "ça"}, {"role": "assistant", "content": "ok"}]
    assert body.messages is not None
    assert raw[body.messages.start : body.messages.end].startswith(b"[ {") and raw[
        body.messages.end - 1 :
    ].startswith(b"]")


def test_nothing_left_out_sends_the_body_itself() -> None:
    raw = b'{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}'
    body = formats.read(formats.CHAT_COMPLETIONS, raw)
    assert formats.upstream_body(body, b'[{"role":"user","content":"hi"}]', plan(["#0"], excluded=0)) is raw


@pytest.mark.parametrize("system", ['"règles"', '[{"type": "text", "text": "règles"}]', "[]", None])
def test_an_anthropic_summary_goes_to_the_end_of_system_and_the_rest_is_byte_for_byte(
    system: str | None,
) -> None:
    head = '{"model": "claude-x", "ünïcode": "é", '
    fields = f'"system": {system}, ' if system is not None else ""
    messages = ['{"role": "user", "content": "old"}', '{"role":"user", "content": "new ✓"}']
    raw = (head + fields + '"messages": [' + ", ".join(messages) + '], "max_tokens": 9}').encode()
    body = formats.read(formats.MESSAGES, raw)
    offset = 1 if body.system_block is not None else 0
    summary = json.dumps({"id": "summary", "role": "system", "kind": "summary", "content": SUMMARY})
    kept = (
        "["
        + ",".join([*([body.system_block.decode()] if body.system_block else []), summary, messages[1]])
        + "]"
    )
    ids = ["#0"] * offset + ["summary", f"#{1 + offset}"]
    sent = formats.upstream_body(body, kept.encode(), plan(ids, summary=True))
    out = json.loads(sent)
    assert out["messages"] == [json.loads(messages[1])]
    assert f'"messages": [{messages[1]}]'.encode() in sent  # the kept block's own bytes
    assert out["ünïcode"] == "é" and out["max_tokens"] == 9
    if system is None:
        assert out["system"] == SUMMARY
    elif system == '"règles"':
        assert out["system"] == "règles\n\n" + SUMMARY
    else:
        assert out["system"][-1] == {"type": "text", "text": SUMMARY}
        assert out["system"][:-1] == json.loads(system)


def test_an_openai_summary_is_a_plain_system_message_where_the_shift_put_it() -> None:
    messages = ['{"role": "user", "content": "old"}', '{"role": "user", "content": "new"}']
    raw = ('{"model": "gpt-4o", "messages": [' + ",".join(messages) + "]}").encode()
    body = formats.read(formats.CHAT_COMPLETIONS, raw)
    summary = json.dumps({"id": "summary", "role": "system", "kind": "summary", "content": SUMMARY})
    sent = formats.upstream_body(
        body, f"[{summary},{messages[1]}]".encode(), plan(["summary", "#1"], summary=True)
    )
    assert json.loads(sent)["messages"] == [{"role": "system", "content": SUMMARY}, json.loads(messages[1])]


def test_a_responses_text_input_is_one_user_block_and_instructions_a_system_block() -> None:
    body = formats.read(formats.RESPONSES, b'{"model": "o4", "input": "hi", "instructions": "be brief"}')
    assert json.loads(b"".join(body.blocks)) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert body.messages is None  # never replaced
    assert formats.renamed_field("blocks_json[1].content", body) == "input"
    assert formats.renamed_field("blocks[0].content", body) == "instructions"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b"\xff", "body"),
        (b'{"model": "m", "messages": [], } ', "body"),
        (b'{"model": "m", "messages": []} x', "body"),
        (b'{"model": "m", "system": 3, "messages": []}', "system"),
        (b'{"model": "m", "messages": [], "max_tokens": -1}', "max_tokens"),
        (b'{"model": "m", "messages": [], "stream": "yes"}', "stream"),
        (b'{"model": "m", "messages": [], "tools": {}}', "tools"),
    ],
)
def test_a_body_that_cannot_be_read_names_its_field(raw: bytes, field: str) -> None:
    with pytest.raises(formats.BodyError) as raised:
        formats.read(formats.MESSAGES, raw)
    assert raised.value.field == field


STREAMS = {
    "anthropic": (
        [
            {
                "type": "message_start",
                "message": {
                    "usage": {
                        "input_tokens": 90,
                        "cache_read_input_tokens": 10,
                        "cache_creation_input_tokens": 5,
                    }
                },
            },
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "usage error"},
            },
            {"type": "message_delta", "usage": {"output_tokens": 4}},
            {"type": "message_stop"},
        ],
        105,
    ),
    "chat": (
        [
            {"choices": [{"delta": {"content": "a"}}], "usage": None},
            {"choices": [], "usage": {"prompt_tokens": 77, "completion_tokens": 1}},
            "[DONE]",
        ],
        77,
    ),
    "responses": (
        [
            {"type": "response.output_text.delta", "delta": "a"},
            {"type": "response.completed", "response": {"usage": {"input_tokens": 66, "output_tokens": 2}}},
        ],
        66,
    ),
}


@pytest.mark.parametrize("kind", sorted(STREAMS))
def test_the_usage_is_found_however_the_stream_is_cut(kind: str) -> None:
    events, tokens = STREAMS[kind]
    stream = b"".join(
        b"event: x\r\ndata: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\r\n\r\n"
        for e in events
    )
    for cut in range(1, len(stream)):
        scan = relay.UsageScan(stream=True)
        scan.feed(stream[:cut])
        scan.feed(stream[cut:])
        scan.end()
        assert (scan.prompt_tokens, scan.finished, scan.error) == (tokens, True, None), cut


def test_an_error_event_in_a_stream_fails_the_generation() -> None:
    scan = relay.UsageScan(stream=True)
    scan.feed(
        b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}\n\n'
    )
    assert scan.error is not None and scan.error.type == "overloaded_error" and scan.finished


def test_a_json_answers_usage_is_read_once_it_has_all_come() -> None:
    scan = relay.UsageScan(stream=False)
    answer = json.dumps(
        {"type": "message", "usage": {"input_tokens": 3, "cache_read_input_tokens": 4}}
    ).encode()
    scan.feed(answer[:5])
    assert scan.prompt_tokens is None
    scan.feed(answer[5:])
    scan.end()
    assert (scan.prompt_tokens, scan.finished) == (7, True)


def test_the_headers_that_go_upstream() -> None:
    caller = [
        (b"host", b"gateway:8080"),
        (b"authorization", b"Bearer sk-caller"),
        (b"x-api-key", b"sk-caller"),
        (b"anthropic-version", b"2023-06-01"),
        (b"connection", b"keep-alive, x-hop"),
        (b"x-hop", b"1"),
        (b"transfer-encoding", b"chunked"),
        (b"content-length", b"10"),
        (b"accept-encoding", b"gzip"),
        (b"x-chat-id", b"c1"),
        (b"x-contextshift-api-key", b"tenant-key"),
        (b"x-contextshift-strategy", b"summarize"),
    ]
    plain = Upstream("a", "https://api.anthropic.com", "anthropic")
    assert relay.upstream_headers(caller, plain) == [
        (b"authorization", b"Bearer sk-caller"),
        (b"x-api-key", b"sk-caller"),
        (b"anthropic-version", b"2023-06-01"),
        (b"accept-encoding", b"identity"),
    ]
    keyed = Upstream("a", "https://api.anthropic.com", "anthropic", key=Secret("sk-server"))
    assert relay.upstream_headers(caller, keyed) == [
        (b"anthropic-version", b"2023-06-01"),
        (b"accept-encoding", b"identity"),
        (b"x-api-key", b"sk-server"),
    ]
    assert "sk-server" not in repr(keyed)
    back = httpx.Headers(
        [("Date", "x"), ("Connection", "close"), ("Retry-After", "7"), ("Transfer-Encoding", "chunked")]
    )
    assert relay.relayed_headers(back) == [(b"retry-after", b"7")]


def test_a_request_goes_to_the_longest_prefix_of_its_format() -> None:
    found = upstreams.read(
        {"upstream_openai": "https://api.openai.com/v1"},
        [
            {
                "name": "local",
                "base_url": "http://127.0.0.1:8000/v1",
                "format": "openai",
                "model_prefixes": ["llama", "gpt-4o-mini"],
            },
            {
                "name": "claude",
                "base_url": "https://api.anthropic.com",
                "format": "anthropic",
                "model_prefixes": ["claude-"],
            },
        ],
    )
    assert upstreams.choose(found, "openai", "gpt-4o").name == "openai"
    assert upstreams.choose(found, "openai", "gpt-4o-mini-2024").name == "local"
    assert upstreams.choose(found, "openai", "llama-3").name == "local"
    assert (
        upstreams.choose(found, "anthropic", "claude-x").url("/v1/messages")
        == "https://api.anthropic.com/v1/messages"
    )
    assert found[0].url("/v1/chat/completions") == "https://api.openai.com/v1/chat/completions"
    with pytest.raises(upstreams.NoUpstream, match="claude: claude-"):
        upstreams.choose(found, "anthropic", "gpt-4o")
    with pytest.raises(upstreams.UpstreamConfigError, match="is not set"):
        upstreams.with_keys([Upstream("k", "https://x/v1", "openai", api_key_env="UNSET_KEY")], env={})

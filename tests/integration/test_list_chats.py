"""ListChats against the real server, over gRPC and HTTP, on SQLite and PostgreSQL: a tenant's chats
newest first, each with its last audit in brief (what GetContextAudit answers for it), pages that
follow their tokens to the end, page_size's default and bound, the errors of bad paging arguments
naming the field, and a server started on a store at the previous schema version, which it
migrates in place and lists. Each test is a tenant of its own (an API key each) on one server per
backend, so its listing holds its own chats only."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format
from postgres_cluster import Cluster

import contextshift
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift._proto.contextshift.v1 import context_service_pb2_grpc
from contextshift.audit import open_store, sql
from contextshift.audit.migrations import LATEST, MIGRATIONS
from contextshift.audit.store import UNCHECKED, Generation, ShiftRecord

from .conftest import ServerProcess, serving
from .test_grpc_service import violations

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "support-chat.json"
BLOCKS = json.loads(EXAMPLE.read_text(encoding="utf-8"))
TENANTS = ["order", "pages", "many", "bad"]
KEYS = {tenant: f"{tenant}-key-0123456789abcdef" for tenant in TENANTS}


def store_for(backend: str, request: pytest.FixtureRequest) -> str | None:
    """The store of a new server: None (a SQLite file of its own), or a new PostgreSQL database."""
    if backend == "sqlite":
        return None
    cluster: Cluster = request.getfixturevalue("postgres")
    return cluster.new_database()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def listing(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp(f"chats-{request.param}")
    keys = directory / "keys.txt"
    keys.write_text("".join(f"{tenant}:{key}\n" for tenant, key in KEYS.items()))
    with serving(directory, "--api-keys-file", str(keys), store=store_for(request.param, request)) as running:
        yield running


def client(server: ServerProcess, tenant: str) -> contextshift.Client:
    return contextshift.Client(server.address, api_key=KEYS[tenant])


def http_get(server: ServerProcess, tenant: str, query: str = "") -> httpx.Response:
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        return http.get(f"/api/v2/chats{query}", headers={"authorization": f"Bearer {KEYS[tenant]}"})


def as_json(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(message, always_print_fields_with_no_presence=True)


def chat_ids(response: pb.ListChatsResponse) -> list[str]:
    return [chat.chat_id for chat in response.chats]


def test_chats_newest_first_each_with_its_last_audit_in_brief(listing: ServerProcess) -> None:
    with client(listing, "order") as c:
        first = c.shift_context(BLOCKS, budget=300, chat_id="first", provider="openai", model="gpt-4o")
        c.shift_context(BLOCKS, budget=300, chat_id="second", strategy="summarize")
        c.shift_context(BLOCKS, budget=100_000, chat_id="third", model="claude-sonnet-4-5")
        c.finish_generation(
            first.generation_id,
            "failed",
            chat_id="first",
            provider_error={"http_status": 429, "type": "rate_limit_error"},
            reported_prompt_tokens=250,
        )
        listed = c.list_chats()
        # The failed report does not move "first": the order is the shifts'.
        assert chat_ids(listed) == ["third", "second", "first"] and listed.next_page_token == ""
        for chat in listed.chats:
            audit = c.get_context_audit(chat.chat_id)
            assert (chat.generation_id, chat.status, chat.provider_error_code, chat.model) == (
                audit.generation_id,
                audit.status,
                audit.provider_error_code,
                audit.model,
            )
            assert chat.prompt_tokens == audit.plan.prompt_tokens
            assert (chat.kept_count, chat.excluded_count) == (
                sum(b.kept for b in audit.blocks),
                sum(not b.kept for b in audit.blocks),
            )
            assert chat.create_time == audit.create_time
            finished = audit.HasField("finish_time")
            assert chat.update_time == (audit.finish_time if finished else audit.create_time)
        third, second, failed = listed.chats
        assert (third.status, third.model) == (pb.GENERATION_STATUS_PENDING, "claude-sonnet-4-5")
        assert third.kept_count + third.excluded_count == len(BLOCKS) and third.kept_count > failed.kept_count
        summary = c.get_context_audit("second").plan.summary.id
        assert summary and second.kept_count + second.excluded_count == len(BLOCKS) + 1  # the summary block
        assert (failed.status, failed.provider_error_code, failed.reported_prompt_tokens) == (
            pb.GENERATION_STATUS_FAILED,
            pb.PROVIDER_ERROR_CODE_RATE_LIMITED,
            250,
        )
        assert (
            failed.excluded_count > 0
            and failed.update_time.ToMilliseconds() >= failed.create_time.ToMilliseconds()
        )

        # The same answer over HTTP, with the page size in the query by either name.
        for query in ("", "?pageSize=3", "?page_size=3"):
            answer = http_get(listing, "order", query)
            assert answer.status_code == 200 and answer.json() == as_json(listed), query

        # A next turn of a chat lists it first again, pending.
        c.shift_context(BLOCKS, budget=300, chat_id="first")
        again = c.list_chats()
        assert chat_ids(again) == ["first", "third", "second"]
        assert again.chats[0].status == pb.GENERATION_STATUS_PENDING
        assert not again.chats[0].HasField("reported_prompt_tokens")


def test_pages_follow_their_tokens_to_the_end_over_grpc_and_http(listing: ServerProcess) -> None:
    with client(listing, "pages") as c:
        for n in range(7):
            c.shift_context(BLOCKS[:3], chat_id=f"p{n}")
        pages: list[pb.ListChatsResponse] = []
        token = ""
        while True:
            page = c.list_chats(page_size=3, page_token=token)
            pages.append(page)
            token = page.next_page_token
            if not token:
                break
    assert [chat_ids(page) for page in pages] == [["p6", "p5", "p4"], ["p3", "p2", "p1"], ["p0"]]
    # HTTP takes the same tokens and answers the same pages, by either spelling of the parameters.
    for page, token in zip(pages, ["", pages[0].next_page_token, pages[1].next_page_token], strict=True):
        for query in (f"?pageSize=3&pageToken={token}", f"?page_size=3&page_token={token}"):
            answer = http_get(listing, "pages", query)
            assert answer.status_code == 200 and answer.json() == as_json(page), query
    # A page as large as the rest ends the listing: no token for an empty page after it.
    with client(listing, "pages") as c:
        rest = c.list_chats(page_size=4, page_token=pages[0].next_page_token)
        assert chat_ids(rest) == ["p3", "p2", "p1", "p0"] and rest.next_page_token == ""


def test_page_size_zero_is_fifty_and_more_than_a_thousand_is_a_thousand(listing: ServerProcess) -> None:
    # 1,001 chats of the tenant, written to the server's store by another process (this one), as
    # another replica over the same store would.
    store = open_store(listing.store)
    try:
        records = [
            ShiftRecord(
                "many",
                Generation(f"g{n}", f"chat-{n:04d}", "gpt-4o", n, False, 1_000_000 + n),
                b"x",
                UNCHECKED,
                1,
                0,
            )
            for n in range(1_001)
        ]
        assert store.record_shifts(records) == [None] * len(records)
    finally:
        store.close()
    with client(listing, "many") as c:
        default = c.list_chats()
        assert len(default.chats) == 50 and default.next_page_token
        assert chat_ids(default)[:2] == ["chat-1000", "chat-0999"]
        for size in (1_000, 1_001, 2**31 - 1):
            page = c.list_chats(page_size=size)
            assert len(page.chats) == 1_000 and page.next_page_token, size
        last = c.list_chats(page_size=1_000, page_token=page.next_page_token)
        assert chat_ids(last) == ["chat-0000"] and last.next_page_token == ""
    answer = http_get(listing, "many", "?pageSize=0")
    assert answer.status_code == 200 and len(answer.json()["chats"]) == 50


@pytest.mark.parametrize(
    ("request_fields", "field", "description"),
    [
        ({"page_size": -1}, "page_size", "must be between 0 and"),
        ({"page_token": "not-a-token"}, "page_token", "not a page token of ListChats"),
        ({"page_token": "WzEsLTEsImMiXQ"}, "page_token", "not a page token of ListChats"),  # [1,-1,"c"]
        ({"page_token": "WzIsMSwiYyJd"}, "page_token", "not a page token of ListChats"),  # [2,1,"c"]
    ],
)
def test_bad_paging_arguments_are_invalid_argument_naming_the_field(
    listing: ServerProcess, request_fields: dict[str, Any], field: str, description: str
) -> None:
    with grpc.insecure_channel(listing.address) as channel:
        stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ListChats(
                pb.ListChatsRequest(**request_fields),
                metadata=(("authorization", f"Bearer {KEYS['bad']}"),),
                timeout=10,
            )
    found = violations(caught.value)
    assert list(found) == [field] and description in found[field], found
    query = "&".join(f"{name}={value}" for name, value in request_fields.items())
    answer = http_get(listing, "bad", f"?{query}")
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT"
    assert [v["field"] for v in error["field_violations"]] == [field]
    assert description in error["field_violations"][0]["description"]


@pytest.mark.parametrize(
    ("query", "field", "description"),
    [
        ("?pageSize=many", "page_size", "Failed to parse pageSize field"),
        ("?pageSize=99999999999", "page_size", "out of range"),
        ("?pageSize=2&page_size=3", "page_size", "given more than once"),
        ("?pagesize=2", "pagesize", "unknown query parameter: this route takes pageSize, pageToken"),
    ],
)
def test_bad_query_strings_are_400_naming_the_parameter(
    listing: ServerProcess, query: str, field: str, description: str
) -> None:
    answer = http_get(listing, "bad", query)
    assert answer.status_code == 400, answer.text
    (violation,) = answer.json()["error"]["field_violations"]
    assert violation["field"] == field and description in violation["description"], violation


# --- a store at the previous schema version --------------------------------------------------


def previous_version_store(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store at schema version 2 holding the rows a shift of chat "old" and a finished one of
    chat "older" wrote before ListChats (their audits' payloads real ones, made by this server)."""
    made = tmp_path / "made"
    made.mkdir()
    with serving(made) as running, contextshift.Client(running.address) as c:
        older = c.shift_context(BLOCKS, budget=300, chat_id="older", model="gpt-4o")
        c.finish_generation(older.generation_id, "completed", chat_id="older", reported_prompt_tokens=230)
        c.shift_context(BLOCKS, budget=100_000, chat_id="old")
    with sqlite3.connect(running.store.removeprefix("sqlite:///")) as source:
        generations = source.execute(
            "SELECT tenant, generation_id, chat_id, model, prompt_tokens, approximate, status, error_code, "
            "reported_prompt_tokens, created_ms, finished_ms FROM generations"
        ).fetchall()
        audits = source.execute("SELECT tenant, chat_id, generation_id, payload FROM audits").fetchall()
    url = store_for(backend, request) or f"sqlite:///{tmp_path}/previous.db"
    previous = open_store(url)
    assert isinstance(previous, sql.SqlStore)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(sql, "MIGRATIONS", MIGRATIONS[:2])
        patched.setattr(sql, "LATEST", 2)
        assert previous.migrate() == 2

    def write(tx: sql.Tx) -> None:  # the statements of version 2
        for row in generations:
            tx.run(
                "INSERT INTO generations (tenant, generation_id, chat_id, model, prompt_tokens, approximate, "
                "status, error_code, reported_prompt_tokens, created_ms, finished_ms) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*row[:5], bool(row[5]), *row[6:]),
            )
        for row in audits:
            tx.run("INSERT INTO audits (tenant, chat_id, generation_id, payload) VALUES (?, ?, ?, ?)", row)

    previous._run(write, write=True)
    previous.close()
    return url


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_server_migrates_a_store_of_the_previous_version_and_lists_its_chats(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = previous_version_store(backend, request, tmp_path)
    with serving(tmp_path, store=url) as running, contextshift.Client(running.address) as c:
        listed = c.list_chats()
        assert chat_ids(listed) == ["old", "older"]
        older = listed.chats[1]
        for chat in listed.chats:  # counts unknown: stored before the store kept them
            assert not chat.HasField("kept_count") and not chat.HasField("excluded_count")
            audit = c.get_context_audit(chat.chat_id)  # the payload as it was stored
            assert (chat.generation_id, chat.prompt_tokens, chat.status) == (
                audit.generation_id,
                audit.plan.prompt_tokens,
                audit.status,
            )
            assert chat.create_time == audit.create_time
        assert (older.status, older.reported_prompt_tokens) == (pb.GENERATION_STATUS_COMPLETED, 230)
        assert older.update_time == c.get_context_audit("older").finish_time
        # Over HTTP, unknown counts are absent from the JSON.
        with httpx.Client(base_url=running.http_url, timeout=30) as http:
            shown = http.get("/api/v2/chats").json()["chats"]
        assert [("keptCount" in chat, "excludedCount" in chat) for chat in shown] == [(False, False)] * 2
        # The chat's next shift stores its counts and lists it first.
        c.shift_context(BLOCKS, budget=300, chat_id="older")
        first = c.list_chats().chats[0]
        assert first.chat_id == "older" and first.kept_count + first.excluded_count == len(BLOCKS)
        assert first.excluded_count > 0
    store = open_store(url)
    try:
        assert store.schema_version() == LATEST and store.problems() == []
    finally:
        store.close()

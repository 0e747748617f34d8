"""The real server with its store under pressure: a store at `max_store_bytes` (standing in, in CI,
for the full disk tests/full_disk_by_hand.py mounts) refuses new audits and appends with
RESOURCE_EXHAUSTED and serves the rest, until a deletion makes room; idle chats deleted by the
retention while a used one stays; PostgreSQL stopped and started under load, with audited calls
failing fast and previews served throughout; and a SQLite backup taken under load, restored and
read audit by audit."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import postgres_cluster
import pytest
from postgres_cluster import Cluster, running_cluster
from test_store import BACKENDS, store_url

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api.service import audit_payload
from contextshift.audit import open_store
from contextshift.audit.store import CLAIM_SLACK_BYTES

from .conftest import serving
from .test_grpc_service import details, stub
from .test_metrics import scrape, value
from .test_store_processes import check_audit
from .test_store_processes import conversation as chat_of
from .test_store_processes import shift_request as shifted_chat

BIG_BLOCK = json.dumps([{"role": "user", "content": "x" * 64_000}])


def shift_request(chat_id: str, tag: str) -> pb.ShiftContextRequest:
    """A shift of a 44 KiB chat whose audit compresses no better than a real one's."""
    return shifted_chat(chat_id, tag, varied=True)


def conversation(tag: str) -> str:
    return chat_of(tag, varied=True)


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return store_url(request.param, tmp_path, request)


def store_full(error: grpc.RpcError) -> str:
    """The cause of a STORE_FULL refusal (and that it is one)."""
    code, found = details(error)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, error.details())
    (info,) = found
    assert (info.reason, info.domain) == ("STORE_FULL", "contextshift.v1")
    text = error.details() or ""
    assert "is full" in text and "delete chats" in text and "DeleteChat still work" in text
    return str(info.metadata["cause"])


def test_a_full_store_refuses_audits_and_appends_serves_the_rest_and_a_deletion_makes_room(
    tmp_path: Path, url: str
) -> None:
    cap = 600_000  # a hundred or so audits of these 44 KiB chats (their blocks compressed)
    with (
        serving(tmp_path, "--max-store-bytes", str(cap), store=url) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        sent: set[str] = set()
        refused = None
        for n in range(400):
            tag = f"g{n}"
            sent.add(tag)
            try:
                stub(channel).ShiftContext(shift_request(f"chat-{n}", tag), timeout=10)
            except grpc.RpcError as e:
                refused = e
                break
        assert refused is not None and 10 <= n <= 300, n
        assert store_full(refused) == "max_store_bytes"
        with pytest.raises(grpc.RpcError) as caught:
            stub(channel).GetContextAudit(pb.GetContextAuditRequest(chat_id=f"chat-{n}"), timeout=10)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND  # nothing of the refused shift
        with pytest.raises(grpc.RpcError) as caught:
            stub(channel).AppendBlocks(
                pb.AppendBlocksRequest(chat_id="chat-0", blocks_json=BIG_BLOCK), timeout=10
            )
        assert store_full(caught.value) == "max_store_bytes"

        # Previews, reads and reports go on.
        preview = pb.PreviewContextRequest(
            blocks_json=conversation("p"), context_limit=4000, response_reserve=0
        )
        assert stub(channel).PreviewContext(preview, timeout=10).plan.prompt_tokens > 0
        audit = stub(channel).GetContextAudit(pb.GetContextAuditRequest(chat_id="chat-0"), timeout=10).audit
        check_audit(audit, "chat-0", sent)
        finish = pb.FinishGenerationRequest(generation_id="g0", status=pb.GENERATION_STATUS_COMPLETED)
        assert stub(channel).FinishGeneration(finish, timeout=10).status == pb.GENERATION_STATUS_COMPLETED
        with httpx.Client(base_url=server.http_url, timeout=10) as http:
            assert http.get("/healthz").status_code == 200 and http.get("/readyz").status_code == 200
            # 64 KiB: more than the room left, which is less than the audit refused.
            answer = http.post("/api/v2/chats/over-http/blocks", json={"blocksJson": BIG_BLOCK})
            assert answer.status_code == 507 and answer.json()["error"]["status"] == "RESOURCE_EXHAUSTED"

        # A deletion makes room for the next audit of its size: the deleted chat's, to another chat.
        assert stub(channel).DeleteChat(pb.DeleteChatRequest(chat_id="chat-1"), timeout=10).deleted
        stub(channel).ShiftContext(shift_request("after", "g1"), timeout=10)
        check_audit(
            stub(channel).GetContextAudit(pb.GetContextAuditRequest(chat_id="after"), timeout=10).audit,
            "after",
            {"g1"},
        )

        samples = scrape(server)
        backend = url.partition(":")[0].removesuffix("ql")  # sqlite, postgres(ql)
        backend = "postgresql" if backend.startswith("postgres") else "sqlite"
        assert value(samples, "contextshift_store_full_total", cause="max_store_bytes") == 3  # gRPC x2, HTTP
        assert value(samples, "contextshift_store_max_bytes", backend=backend) == cap
        assert (
            0.8 * cap < value(samples, "contextshift_store_bytes", backend=backend) <= cap + CLAIM_SLACK_BYTES
        )
        assert value(samples, "contextshift_store_chats", backend=backend) == n  # n - 1 + after
        assert value(samples, "contextshift_store_up", backend=backend) == 1
        assert value(samples, "contextshift_chats_deleted_total", by="request") == 1
        assert (value(samples, "contextshift_store_disk_free_bytes", backend=backend) > 0) == (
            backend == "sqlite"
        )


def test_idle_chats_are_deleted_in_the_background_and_a_used_one_stays(tmp_path: Path) -> None:
    retention_seconds = 3.0
    days = str(retention_seconds / 86_400)
    with (
        serving(tmp_path, "--chat-retention-days", days) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        service = stub(channel)
        service.ShiftContext(shift_request("idle", "i1"), timeout=10)
        service.AppendBlocks(
            pb.AppendBlocksRequest(chat_id="idle-history", blocks_json=BIG_BLOCK), timeout=10
        )
        deadline = time.monotonic() + 30
        gone: set[str] = set()
        n = 0
        while gone != {"idle", "idle-history"}:
            assert time.monotonic() < deadline, f"only {gone} deleted"
            service.ShiftContext(shift_request("used", f"u{n}"), timeout=10)  # used all along
            n += 1
            for chat_id in {"idle", "idle-history"} - gone:
                request = pb.ShiftContextRequest(chat_id=chat_id, use_stored_history=True, blocks_json="[]")
                try:
                    found = service.PreviewContext(request, timeout=10).plan.compaction.original_count
                    if chat_id == "idle":
                        service.GetContextAudit(pb.GetContextAuditRequest(chat_id=chat_id), timeout=10)
                    elif not found:
                        gone.add(chat_id)
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.NOT_FOUND
                    gone.add(chat_id)
            time.sleep(0.2)
        # Gone whole, as DeleteChat leaves them; the chat shifted throughout is whole too.
        assert not service.DeleteChat(pb.DeleteChatRequest(chat_id="idle"), timeout=10).deleted
        audit = service.GetContextAudit(pb.GetContextAuditRequest(chat_id="used"), timeout=10).audit
        check_audit(audit, "used", {f"u{i}" for i in range(n)})
        assert value(scrape(server), "contextshift_chats_deleted_total", by="retention") == 2
    deleted = [line for line in server.log_lines() if line.get("msg") == "deleted idle chats"]
    assert sum(line["chats"] for line in deleted) == 2


@dataclass
class Load:
    """Clients calling a server until stopped: audited shifts of their own chats (each with a
    deadline), and previews; every outcome kept with how long it took."""

    address: str
    deadline: float = 2.0
    stop: threading.Event = field(default_factory=threading.Event)
    shifts: list[tuple[float, float, grpc.StatusCode, str, str]] = field(
        default_factory=list
    )  # start, took, code, chat, tag
    previews: list[tuple[float, grpc.StatusCode]] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        self._threads = [threading.Thread(target=self._shift, args=(c,)) for c in range(4)]
        self._threads.append(threading.Thread(target=self._preview))
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(60)

    def _shift(self, client: int) -> None:
        with grpc.insecure_channel(self.address) as channel:
            n = 0
            while not self.stop.is_set():
                chat_id, tag = f"chat-{client}", f"c{client}-{n}"
                n += 1
                start = time.monotonic()
                try:
                    stub(channel).ShiftContext(shift_request(chat_id, tag), timeout=self.deadline)
                    code = grpc.StatusCode.OK
                except grpc.RpcError as e:
                    code = e.code()
                self.shifts.append((start, time.monotonic() - start, code, chat_id, tag))
                time.sleep(0.02)

    def _preview(self) -> None:
        # A model's configuration and calibration are read from the store, then kept by the
        # process (store_cache_seconds, 2 s) and used on while the store is down.
        request = pb.PreviewContextRequest(blocks_json=conversation("p"), model="gpt-4o", response_reserve=0)
        with grpc.insecure_channel(self.address) as channel:
            while not self.stop.is_set():
                try:
                    stub(channel).PreviewContext(request, timeout=self.deadline)
                    code = grpc.StatusCode.OK
                except grpc.RpcError as e:
                    code = e.code()
                self.previews.append((time.monotonic(), code))
                time.sleep(0.02)

    def ok_since(self, since: float) -> int:
        return sum(1 for start, _, code, _, _ in self.shifts if start >= since and code == grpc.StatusCode.OK)


def until(condition: object, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def test_postgresql_stopped_under_load_fails_audited_calls_fast_serves_previews_and_recovers(
    tmp_path: Path,
) -> None:
    # A cluster of its own: stopping the session's would cut off the other tests' stores.
    with running_cluster() as cluster:
        url = cluster.new_database()
        with serving(tmp_path, store=url) as server, Load(server.address) as load:
            until(lambda: load.ok_since(0) >= 20, "audited shifts before the stop")
            cluster.stop()
            stopped = time.monotonic()
            until(
                lambda: (
                    sum(1 for s in load.shifts if s[0] > stopped + 0.5) >= 20
                    and time.monotonic() > stopped + 3
                ),  # longer than a call's deadline
                "audited calls while the database is down",
            )
            # Down for certain only until the start is asked for: pg_ctl polls for the server's
            # readiness, so calls may be answered by it before cluster.start() returns.
            restarting = time.monotonic()
            down_for = restarting - stopped
            cluster.start()
            restarted = time.monotonic()
            until(lambda: load.ok_since(restarted) >= 20, "audited shifts once the database is back")
        during = [s for s in load.shifts if stopped + 0.5 < s[0] and s[0] + s[1] < restarting]
        assert during and {code for _, _, code, _, _ in during} == {grpc.StatusCode.UNAVAILABLE}, {
            code for _, _, code, _, _ in during
        }
        # Fast: no audited call waited for its deadline (which would have been DEADLINE_EXCEEDED).
        assert grpc.StatusCode.DEADLINE_EXCEEDED not in {code for _, _, code, _, _ in load.shifts}
        assert max(took for _, took, _, _, _ in during) < load.deadline
        # Previews need the database for nothing new: every one answered, before, during and after.
        assert load.previews and {code for _, code in load.previews} == {grpc.StatusCode.OK}
        assert sum(1 for at, _ in load.previews if stopped < at < restarting) >= 5
        # The server was never restarted; every chat's audit is one whole shift that was sent.
        assert server.proc.returncode == 0 and down_for > load.deadline
        sent = {
            chat: {tag for _, _, _, c, tag in load.shifts if c == chat}
            for chat in {s[3] for s in load.shifts}
        }
        store = open_store(url)
        try:
            assert store.problems() == []
            for chat_id, tags in sent.items():
                stored = store.audit("", chat_id, with_blocks=True)
                assert stored is not None
                check_audit(audit_payload.decode(stored), chat_id, tags)
        finally:
            store.close()
        logged = [
            line["msg"] for line in server.log_lines() if line.get("msg", "").startswith("the store is")
        ]
        assert logged[:2] == ["the store is down", "the store is back"]


def contextshift(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "contextshift", *args], capture_output=True, text=True, timeout=120
    )


def test_a_backup_taken_under_load_restores_and_every_audit_reads_whole(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/live.db"
    backup = tmp_path / "backups" / "live-backup.db"
    with serving(tmp_path, store=url) as server, Load(server.address, deadline=10) as load:
        until(lambda: load.ok_since(0) >= 20, "audited shifts before the backup")
        before = time.monotonic()
        done_before = {(s[3], s[4]) for s in load.shifts if s[2] == grpc.StatusCode.OK}
        made = contextshift("store", "backup", str(backup), "--store", url, "--json")
        after = time.monotonic()
        until(lambda: load.ok_since(after) >= 20, "audited shifts after the backup")
    assert made.returncode == 0, made.stderr
    report = json.loads(made.stdout)
    assert report["checked"]["ok"] and report["checked"]["schema_version"] >= 2
    assert sum(1 for s in load.shifts if before < s[0] < after and s[2] == grpc.StatusCode.OK) >= 1, (
        "no write during it"
    )

    restored_url = f"sqlite:///{tmp_path}/restored.db"
    restored = contextshift("store", "restore", str(backup), "--store", restored_url)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    checked = contextshift("store", "check", "--store", restored_url, "--json")
    assert checked.returncode == 0 and json.loads(checked.stdout)["problems"] == []
    chats = {s[3] for s in load.shifts}
    sent = {chat: {s[4] for s in load.shifts if s[3] == chat} for chat in chats}
    with serving(tmp_path, store=restored_url) as again, grpc.insecure_channel(again.address) as channel:
        for chat_id in chats:
            audit = (
                stub(channel).GetContextAudit(pb.GetContextAuditRequest(chat_id=chat_id), timeout=10).audit
            )
            check_audit(audit, chat_id, sent[chat_id])
            # The snapshot is no older than the backup's start: each chat's shifts done by then
            # are in it, or a later one is.
            done = [int(tag.rpartition("-")[2]) for c, tag in done_before if c == chat_id]
            assert int(audit.generation_id.rpartition("-")[2]) >= max(done, default=-1)
    assert json.loads(checked.stdout)["chats"] == len(chats)
    # Restoring over a store that holds chats needs --overwrite.
    refused = contextshift("store", "restore", str(backup), "--store", url)
    assert refused.returncode == 1 and "--overwrite" in refused.stderr


def test_the_documented_postgresql_backup_commands_restore_every_audit(
    tmp_path: Path, postgres: Cluster
) -> None:
    url = postgres.new_database()
    with serving(tmp_path, store=url) as server, grpc.insecure_channel(server.address) as channel:
        for n in range(5):
            stub(channel).ShiftContext(shift_request(f"chat-{n}", f"g{n}"), timeout=10)
        stub(channel).AppendBlocks(
            pb.AppendBlocksRequest(chat_id="chat-0", blocks_json=BIG_BLOCK), timeout=10
        )
    binaries = postgres_cluster.binaries()
    dump = tmp_path / "contextshift.dump"
    command = [str(binaries / "pg_dump"), "--format=custom", f"--file={dump}", url]
    assert subprocess.run(command, capture_output=True).returncode == 0
    restored = postgres.new_database()
    command = [
        str(binaries / "pg_restore"),
        "--no-owner",
        "--exit-on-error",
        f"--dbname={restored}",
        str(dump),
    ]
    assert subprocess.run(command, capture_output=True).returncode == 0
    checked = contextshift("store", "check", "--store", restored, "--json")
    assert checked.returncode == 0 and json.loads(checked.stdout)["chats"] == 5
    with serving(tmp_path, store=restored) as server, grpc.insecure_channel(server.address) as channel:
        for n in range(5):
            audit = (
                stub(channel)
                .GetContextAudit(pb.GetContextAuditRequest(chat_id=f"chat-{n}"), timeout=10)
                .audit
            )
            check_audit(audit, f"chat-{n}", {f"g{n}"})
        stub(channel).ShiftContext(shift_request("chat-5", "g5"), timeout=10)  # and it takes new ones
    original, copy = open_store(url), open_store(restored)
    try:  # the counts behind max_store_bytes came along, and the triggers went on counting
        assert copy.usage().data_bytes > original.usage().data_bytes > 0
        assert copy.problems() == []
    finally:
        original.close()
        copy.close()


def test_store_commands_say_what_is_wrong(tmp_path: Path, postgres: Cluster) -> None:
    missing = contextshift("store", "check", "--store", f"sqlite:///{tmp_path}/none.db")
    assert missing.returncode == 1 and "no such store file" in missing.stderr
    assert not (tmp_path / "none.db").exists()  # a check never creates a store
    bad = contextshift("store", "check", "--store", "mysql://x/y")
    assert bad.returncode == 2 and "unknown scheme" in bad.stderr
    url = postgres.new_database()
    store = open_store(url)
    store.migrate()
    store.close()
    checked = contextshift("store", "check", "--store", url)
    assert checked.returncode == 0 and "schema: version" in checked.stdout
    refused = contextshift("store", "backup", str(tmp_path / "pg.db"), "--store", url)
    assert refused.returncode == 1 and "pg_dump" in refused.stderr
    existing = tmp_path / "exists.db"
    existing.write_bytes(b"")
    live = f"sqlite:///{tmp_path}/live.db"
    store = open_store(live)
    store.migrate()
    store.close()
    again = contextshift("store", "backup", str(existing), "--store", live)
    assert again.returncode == 1 and "exists" in again.stderr

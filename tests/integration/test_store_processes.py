"""Several server processes over one store (one SQLite file, one PostgreSQL database): a shift
served by one is audited, finished, configured and deleted through the other (two replicas, or two
workers of one server); many clients mixing shifts, reports, appends, reads and deletes leave every
chat with one well-formed audit or none and a whole history; a server killed with SIGKILL in the
middle of writes, again and again, leaves a store that opens, passes its integrity check and
holds, for every chat, a complete old or new audit; and the default store, in the working
directory, keeps its audits from one server to the next."""

from __future__ import annotations

import json
import json.decoder
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from test_store import BACKENDS, store_url, threads

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api.service import audit_payload
from contextshift.audit import open_store

from .conftest import ServerProcess, serving, start_server
from .test_grpc_service import stub
from .test_metrics import scrape, value

BLOCKS = 24  # per shift: a system prompt, then turns; the budget keeps about half


# Words of real text on every machine (the standard library's JSON decoder, source and docs).
WORDS = Path(json.decoder.__file__).read_text(encoding="utf-8").split()


def conversation(tag: str, *, varied: bool = False) -> str:
    """A chat whose every block says which shift sent it: ids `<tag>-<i>`. `varied`: its turns
    are words drawn at random (about 44 KiB), so its audit compresses no better than a real one's;
    else one word repeated."""
    rng = random.Random(tag)
    blocks = [{"id": f"{tag}-0", "role": "system", "content": f"System prompt of {tag}."}]
    for i in range(1, BLOCKS):
        role = "user" if i % 2 else "assistant"
        words = " ".join(rng.choice(WORDS) for _ in range(300)) if varied else "words " * 300
        blocks.append({"id": f"{tag}-{i}", "role": role, "content": f"Turn {i} of {tag}. {words}"})
    return json.dumps(blocks)


def shift_request(chat_id: str, tag: str, *, varied: bool = False) -> pb.ShiftContextRequest:
    # The tag is the generation id, so an audit says which shift it is.
    return pb.ShiftContextRequest(
        blocks_json=conversation(tag, varied=varied),
        chat_id=chat_id,
        generation_id=tag,
        context_limit=4000,
        response_reserve=0,
    )


def check_audit(audit: pb.ContextAudit, chat_id: str, sent: set[str]) -> None:
    """One shift's audit, whole: every block of that shift in order, kept ones in the messages."""
    tag = audit.generation_id
    assert tag in sent and audit.chat_id == chat_id, (chat_id, tag)
    assert [b.id for b in audit.blocks] == [f"{tag}-{i}" for i in range(BLOCKS)], (chat_id, tag)
    kept = [b for b in audit.blocks if b.kept]
    assert kept and len(kept) < BLOCKS
    assert audit.plan.prompt_tokens == sum(b.tokens for b in kept)
    assert [m["id"] for m in json.loads(audit.plan.messages.messages_json)] == [b.id for b in kept]


APPENDED = 3  # blocks per AppendBlocks call


def appendix(tag: str) -> str:
    """What one AppendBlocks call adds: blocks with ids `<tag>-<i>`."""
    return json.dumps(
        [
            {
                "id": f"{tag}-{i}",
                "role": "user" if i % 2 == 0 else "assistant",
                "content": f"Appended {i} of {tag}.",
            }
            for i in range(APPENDED)
        ]
    )


def check_history(ids: list[str], chat_id: str, sent: set[str]) -> None:
    """A stored history, whole: appends that were sent, each complete and in one piece."""
    tags = [block_id.rpartition("-")[0] for block_id in ids[::APPENDED]]
    assert ids == [f"{tag}-{i}" for tag in tags for i in range(APPENDED)], (chat_id, ids)
    assert set(tags) <= sent and len(set(tags)) == len(tags), (chat_id, tags)


@contextmanager
def servers(tmp_path: Path, url: str, *flags: str) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Two server processes over one store."""
    with serving(tmp_path, *flags, store=url) as first, serving(tmp_path, *flags, store=url) as second:
        yield first, second


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return store_url(request.param, tmp_path, request)


def finish_reported(
    channel: grpc.Channel, chat_id: str, shifted: pb.ShiftContextResponse
) -> pb.FinishGenerationResponse:
    """Finishes a shift's generation COMPLETED, with the provider reporting twice its tokens."""
    request = pb.FinishGenerationRequest(
        chat_id=chat_id,
        generation_id=shifted.generation_id,
        status=pb.GENERATION_STATUS_COMPLETED,
        reported_prompt_tokens=2 * shifted.plan.prompt_tokens,
    )
    response: pb.FinishGenerationResponse = stub(channel).FinishGeneration(request, timeout=10)
    return response


def test_two_replicas_serve_any_chat(tmp_path: Path, url: str) -> None:
    # No read cache: every read sees the other replica's last write.
    with (
        servers(tmp_path, url, "--store-cache-seconds", "0") as (a, b),
        grpc.insecure_channel(a.address) as to_a,
        grpc.insecure_channel(b.address) as to_b,
    ):
        chat_id, model = "replicated", "claude-sonnet-4-5-replicas"
        shifted = stub(to_a).ShiftContext(
            pb.ShiftContextRequest(blocks_json=conversation("r1"), chat_id=chat_id, model=model), timeout=10
        )
        audit = stub(to_b).GetContextAudit(pb.GetContextAuditRequest(chat_id=chat_id), timeout=10).audit
        assert audit.generation_id == shifted.generation_id and audit.status == pb.GENERATION_STATUS_PENDING
        # Reported through the other replica: the audit moves, and the calibration reaches both.
        finished = finish_reported(to_b, chat_id, shifted)
        assert finished.calibration_recorded and finished.calibration.factor == pytest.approx(1.2)
        again = stub(to_a).PreviewContext(
            pb.PreviewContextRequest(blocks_json=conversation("r2"), model=model), timeout=10
        )
        assert again.plan.calibration_factor == pytest.approx(1.2)
        assert stub(to_a).GetContextAudit(
            pb.GetContextAuditRequest(chat_id=chat_id), timeout=10
        ).audit.status == (pb.GENERATION_STATUS_COMPLETED)
        # A configuration set on one replica applies on the other.
        stub(to_b).SetModelConfig(
            pb.SetModelConfigRequest(config=pb.ModelConfig(model=model, context_size=9000)), timeout=10
        )
        assert (
            stub(to_a)
            .PreviewContext(pb.PreviewContextRequest(blocks_json="[]", model=model), timeout=10)
            .plan.context_limit
            == 9000
        )
        # History appended on one replica is shifted on the other; deleted there, gone here.
        stub(to_a).AppendBlocks(
            pb.AppendBlocksRequest(chat_id=chat_id, blocks_json=conversation("h")), timeout=10
        )
        with_history = stub(to_b).ShiftContext(
            pb.ShiftContextRequest(chat_id=chat_id, use_stored_history=True, blocks_json="[]"), timeout=10
        )
        assert with_history.plan.compaction.original_count == BLOCKS
        assert stub(to_b).DeleteChat(pb.DeleteChatRequest(chat_id=chat_id), timeout=10).deleted
        with pytest.raises(grpc.RpcError) as caught:
            stub(to_a).GetContextAudit(pb.GetContextAuditRequest(chat_id=chat_id), timeout=10)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_chat_shifted_by_turns_on_two_replicas_is_made_again_against_the_others_audit(
    tmp_path: Path, url: str
) -> None:
    """Each replica keeps the chat's last prompt it wrote; the one that wrote last before the other
    finds, in its write's transaction, that the chat's audit changed, and makes the shift again
    (counted): the chat's audit is always the last answered shift's."""
    backend = url.partition(":")[0]
    with (
        servers(tmp_path, url) as (a, b),
        grpc.insecure_channel(a.address) as to_a,
        grpc.insecure_channel(b.address) as to_b,
    ):
        sent: set[str] = set()
        for tag, channel in (("a1", to_a), ("a2", to_a), ("b1", to_b), ("a3", to_a)):
            sent.add(tag)
            assert stub(channel).ShiftContext(shift_request("turns", tag), timeout=10).generation_id == tag
            audit = stub(to_b).GetContextAudit(pb.GetContextAuditRequest(chat_id="turns"), timeout=10).audit
            assert audit.generation_id == tag
            check_audit(audit, "turns", sent)
        assert (
            value(scrape(a), "contextshift_reshifts_total", backend=backend, worker="0") == 1
        )  # a3, made on a2
        assert value(scrape(b), "contextshift_reshifts_total", backend=backend, worker="0") == 0  # b1 read a2
        # Where each shift found the chat's last prompt: a1 none stored (new), a2 and a3 in a's
        # memory (warm; a3's stale there, so made again), b1 read from the store (cold).
        for replica, found in ((a, (1, 2, 0)), (b, (0, 0, 1))):
            samples = scrape(replica)
            sources = ("new", "warm", "cold")
            assert (
                tuple(
                    value(samples, "contextshift_chat_prompts_total", worker="0", source=s) for s in sources
                )
                == found
            )


SERVICE = "/contextshift.v1.ContextShiftService/"


class Served:
    """Which worker process served each call of a server's, read from its log (one line per call,
    with the worker's pid). Calls are made one at a time, so the n-th line of a method is its n-th
    call."""

    def __init__(self, server: ServerProcess) -> None:
        self._server = server
        self._calls: dict[str, int] = {}

    def last(self, method: str) -> int:
        """The pid that served the call of `method` just made."""
        self._calls[method] = n = self._calls.get(method, 0) + 1
        deadline = time.monotonic() + 10
        while True:
            lines = [line for line in self._server.log_lines() if line.get("method") == SERVICE + method]
            if len(lines) >= n:
                return int(lines[n - 1]["pid"])
            assert time.monotonic() < deadline, f"no log line for call {n} of {method}"
            time.sleep(0.02)


def fresh_channel(address: str) -> grpc.Channel:
    """A channel with a connection of its own: the kernel hands each new connection to either
    worker, and all of one channel's calls go over its one connection, to one worker."""
    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def test_two_workers_of_one_server_answer_for_each_others_shifts(tmp_path: Path) -> None:
    # The motivating case: FinishGeneration lands on another worker process than the shift.
    # No read cache: the calibration reported through one worker is read at once by the other.
    running = start_server(tmp_path, "--workers", "2", "--store-cache-seconds", "0")  # one SQLite file
    try:
        running.wait_serving(2)
        workers = {line["pid"] for line in running.log_lines() if line["msg"] == "serving"}
        served = Served(running)
        chat_id, model = "two-workers", "claude-sonnet-4-5-workers"
        request = shift_request(chat_id, "w1")
        request.model = model
        with fresh_channel(running.address) as channel:
            shifted = stub(channel).ShiftContext(request, timeout=10)
        shifter = served.last("ShiftContext")
        (other,) = workers - {shifter}

        def audit(channel: grpc.Channel) -> pb.ContextAudit:
            found = (
                stub(channel).GetContextAudit(pb.GetContextAuditRequest(chat_id=chat_id), timeout=10).audit
            )
            check_audit(found, chat_id, {"w1"})
            return found

        finished = None
        for _ in range(50):  # bounded: each new connection reaches the other worker half the time
            with fresh_channel(running.address) as channel:
                pending = audit(channel)
                if served.last("GetContextAudit") != other:
                    assert pending.status == pb.GENERATION_STATUS_PENDING
                    continue
                assert pending.status == pb.GENERATION_STATUS_PENDING  # the other worker reads it
                finished = finish_reported(channel, chat_id, shifted)
                assert served.last("FinishGeneration") == other
                break
        assert finished is not None, "no connection reached the other worker in 50 tries"
        assert finished.status == pb.GENERATION_STATUS_COMPLETED and finished.calibration_recorded
        # Both workers now read the finished audit, and the calibration the other one recorded.
        read_by: set[int] = set()
        for _ in range(50):
            with fresh_channel(running.address) as channel:
                assert audit(channel).status == pb.GENERATION_STATUS_COMPLETED
                read_by.add(served.last("GetContextAudit"))
                preview = pb.PreviewContextRequest(blocks_json=conversation("w2"), model=model)
                factor = stub(channel).PreviewContext(preview, timeout=10).plan.calibration_factor
                assert factor == pytest.approx(finished.calibration.factor) and factor != 1.0
            if read_by == workers:
                break
        assert read_by == workers, f"only {read_by} of the workers {workers} answered in 50 tries"
    finally:
        assert running.terminate() == 0


def context_limit(channel: grpc.Channel, model: str) -> int:
    request = pb.PreviewContextRequest(blocks_json="[]", model=model)
    return int(stub(channel).PreviewContext(request, timeout=10).plan.context_limit)


def test_cached_model_reads_follow_the_other_replica_within_the_cache_window(tmp_path: Path) -> None:
    """With the read cache on, a replica's own change applies at once and the other's once its
    cached read is older than `--store-cache-seconds` (the wait is bounded generously: what is
    checked is that the change arrives, not how fast)."""
    url = f"sqlite:///{tmp_path}/shared.db"
    with (
        servers(tmp_path, url, "--store-cache-seconds", "0.5") as (a, b),
        grpc.insecure_channel(a.address) as to_a,
        grpc.insecure_channel(b.address) as to_b,
    ):
        model = "gpt-4o-cached"
        for size in (9000, 7000):
            stub(to_b).SetModelConfig(
                pb.SetModelConfigRequest(config=pb.ModelConfig(model=model, context_size=size)), timeout=10
            )
            assert context_limit(to_b, model) == size  # its own write: at once
            deadline = time.monotonic() + 30
            while context_limit(to_a, model) != size:  # read then cached by `a`
                assert time.monotonic() < deadline, f"replica a never saw context_size {size}"
                time.sleep(0.1)


def test_many_clients_over_two_processes_leave_one_whole_audit_per_chat_or_none(
    tmp_path: Path, url: str
) -> None:
    chats = [f"chat-{i}" for i in range(5)]
    sent: dict[str, set[str]] = {c: set() for c in chats}
    appended: dict[str, set[str]] = {c: set() for c in chats}
    lock = threading.Lock()
    with servers(tmp_path, url) as running:
        channels = [grpc.insecure_channel(s.address) for s in running]
        try:

            def client(n: int) -> None:
                rng = random.Random(n)
                for op in range(25):
                    channel = rng.choice(channels)
                    chat_id = rng.choice(chats)
                    kind = rng.random()
                    try:
                        if kind < 0.5:
                            tag = f"g{n}-{op}"
                            with lock:
                                sent[chat_id].add(tag)
                            stub(channel).ShiftContext(shift_request(chat_id, tag), timeout=30)
                        elif kind < 0.62:
                            tag = f"a{n}-{op}"
                            with lock:
                                appended[chat_id].add(tag)
                            stub(channel).AppendBlocks(
                                pb.AppendBlocksRequest(chat_id=chat_id, blocks_json=appendix(tag)), timeout=30
                            )
                        elif kind < 0.77:
                            with lock:
                                tags = sorted(sent[chat_id])
                            if tags:
                                status = rng.choice(
                                    [pb.GENERATION_STATUS_COMPLETED, pb.GENERATION_STATUS_FAILED]
                                )
                                stub(channel).FinishGeneration(
                                    pb.FinishGenerationRequest(generation_id=rng.choice(tags), status=status),
                                    timeout=30,
                                )
                        elif kind < 0.92:
                            audit = (
                                stub(channel)
                                .GetContextAudit(pb.GetContextAuditRequest(chat_id=chat_id), timeout=30)
                                .audit
                            )
                            with lock:
                                known = set(sent[chat_id])
                            check_audit(audit, chat_id, known)
                        else:
                            stub(channel).DeleteChat(pb.DeleteChatRequest(chat_id=chat_id), timeout=30)
                    except grpc.RpcError as e:
                        # What the races may answer: the chat's audit is gone or newer, or the
                        # generation was finished another way. Never anything else.
                        expected = {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION}
                        assert e.code() in expected, (e.code(), e.details())

            threads(8, client)
            audited = 0
            for chat_id in chats:
                answers = []
                for channel in channels:
                    try:
                        answers.append(
                            stub(channel)
                            .GetContextAudit(pb.GetContextAuditRequest(chat_id=chat_id), timeout=10)
                            .audit
                        )
                    except grpc.RpcError as e:
                        assert e.code() == grpc.StatusCode.NOT_FOUND
                        answers.append(None)
                assert answers[0] == answers[1]  # both processes see the same store
                if answers[0] is not None:
                    check_audit(answers[0], chat_id, sent[chat_id])
                    audited += 1
            assert audited, "no chat kept an audit: the mix exercised nothing"
        finally:
            for channel in channels:
                channel.close()
    store = open_store(url)
    try:
        assert store.problems() == []  # among them: every history's positions run 0, 1, 2, ...
        histories = 0
        for chat_id in chats:
            stored = store.history("", chat_id, "heuristic")
            check_history([json.loads(b.json)["id"] for b in stored], chat_id, appended[chat_id])
            histories += bool(stored)
        assert histories, "no chat kept a history: the mix exercised nothing"
    finally:
        store.close()


@pytest.mark.parametrize("xdg", [True, False], ids=["XDG_DATA_HOME", "HOME"])
def test_the_default_store_is_made_in_the_data_directory_and_outlives_the_server(
    tmp_path: Path, xdg: bool
) -> None:
    workdir, home = tmp_path / "workdir", tmp_path / "home"
    workdir.mkdir()
    # No --store and no CONTEXTSHIFT_STORE (start_server passes no CONTEXTSHIFT_ variable).
    env = {"HOME": str(home), "XDG_DATA_HOME": str(tmp_path / "data") if xdg else ""}
    data = tmp_path / "data" if xdg else home / ".local" / "share"
    database = data / "contextshift" / "contextshift.db"
    with (
        serving(tmp_path, default_store=True, cwd=workdir, env=env) as first,
        grpc.insecure_channel(first.address) as channel,
    ):
        assert database.is_file()  # created on first use, before the server serves
        stub(channel).ShiftContext(shift_request("default-store", "d1"), timeout=10)
    assert list(workdir.iterdir()) == []  # nothing left in the folder it was started from
    (ready,) = [line for line in first.log_lines() if line["msg"] == "store ready"]
    assert ready["store"].startswith(f"sqlite {database}")
    with (
        serving(tmp_path, default_store=True, cwd=workdir, env=env) as second,
        grpc.insecure_channel(second.address) as channel,
    ):
        audit = (
            stub(channel)
            .GetContextAudit(pb.GetContextAuditRequest(chat_id="default-store"), timeout=10)
            .audit
        )
        check_audit(audit, "default-store", {"d1"})
        assert audit.status == pb.GENERATION_STATUS_PENDING


KILL_ROUNDS = 6


class Shifting:
    """A chat shifted again and again by one client: every shift sent, the last one answered, and
    the one in flight, if any."""

    def __init__(self, chat_id: str) -> None:
        self.chat_id = chat_id
        self.sent: set[str] = set()
        self.answered: str | None = None
        self.in_flight: str | None = None

    def until_stopped(self, address: str, prefix: str, written: list[int], stop: threading.Event) -> None:
        """Shifts the chat until `stop`, or until the server is gone."""
        with grpc.insecure_channel(address) as channel:
            op = 0
            while not stop.is_set():
                tag = f"{prefix}-{op}"
                self.sent.add(tag)
                self.in_flight = tag
                try:
                    stub(channel).ShiftContext(shift_request(self.chat_id, tag), timeout=10)
                except grpc.RpcError:
                    return
                self.answered, self.in_flight = tag, None
                written.append(1)
                op += 1


def test_a_server_killed_mid_write_leaves_a_whole_store(tmp_path: Path, url: str) -> None:
    """The audits of four chats, shifted at once (so the group writer commits several in one
    transaction), after each SIGKILL: whole, and never older than the last shift answered (a
    reply leaves only once its audit is committed)."""
    chats = [Shifting(f"chat-{i}") for i in range(4)]
    rng = random.Random(7)
    grouped = 0.0  # transactions that stored more than one shift, before the kills
    for round_ in range(KILL_ROUNDS):
        server = start_server(tmp_path, store=url)  # opens (and migrates) the store left by the kill
        stop = threading.Event()
        written: list[int] = []
        clients = [
            threading.Thread(
                target=c.until_stopped, args=(server.address, f"r{round_}-{c.chat_id}", written, stop)
            )
            for c in chats
        ]
        for c in clients:
            c.start()
        deadline = time.monotonic() + 10
        while len(written) < 8 and time.monotonic() < deadline:  # writes under way
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        groups = scrape(server)
        backend = url.partition(":")[0]
        grouped += value(groups, "contextshift_store_group_records_count", backend=backend) - value(
            groups, "contextshift_store_group_records_bucket", backend=backend, le="1.0"
        )
        server.proc.kill()
        server.proc.wait(30)
        stop.set()
        for c in clients:
            c.join(30)
        assert len(written) >= 8, f"round {round_}: the server wrote too little before the kill"

        store = open_store(url)
        try:
            assert store.problems() == [], f"round {round_}"
            for chat in chats:
                stored = store.audit("", chat.chat_id, with_blocks=True)
                assert stored is not None, f"round {round_}: {chat.chat_id} lost its audit"
                audit = audit_payload.decode(stored)
                check_audit(audit, chat.chat_id, chat.sent)
                # The last answered shift's audit, or the one in flight when the server died.
                assert audit.generation_id in {chat.answered, chat.in_flight}, (round_, chat.chat_id)
        finally:
            store.close()
    assert grouped, "no transaction stored more than one shift: the kills never met a group"

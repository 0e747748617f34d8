"""A real balancer keeps each chat on one worker: Debian's HAProxy with the shipped
deploy/haproxy/haproxy.cfg (`tests/haproxy.py`) in front of `contextshift serve --workers 2` whose
workers listen on their own ports only. The load: 200 chats of 10 turns, interleaved (every chat's
turn t before any chat's turn t + 1, the chats in another order each turn), 16 calls at a time, through the Python AsyncClient, which
sends each call's chat as `x-chat-id`.

That a chat stayed on its worker is read from the workers' own metrics, never from HAProxy: a chat
that moved is read cold from the store on the worker it moved to, or (moved back) shifted again on
the worker holding its stale prompt, so no cold read and no re-shift means no chat moved. A call
the balancer could not place (answered UNAVAILABLE) is retried, as a client would; the retries
are counted and printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import haproxy
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import contextshift
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.client import ServiceError

from .conftest import ServerProcess, free_ports, start_server

CHATS = 200
TURNS = 10
CONCURRENCY = 16
WORDS = 40  # per message: a turn's window cuts the chat from its 4th turn on
RETRIES = 50
RETRY_SECONDS = 0.1


def blocks(chat: str, turn: int) -> list[dict[str, str]]:
    """A chat's blocks at `turn` (from 1): the system prompt and two messages per turn."""
    out = [{"id": "sys", "role": "system", "content": f"You help with chat {chat}."}]
    for t in range(1, turn + 1):
        for role in ("user", "assistant"):
            words = " ".join(f"{role[0]}{t}w{i}" for i in range(WORDS))
            out.append({"id": f"{role[0]}{t}", "role": role, "content": words})
    return out


@dataclass
class Workers:
    """A `contextshift serve --workers 2` on its workers' own ports, and its workers file."""

    server: ServerProcess
    ports: list[int]
    http_ports: list[int]
    workers_file: Path

    def listed(self) -> list[dict[str, int]]:
        workers: list[dict[str, int]] = json.loads(self.workers_file.read_text())["workers"]
        return workers

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """Every worker's metrics, from worker 0's own HTTP port (any worker reports them all)."""
        text = httpx.get(f"http://127.0.0.1:{self.http_ports[0]}/metrics", timeout=10).text
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def prompts(self) -> dict[tuple[str, str], float]:
        """(worker, source) -> ShiftContext calls that found their chat's last prompt there."""
        return {
            (labels["worker"], labels["source"]): value
            for (name, pairs), value in self.metrics().items()
            if name == "contextshift_chat_prompts_total"
            for labels in [dict(pairs)]
        }

    def reshifts(self) -> float:
        return sum(v for (name, _), v in self.metrics().items() if name == "contextshift_reshifts_total")


@contextlib.contextmanager
def two_workers(tmp_path: Path, drain_seconds: float) -> Iterator[Workers]:
    base = haproxy.consecutive_free_ports(4)  # gRPC base, base + 1; HTTP base + 2, base + 3
    workers_file = tmp_path / "workers.json"
    server = start_server(
        tmp_path,
        "--workers",
        "2",
        "--no-shared-ports",
        "--worker-port-base",
        str(base),
        "--worker-http-port-base",
        str(base + 2),
        "--workers-file",
        str(workers_file),
        "--drain-seconds",
        str(drain_seconds),
    )
    try:
        server.wait_serving(2)
        yield Workers(server, [base, base + 1], [base + 2, base + 3], workers_file)
    finally:
        assert server.terminate() == 0


@contextlib.contextmanager
def balanced(
    tmp_path: Path, balance: str | None = None, drain_seconds: float = 2.0
) -> Iterator[tuple[Workers, haproxy.Balancer]]:
    with two_workers(tmp_path, drain_seconds) as workers:
        ports = free_ports(3)
        with haproxy.running(
            tmp_path, (ports[0], ports[1], ports[2]), workers.ports, workers.http_ports, balance=balance
        ) as balancer:
            yield workers, balancer


@dataclass
class Run:
    """What the load saw: each chat's last generation id, and the retries by status code."""

    last: dict[str, str] = field(default_factory=dict)
    retries: Counter[str] = field(default_factory=Counter)
    calls: int = 0


def load(
    address: str,
    turns: range = range(1, TURNS + 1),
    *,
    midway: Callable[[], None] | None = None,
    run: Run | None = None,
) -> Run:
    """Every chat's `turns` through the balancer (added to `run`); `midway` runs (on its own thread)
    once half the calls have answered."""
    run = run or Run()
    half = run.calls + CHATS * len(turns) // 2

    async def main() -> None:
        gate = asyncio.Semaphore(CONCURRENCY)
        async with contextshift.AsyncClient(address) as client:

            async def turn(chat: str, t: int) -> None:
                async with gate:
                    for _ in range(RETRIES):
                        try:
                            result = await client.shift_context(
                                blocks(chat, t), chat_id=chat, budget=900, timeout=30
                            )
                            break
                        except ServiceError as e:
                            if e.code() != grpc.StatusCode.UNAVAILABLE:
                                raise
                            run.retries[e.code().name] += 1
                            await asyncio.sleep(RETRY_SECONDS)
                    else:
                        raise AssertionError(f"{chat} turn {t}: no answer after {RETRIES} tries")
                run.last[chat] = result.generation_id
                run.calls += 1
                if run.calls == half and midway is not None:
                    threading.Thread(target=midway).start()

            chats = [f"chat-{n}" for n in range(CHATS)]
            for t in turns:
                # In an order of its own each turn: a fixed order would line a round robin's
                # alternation up with the chats (with an even number of chats, each stays put).
                await asyncio.gather(*(turn(chat, t) for chat in random.Random(t).sample(chats, CHATS)))

    asyncio.run(main())
    return run


def check_audits(address: str, run: Run, turns: int = TURNS) -> None:
    """Every chat's audit whole: its last answered shift, every block of its last turn in order,
    the kept ones in the messages and in the prompt's tokens."""
    with contextshift.Client(address) as client:
        for chat, generation_id in run.last.items():
            audit = client.get_context_audit(chat, timeout=10)
            assert (audit.chat_id, audit.generation_id) == (chat, generation_id)
            assert [b.id for b in audit.blocks] == [b["id"] for b in blocks(chat, turns)], chat
            kept = [b for b in audit.blocks if b.kept]
            assert 0 < len(kept) < len(audit.blocks)  # the window cut the chat
            assert audit.plan.prompt_tokens == sum(b.tokens for b in kept)
            assert [m["id"] for m in json.loads(audit.plan.messages.messages_json)] == [b.id for b in kept]


def by_source(prompts: dict[tuple[str, str], float], source: str) -> dict[str, float]:
    return {worker: prompts.get((worker, source), 0.0) for worker in ("0", "1")}


def test_every_chats_calls_land_on_one_worker(tmp_path: Path) -> None:
    with balanced(tmp_path) as (workers, balancer):
        started = time.perf_counter()
        run = load(balancer.address)
        seconds = time.perf_counter() - started
        # One turn more over the HTTP surface, through HAProxy's other backend: the same chat
        # hashes to the same worker there.
        with httpx.Client(base_url=balancer.http_url, timeout=30) as http:
            for chat in run.last:
                body = {
                    "chatId": chat,
                    "blocksJson": blocks(chat, TURNS),
                    "contextLimit": 900,
                    "responseReserve": 0,
                    "systemReserve": 0,
                }
                reply = http.post("/api/v2/context-shift", json=body, headers={"x-chat-id": chat})
                assert reply.status_code == 200, reply.text
                run.last[chat] = reply.json()["generationId"]
        prompts = workers.prompts()
        new, warm, cold = (by_source(prompts, s) for s in ("new", "warm", "cold"))
        print(
            f"\nhashed on x-chat-id: {run.calls} calls in {seconds:.1f} s; new {new}, warm {warm}, cold {cold}"
        )
        assert run.retries == Counter()
        assert sum(new.values()) == CHATS and min(new.values()) >= CHATS // 5  # both took chats
        assert sum(cold.values()) == 0 and workers.reshifts() == 0  # no chat moved
        assert sum(warm.values()) == CHATS * TURNS  # every later turn: gRPC's 9, HTTP's 1
        check_audits(balancer.address, run)


@pytest.mark.parametrize("drain_seconds", [2.0, 0.0])
def test_a_stopped_workers_chats_move_to_the_other_and_every_call_answers(
    tmp_path: Path, drain_seconds: float
) -> None:
    """Stopped with SIGTERM halfway through the load. With the drain the configuration asks for
    (2 s), HAProxy has the worker DOWN before it stops taking calls; with none, HAProxy still
    sends it calls for up to a health check's interval after it stopped listening, and its
    `retry-on conn-failure` sends each to the other worker."""
    with balanced(tmp_path, drain_seconds=drain_seconds) as (workers, balancer):
        (second,) = [w for w in workers.listed() if w["index"] == 1]
        stopped_at: list[float] = []

        def stop_worker() -> None:
            stopped_at.append(time.monotonic())
            os.kill(second["pid"], signal.SIGTERM)  # the worker drains: /readyz 503, then it stops

        run = load(balancer.address, midway=stop_worker)
        balancer.wait_states({"w0": "UP", "w1": "DOWN"})
        assert "w1 is DOWN" in balancer.log()
        # One turn more once HAProxy has worker 1 DOWN, so that every chat it began has moved
        # (however late in the run it went DOWN).
        load(balancer.address, range(TURNS + 1, TURNS + 2), run=run)
        deadline = time.monotonic() + 15
        while [w["index"] for w in workers.listed()] != [0]:  # the exited worker leaves the file
            assert time.monotonic() < deadline, workers.listed()
            time.sleep(0.1)
        prompts = workers.prompts()
        new, cold = by_source(prompts, "new"), by_source(prompts, "cold")
        print(
            f"\nworker 1 stopped midway, drain {drain_seconds:g} s: client retries {dict(run.retries)}, "
            f"HAProxy redispatched {balancer.redispatched()}; new {new}, cold {cold}"
        )
        assert run.calls == CHATS * (TURNS + 1) and stopped_at
        # Each chat worker 1 began moved to worker 0 once, read there from the store once.
        assert cold == {"0": new["1"], "1": 0.0} and new["1"] > 0
        assert workers.reshifts() == 0
        if drain_seconds >= 2:  # the worker was DOWN before it stopped listening
            assert balancer.redispatched() == 0
        check_audits(balancer.address, run, TURNS + 1)


def test_round_robin_shifts_chats_again(tmp_path: Path) -> None:
    """The comparison: the same load with HAProxy balancing each call round robin (the shipped
    configuration with its balance lines changed), so a chat's turns alternate between workers."""
    with balanced(tmp_path, balance="roundrobin") as (workers, balancer):
        run = load(balancer.address)
        prompts = workers.prompts()
        cold, warm = by_source(prompts, "cold"), by_source(prompts, "warm")
        reshifts = workers.reshifts()
        later = CHATS * (TURNS - 1)
        print(
            f"\nround robin: {reshifts:.0f} re-shifts ({reshifts / later:.0%} of the {later} calls after a "
            f"chat's first), cold reads {sum(cold.values()):.0f}, warm {sum(warm.values()):.0f}"
        )
        assert reshifts > 0 and sum(cold.values()) > 0
        check_audits(balancer.address, run)


def test_a_header_naming_another_chat_is_refused_on_both_surfaces(server: ServerProcess) -> None:
    request = pb.ShiftContextRequest(chat_id="body-chat", blocks_json="[]")
    with grpc.insecure_channel(server.address) as channel:
        call = channel.unary_unary(
            "/contextshift.v1.ContextShiftService/ShiftContext",
            request_serializer=pb.ShiftContextRequest.SerializeToString,
            response_deserializer=pb.ShiftContextResponse.FromString,
        )
        try:
            call(request, metadata=[("x-chat-id", "header-chat")], timeout=10)
            raise AssertionError("served")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
            error = contextshift.client.library_error(e)
        assert isinstance(error, contextshift.InvalidOptions)
        assert [v.field for v in error.violations] == ["x-chat-id", "chat_id"]
    reply = httpx.get(
        f"{server.http_url}/api/v2/chats/body-chat/context-audit",
        headers={"x-chat-id": "header-chat"},
        timeout=10,
    )
    assert reply.status_code == 400
    fields = [
        v["field"]
        for detail in reply.json()["error"]["details"]
        if "fieldViolations" in detail
        for v in detail["fieldViolations"]
    ]
    assert fields == ["x-chat-id", "chat_id"]


def test_a_worker_port_in_use_fails_the_start_naming_its_setting(tmp_path: Path) -> None:
    """Another process (here a second server's worker) on a worker's own port: the start fails
    loudly, before any worker serves, rather than sharing the port."""
    with two_workers(tmp_path, 0.0) as workers:
        clash = start_server(
            tmp_path,
            "--workers",
            "2",
            "--worker-port-base",
            str(workers.ports[1]),  # worker 0 of this one on worker 1's port of the other
            "--worker-http-port-base",
            str(haproxy.consecutive_free_ports(2)),
            wait=False,
        )
        assert clash.proc.wait(30) == 1
        (error,) = [line for line in clash.log_lines() if line["msg"] == "cannot serve"]
        assert (error["setting"], error["port"]) == ("worker_port_base", workers.ports[1])
        assert not any(line["msg"] == "serving" for line in clash.log_lines())

"""The real server behind a network that fails, with Toxiproxy (tests/toxiproxy.py) between it and a
real PostgreSQL: a network gone silent (the `timeout` toxic: every byte dropped, nothing closed),
one slower than the bound (`latency`), connections reset (`reset_peer`), and back to normal each
time. Audited calls answer UNAVAILABLE (with RetryInfo; HTTP 503 with Retry-After) within
`store_timeout_ms` plus half a second, never waiting out their deadline; previews go on; /readyz
and gRPC health turn NOT_SERVING within two bounds and back within a second of the network's
return, /healthz staying up; audited calls succeed again within three seconds of it; every audit is
whole afterwards (the old one or the new). And two replicas over one database, one of them cut off:
the other serves every chat throughout.

The measured figures (answer times, readiness turns) are printed: `pytest -s` shows them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from postgres_cluster import Cluster
from toxiproxy import Proxy, running_toxiproxy

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api.service import audit_payload
from contextshift.audit import open_store

from .conftest import ServerProcess, serving
from .test_grpc_service import stub
from .test_metrics import scrape, value
from .test_store_processes import check_audit, conversation, shift_request

BOUND_MS = 500
BOUND = BOUND_MS / 1e3
ALLOWED = BOUND + 0.5  # the target: an audited call answers within the bound + 0.5 s
CALLERS = 50
SERVICE = "contextshift.v1.ContextShiftService"
READY_WITHIN = 2 * BOUND  # readiness turns within two bounds of the network going silent
BACK_WITHIN = 1.0  # and back within a second of its return
CALLS_BACK_WITHIN = 3.0  # audited calls succeed within three seconds of it
POLL = 0.02  # how often the readiness is read


def proxied(url: str, cluster: Cluster, proxy: Proxy) -> str:
    """`url` (a database of `cluster`) through `proxy`."""
    return url.replace(f"127.0.0.1:{cluster.port}/", f"127.0.0.1:{proxy.port}/")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


@dataclass
class Answer:
    chat_id: str
    tag: str
    start: float
    took: float
    code: grpc.StatusCode
    retry_seconds: float | None = None  # RetryInfo's delay, on an error


class Chats:
    """Audited shifts of `count` chats, sent together (one thread per caller), every tag sent kept
    for the check of the audits afterwards."""

    def __init__(self, count: int, prefix: str = "chat") -> None:
        self.ids = [f"{prefix}-{i}" for i in range(count)]
        self.sent: dict[str, set[str]] = {chat: set() for chat in self.ids}
        self._lock = threading.Lock()
        self._round = 0

    def shift_all(self, channel: grpc.Channel, deadline: float = 30.0) -> list[Answer]:
        """One audited ShiftContext per chat, all at once; each answer and how long it took."""
        self._round += 1
        answers: list[Answer] = []
        ready = threading.Barrier(len(self.ids))

        def call(chat_id: str) -> None:
            tag = f"{chat_id}-r{self._round}"
            with self._lock:
                self.sent[chat_id].add(tag)
            ready.wait(30)
            start = time.monotonic()
            try:
                stub(channel).ShiftContext(shift_request(chat_id, tag), timeout=deadline)
                answer = Answer(chat_id, tag, start, time.monotonic() - start, grpc.StatusCode.OK)
            except grpc.RpcError as e:
                answer = Answer(chat_id, tag, start, time.monotonic() - start, e.code(), retry_delay(e))
            with self._lock:
                answers.append(answer)

        threads = [threading.Thread(target=call, args=(chat,)) for chat in self.ids]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(deadline + 30)
        assert len(answers) == len(self.ids)
        return answers

    def check_audits(self, url: str) -> None:
        """Every chat's audit in the store, read directly: one whole shift that was sent."""
        store = open_store(url)
        try:
            assert store.problems() == []
            for chat_id in self.ids:
                stored = store.audit("", chat_id, with_blocks=True)
                assert stored is not None, chat_id
                check_audit(audit_payload.decode(stored), chat_id, self.sent[chat_id])
        finally:
            store.close()


def retry_delay(error: grpc.RpcError) -> float | None:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.ToTimedelta().total_seconds())
    return None


class Polling:
    """A loop (`_run`, until `_stop` is set) on a thread of its own while in a `with` block."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        raise NotImplementedError


@dataclass
class Readiness(Polling):
    """A server's /readyz, /healthz and gRPC health ("" and the service), read every `POLL`
    seconds until stopped: (when, readyz status, healthz status, gRPC "" status, gRPC service
    status)."""

    server: ServerProcess
    seen: list[tuple[float, int, int, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        Polling.__init__(self)

    def _run(self) -> None:
        with (
            httpx.Client(base_url=self.server.http_url, timeout=5) as http,
            grpc.insecure_channel(self.server.address) as channel,
        ):
            health = health_pb2_grpc.HealthStub(channel)

            def status(service: str) -> int:
                request = health_pb2.HealthCheckRequest(service=service)
                return int(health.Check(request, timeout=5).status)  # type: ignore[attr-defined]

            while not self._stop.is_set():
                at = time.monotonic()
                readyz, healthz = http.get("/readyz").status_code, http.get("/healthz").status_code
                self.seen.append((at, readyz, healthz, status(""), status(SERVICE)))
                time.sleep(POLL)

    def first(self, since: float, ready: bool) -> float:
        """How long after `since` every readiness signal first said `ready` (waited for)."""
        serving = health_pb2.HealthCheckResponse.SERVING
        deadline = time.monotonic() + 30
        while True:
            for at, readyz, _, overall, service in list(self.seen):
                says = (readyz == 200, overall == serving, service == serving)
                if at >= since and all(s == ready for s in says):
                    return at - since
            assert time.monotonic() < deadline, f"readiness never turned {'ready' if ready else 'not ready'}"
            time.sleep(POLL)

    def healthz_always_up(self) -> bool:
        return all(healthz == 200 for _, _, healthz, _, _ in self.seen)


@dataclass
class Previews(Polling):
    """PreviewContext (no store) called in a loop until stopped: (when, took, code)."""

    address: str
    seen: list[tuple[float, float, grpc.StatusCode]] = field(default_factory=list)

    def __post_init__(self) -> None:
        Polling.__init__(self)

    def _run(self) -> None:
        request = pb.PreviewContextRequest(
            blocks_json=conversation("p"), context_limit=4000, response_reserve=0
        )
        with grpc.insecure_channel(self.address) as channel:
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    stub(channel).PreviewContext(request, timeout=10)
                    code = grpc.StatusCode.OK
                except grpc.RpcError as e:
                    code = e.code()
                self.seen.append((start, time.monotonic() - start, code))
                time.sleep(0.02)


def until(condition: Callable[[], bool], what: str, seconds: float = 30) -> float:
    """Waits for `condition`; how long it took."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < seconds, f"never happened: {what}"
        time.sleep(0.02)
    return time.monotonic() - start


def report(name: str, **figures: object) -> None:
    print(f"\n{name}: {json.dumps(figures)}")


@contextmanager
def proxied_server(tmp_path: Path, postgres: Cluster) -> Iterator[tuple[ServerProcess, Proxy, str]]:
    """A server whose store is a new database of the session's cluster, behind a Toxiproxy proxy;
    the database's direct URL."""
    with running_toxiproxy() as toxiproxy:
        proxy = toxiproxy.proxy("postgresql", postgres.port)
        url = postgres.new_database()
        with serving(
            tmp_path, "--store-timeout-ms", str(BOUND_MS), store=proxied(url, postgres, proxy)
        ) as server:
            try:
                yield server, proxy, url
            finally:
                proxy.clear()  # the server stops cleanly with its store reachable


def audited_calls_back(channel: grpc.Channel, chats: Chats, since: float) -> float:
    """How long after `since` every chat's audited call succeeded again (rounds until one does)."""
    while True:
        answers = chats.shift_all(channel)
        if all(a.code == grpc.StatusCode.OK for a in answers):
            return time.monotonic() - since
        assert time.monotonic() - since < 30, {a.code for a in answers}


def test_a_silent_network_answers_unavailable_within_the_bound_and_readiness_tells(
    tmp_path: Path, postgres: Cluster
) -> None:
    chats = Chats(CALLERS)
    with (
        proxied_server(tmp_path, postgres) as (server, proxy, url),
        grpc.insecure_channel(server.address) as channel,
    ):
        assert {a.code for a in chats.shift_all(channel)} == {grpc.StatusCode.OK}
        with Readiness(server) as readiness, Previews(server.address) as previews:
            until(lambda: len(readiness.seen) >= 5, "readiness read before the silence")
            proxy.silence()
            silenced = time.monotonic()
            during = chats.shift_all(channel)
            # Still silent: the next callers find the store down and answer at once.
            again = chats.shift_all(channel)
            tag = f"{chats.ids[0]}-http"
            chats.sent[chats.ids[0]].add(tag)
            with httpx.Client(base_url=server.http_url, timeout=10) as http:
                body = {
                    "blocksJson": conversation(tag),
                    "chatId": chats.ids[0],
                    "generationId": tag,
                    "contextLimit": 4000,
                    "responseReserve": 0,
                }
                answer = http.post("/api/v2/context-shift", json=body)
            turned = readiness.first(silenced, ready=False)
            ready_gauge = value(scrape(server), "contextshift_store_ready", backend="postgresql")
            time.sleep(max(0.0, silenced + 3.0 - time.monotonic()))  # silent for a while
            proxy.clear()
            cleared = time.monotonic()
            back = readiness.first(cleared, ready=True)
            calls_back = audited_calls_back(channel, chats, cleared)
        samples = scrape(server)

    took = [a.took for a in during + again]
    report(
        "silent network",
        callers=CALLERS,
        store_timeout_ms=BOUND_MS,
        unavailable_p50_s=round(percentile(took, 0.5), 3),
        unavailable_p99_s=round(percentile(took, 0.99), 3),
        unavailable_max_s=round(max(took), 3),
        first_round_max_s=round(max(a.took for a in during), 3),
        second_round_max_s=round(max(a.took for a in again), 3),
        readiness_not_ready_after_s=round(turned, 3),
        readiness_ready_after_return_s=round(back, 3),
        audited_calls_ok_after_return_s=round(calls_back, 3),
        preview_max_s=round(max(t for _, t, _ in previews.seen), 3),
    )
    # Every audited call during the silence: UNAVAILABLE with a retry delay, within the bound.
    assert {a.code for a in during + again} == {grpc.StatusCode.UNAVAILABLE}
    assert {a.retry_seconds for a in during + again} == {1.0}
    assert max(took) <= ALLOWED, sorted(took)[-5:]
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    assert answer.json()["error"]["status"] == "UNAVAILABLE"
    # Readiness: not ready within two bounds, back within a second; liveness up throughout.
    assert turned <= READY_WITHIN + POLL and back <= BACK_WITHIN, (turned, back)
    assert readiness.healthz_always_up()
    assert ready_gauge == 0 and value(samples, "contextshift_store_ready", backend="postgresql") == 1
    # Counted by operation: whichever call (a group's write, the probe's ping) the bound ended.
    assert sum(v for (name, _), v in samples.items() if name == "contextshift_store_timeouts_total") >= 1
    assert calls_back <= CALLS_BACK_WITHIN
    # Previews need no store: every one answered, in time, before, during and after.
    assert {code for _, _, code in previews.seen} == {grpc.StatusCode.OK}
    assert sum(1 for at, _, _ in previews.seen if silenced < at < cleared) >= 10
    assert max(t for _, t, _ in previews.seen) < BOUND
    # Logged once each way, coming back with how long.
    lines = [line for line in server.log_lines() if line.get("msg", "").startswith(("not ready", "ready"))]
    assert [line["msg"] for line in lines] == [
        "not ready: the store does not answer",
        "ready: the store answers again",
    ]
    assert 1.5 < lines[1]["not_ready_seconds"] < 30  # silent for 3 s, less the time it took to turn
    chats.check_audits(url)


@pytest.mark.parametrize("fault", ["latency", "reset_peer"])
def test_a_slow_or_resetting_network_answers_unavailable_in_time_and_recovers(
    tmp_path: Path, postgres: Cluster, fault: str
) -> None:
    """Latency larger than the bound (everything arrives, too late), and connections reset (a loud
    failure: the answer comes at once)."""
    chats = Chats(10, prefix=fault)
    with (
        proxied_server(tmp_path, postgres) as (server, proxy, url),
        grpc.insecure_channel(server.address) as channel,
    ):
        assert {a.code for a in chats.shift_all(channel)} == {grpc.StatusCode.OK}
        with Readiness(server) as readiness:
            until(lambda: len(readiness.seen) >= 5, "readiness read before the fault")
            if fault == "latency":
                proxy.add("slow", "latency", stream="downstream", latency=int(4 * BOUND_MS), jitter=0)
            else:
                proxy.add("reset", "reset_peer", stream="upstream", timeout=0)
            started = time.monotonic()
            during = chats.shift_all(channel)
            turned = readiness.first(started, ready=False)
            proxy.clear()
            cleared = time.monotonic()
            back = readiness.first(cleared, ready=True)
            calls_back = audited_calls_back(channel, chats, cleared)
    took = [a.took for a in during]
    report(
        fault,
        store_timeout_ms=BOUND_MS,
        unavailable_max_s=round(max(took), 3),
        readiness_not_ready_after_s=round(turned, 3),
        readiness_ready_after_return_s=round(back, 3),
        audited_calls_ok_after_return_s=round(calls_back, 3),
    )
    assert {a.code for a in during} == {grpc.StatusCode.UNAVAILABLE}
    assert max(took) <= ALLOWED
    assert turned <= READY_WITHIN + POLL and back <= BACK_WITHIN, (turned, back)
    assert readiness.healthz_always_up()
    assert calls_back <= CALLS_BACK_WITHIN
    chats.check_audits(url)


def test_two_replicas_one_cut_off_the_other_serves_every_chat(tmp_path: Path, postgres: Cluster) -> None:
    chats = Chats(10, prefix="replicated")
    url = postgres.new_database()
    flags = ("--store-timeout-ms", str(BOUND_MS))
    with running_toxiproxy() as toxiproxy:
        proxy = toxiproxy.proxy("replica-a", postgres.port)
        with (
            serving(tmp_path, *flags, store=proxied(url, postgres, proxy)) as a,
            serving(tmp_path, *flags, store=url) as b,
            grpc.insecure_channel(a.address) as to_a,
            grpc.insecure_channel(b.address) as to_b,
        ):
            # Each replica shifts every chat, so each holds the chats' last prompts.
            for channel in (to_a, to_b, to_a):
                assert {x.code for x in chats.shift_all(channel)} == {grpc.StatusCode.OK}
            with Readiness(a) as ready_a, Readiness(b) as ready_b:
                until(lambda: len(ready_a.seen) >= 5 and len(ready_b.seen) >= 5, "readiness read")
                proxy.silence()
                silenced = time.monotonic()
                cut_off = chats.shift_all(to_a)
                served: list[Answer] = []
                for _ in range(3):  # b shifts every chat, the ones a shifted last too (made again)
                    served += chats.shift_all(to_b)
                turned = ready_a.first(silenced, ready=False)
                proxy.clear()
                cleared = time.monotonic()
                back = ready_a.first(cleared, ready=True)
                b_always_ready = all(
                    readyz == 200 and overall == health_pb2.HealthCheckResponse.SERVING
                    for _, readyz, _, overall, _ in ready_b.seen
                )
            calls_back = audited_calls_back(to_a, chats, cleared)
    report(
        "two replicas, one cut off",
        cut_off_max_s=round(max(x.took for x in cut_off), 3),
        other_replica_max_s=round(max(x.took for x in served), 3),
        readiness_not_ready_after_s=round(turned, 3),
        readiness_ready_after_return_s=round(back, 3),
        audited_calls_ok_after_return_s=round(calls_back, 3),
    )
    assert {x.code for x in cut_off} == {grpc.StatusCode.UNAVAILABLE}
    assert max(x.took for x in cut_off) <= ALLOWED
    assert {x.code for x in served} == {grpc.StatusCode.OK}, [(x.chat_id, x.code) for x in served]
    assert b_always_ready and turned <= READY_WITHIN + POLL and back <= BACK_WITHIN
    assert calls_back <= CALLS_BACK_WITHIN
    chats.check_audits(url)

"""Server memory benchmark: the RSS of `contextshift serve` with every bundled profile loaded, and
over a long bounded run of varied requests, past the count cache's bound.

    python benchmarks/memory_bench.py [--quick]     (also run by benchmarks/run.py)

The server is the real `contextshift serve` (one worker process) on 127.0.0.1; its RSS is VmRSS of
/proc/<pid>/status. First every profile of ListTokenizerProfiles is loaded by a CountTokens in it
(a profile that cannot load here is skipped and named). Then client processes (closed loop, one
connection each) send 100,000 requests (--quick: 3,000), bounded in time: CountTokens and
ShiftContext in turn, each with texts no request sent before, the profile going round the loaded
ones, so the count cache stores a new entry for every text until its bound drops the oldest. The
RSS is sampled along the way with the cache's stored texts (its misses, from the server's
/metrics). The cache is full once it has stored as many texts as its bound holds; from then on the
RSS must stay flat: its dropped generations make a sawtooth, so the peak of the second half of the
samples since may exceed the peak of the first half by at most FLAT_TOLERANCE. The full run
keeps the default bound (64 MiB); --quick sets a 1 MiB bound so its few requests pass it too.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import httpx  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from benchmarks import output  # noqa: E402
from benchmarks.conversation import WORDS  # noqa: E402
from contextshift._proto.contextshift.v1 import context_service_pb2, context_service_pb2_grpc  # noqa: E402
from tests.integration.conftest import ServerProcess, start_server  # noqa: E402

TEXTS_PER_REQUEST = 32
CLIENTS = 2
SAMPLE_SECONDS = 0.5
# A cache entry's share of the bound (ENTRY_BYTES in rust_ext/core/src/cache.rs): the bound holds
# capacity / ENTRY_BYTES texts.
ENTRY_BYTES = 80
DEFAULT_CACHE_BYTES = 64 << 20
QUICK_CACHE_BYTES = 1 << 20
FLAT_TOLERANCE = 0.05  # growth of the RSS's peaks once the cache is full, as a share
MIB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    """The process's resident set (VmRSS), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def cache_misses(server: ServerProcess) -> int:
    """Texts the server's count cache has missed, and so stored, since it started."""
    text = httpx.get(f"{server.http_url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == "contextshift_count_cache_lookups":
            return sum(int(s.value) for s in family.samples if s.labels.get("result") == "miss")
    return 0


def load_profiles(channel: grpc.Channel) -> tuple[list[str], dict[str, str]]:
    """Loads every listed profile by counting a text in it: the names that loaded, and why the
    others did not."""
    stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
    names = [
        p.name
        for p in stub.ListTokenizerProfiles(context_service_pb2.ListTokenizerProfilesRequest()).profiles
    ]
    loaded, skipped = [], {}
    for name in names:
        request = context_service_pb2.CountTokensRequest(
            items=[context_service_pb2.CountItem(text="Load the profile, then count this.")], profile=name
        )
        try:
            stub.CountTokens(request, timeout=120)
            loaded.append(name)
        except grpc.RpcError as error:
            skipped[name] = f"{error.code().name}: {error.details()}"
    return loaded, skipped


def _texts(rng: random.Random, tag: str) -> list[str]:
    """Texts no request sent before (the tag is unique), of chat-message length."""
    return [
        f"{tag}.{k} " + " ".join(rng.choices(WORDS, k=rng.randint(8, 40))) for k in range(TEXTS_PER_REQUEST)
    ]


def _client(address: str, client: int, profiles: list[str], quota: int, deadline: float, done: Any) -> None:
    """One client process: up to `quota` requests until `deadline` (time.time()), one at a time,
    CountTokens and ShiftContext in turn; `done` counts the requests answered."""
    rng = random.Random(client)
    with grpc.insecure_channel(address) as channel:
        stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
        for n, profile in zip(range(quota), itertools.cycle(profiles), strict=False):
            if time.time() > deadline:
                break
            texts = _texts(rng, f"{client}.{n}")
            if n % 2:
                blocks = [{"id": f"m{k}", "role": "user", "content": t} for k, t in enumerate(texts)]
                stub.ShiftContext(
                    context_service_pb2.ShiftContextRequest(blocks_json=json.dumps(blocks), profile=profile),
                    timeout=30,
                )
            else:
                items = [context_service_pb2.CountItem(text=t) for t in texts]
                stub.CountTokens(
                    context_service_pb2.CountTokensRequest(items=items, profile=profile), timeout=30
                )
            done.value = n + 1


def drive(server: ServerProcess, profiles: list[str], requests: int, seconds: float) -> list[dict[str, Any]]:
    """Runs the clients (see `_client`) while sampling the server: per sample the seconds since
    the start, requests answered, texts the count cache stored, and the RSS."""
    context = multiprocessing.get_context("spawn")  # no gRPC state is inherited by the clients
    deadline = time.time() + seconds
    counters = [context.Value("q", 0, lock=False) for _ in range(CLIENTS)]
    procs = [
        context.Process(
            target=_client,
            args=(server.address, client, profiles, requests // CLIENTS, deadline, counters[client]),
        )
        for client in range(CLIENTS)
    ]
    for p in procs:
        p.start()
    start, samples = time.monotonic(), []

    def sample() -> None:
        samples.append(
            {
                "seconds": round(time.monotonic() - start, 1),
                "requests": sum(c.value for c in counters),
                "cache_misses": cache_misses(server),
                "rss_bytes": rss_bytes(server.proc.pid),
            }
        )

    while any(p.is_alive() for p in procs):
        time.sleep(SAMPLE_SECONDS)
        sample()
    for p in procs:
        p.join(30)
        if p.exitcode != 0:
            raise RuntimeError(f"a client process exited with {p.exitcode}")
    sample()  # every request answered
    return samples


def run(requests: int, seconds: float, cache_bytes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        # The block cache (blocks read from JSON) gets the same bound, so both are past it.
        env = {
            "CONTEXTSHIFT_COUNT_CACHE_BYTES": str(cache_bytes),
            "CONTEXTSHIFT_BLOCK_CACHE_BYTES": str(cache_bytes),
        }
        server = start_server(Path(tmp), "--workers", "1", env=env)
        try:
            started = rss_bytes(server.proc.pid)
            with grpc.insecure_channel(server.address) as channel:
                loaded, skipped = load_profiles(channel)
            with_profiles = rss_bytes(server.proc.pid)
            samples = drive(server, loaded, requests, seconds)
        finally:
            server.terminate()
    return {
        "cache_bytes": cache_bytes,
        "cache_entries": cache_bytes // ENTRY_BYTES,
        "rss_started_bytes": started,
        "rss_profiles_bytes": with_profiles,
        "profiles_loaded": loaded,
        "profiles_skipped": skipped,
        "samples": samples,
    }


def report(result: dict[str, Any]) -> list[str]:
    loaded, skipped = result["profiles_loaded"], result["profiles_skipped"]
    print(f"RSS after start: {result['rss_started_bytes'] / MIB:.1f} MiB")
    print(
        f"RSS with {len(loaded)} profiles loaded: {result['rss_profiles_bytes'] / MIB:.1f} MiB ({', '.join(loaded)})"
    )
    for name, why in skipped.items():
        print(f"  skipped {name}: {why}")
    samples, entries = result["samples"], result["cache_entries"]
    every = max(1, len(samples) // 12)  # about a dozen rows, and the last
    print(f"{'seconds':>8} {'requests':>9} {'texts stored':>13} {'RSS MiB':>8}")
    for s in [*samples[:-1:every], samples[-1]]:
        print(f"{s['seconds']:8.1f} {s['requests']:9} {s['cache_misses']:13} {s['rss_bytes'] / MIB:8.1f}")
    findings = [
        f"RSS with every loadable profile loaded ({len(loaded)} of {len(loaded) + len(skipped)}): "
        f"{result['rss_profiles_bytes'] / MIB:.1f} MiB (after start: {result['rss_started_bytes'] / MIB:.1f} MiB)"
    ]
    last = samples[-1]
    full = next((s for s in samples if s["cache_misses"] >= entries), None)
    after = samples[samples.index(full) :] if full is not None else []
    if full is None or len(after) < 4:
        findings.append(
            f"count cache not filled past its bound long enough to judge ({last['cache_misses']} of {entries} "
            f"texts stored in {last['requests']} requests, {len(after)} samples after): FAIL"
        )
    else:
        # The cache's generations make a sawtooth: a leak shows as higher peaks later on.
        half = len(after) // 2
        early, late = max(s["rss_bytes"] for s in after[:half]), max(s["rss_bytes"] for s in after[half:])
        share = (late - early) / early
        findings.append(
            f"{last['requests']} requests, {last['cache_misses']} texts stored ({last['cache_misses'] / entries:.1f}x "
            f"the bound of {entries} texts, {result['cache_bytes'] / MIB:.0f} MiB); RSS when full "
            f"{full['rss_bytes'] / MIB:.1f} MiB (request {full['requests']}), at the end {last['rss_bytes'] / MIB:.1f} "
            f"MiB; peak in the first half after {early / MIB:.1f} MiB, in the second {late / MIB:.1f} MiB: "
            f"growth {(late - early) / MIB:+.1f} MiB ({share:+.1%}; flat: <= {FLAT_TOLERANCE:.0%}): "
            f"{'PASS' if share <= FLAT_TOLERANCE else 'FAIL'}"
        )
    print(*findings, sep="\n")
    return findings


def main(quick: bool = False) -> int:
    requests, seconds = (3_000, 60.0) if quick else (100_000, 600.0)
    cache_bytes = QUICK_CACHE_BYTES if quick else DEFAULT_CACHE_BYTES
    print(
        f"Server memory: every profile loaded, then {requests} requests of {TEXTS_PER_REQUEST} new texts each "
        f"(at most {seconds:.0f} s), count cache bound {cache_bytes / MIB:.0f} MiB"
    )
    result = run(requests, seconds, cache_bytes)
    findings = report(result)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "memory.json").write_text(json.dumps(result | {"findings": findings}, indent=2))
    return 0


if __name__ == "__main__":
    output.command(main, __doc__, "smoke run: 3,000 requests, a 1 MiB count cache")

"""The gateway benchmark: `contextshift serve` in front of a fake provider against the same provider
called directly, side by side in one run (their slices alternate, gateway and direct, round after
round), measured by wrk.

    python benchmarks/gateway_bench.py [--quick]     (also run by benchmarks/run.py)

The load tool is wrk (Debian's package, `.ci/run` installs it; a tool the project did not write):
ghz speaks only gRPC; wrk is a C program on one epoll thread, so it takes little of the 2 cores it
shares with the server and the provider, it keeps each connection alive as an SDK does, and its
Lua hook (benchmarks/gateway_wrk.lua) POSTs a body from a file and reports the latencies at every
half percentile, which are pooled here over the slices. wrk's latency is the time to the end of the
answer; the non-streamed answer is one write of a few hundred bytes, so its end is its first byte.

The fake provider (benchmarks/gateway_provider.py) is a bare asyncio protocol in its own process
that never parses a body: measured directly, it answers a 48 KiB request at concurrency 8 in
about 0.4 ms and streams 1,000 events about 170 times a second at concurrency 64, so it is never
what limits the gateway. Everything is on 127.0.0.1; each slice lasts SLICE_SECONDS (wrk runs
whole seconds).

Cases, each gateway slice beside a direct one:
- `48k c1`, `48k c8`: 48 KiB of real chat text (ShareGPT conversations as benchmarks/ghz_bench.py
  takes them, as OpenAI chat messages) for gpt-4o, not streamed, at concurrency 1 and 8; nothing
  is left out (the chat fits), so the body goes upstream as it came. The shift's own time is the
  server's log's `shift_ms` of the same calls.
- `stream c64`: a 4 KiB chat answered with 1,000 server-sent events, at concurrency 64; events/s
  from wrk's calls/s. After the rounds, the same through the gateway for SOAK_SECONDS more while
  the server's RSS (/proc, its workers' summed) is sampled: flat when the peak of the second half
  is within memory_bench.FLAT_TOLERANCE of the first's (sampled during the rounds instead, the
  other cases' allocations between the streaming slices would show as growth).
- `135k c1`: an agent's request of 3,202 messages and about 135k tokens (o200k_base) for gpt-4o,
  whose window is 128k: ShareGPT exchanges alternating with tool calls whose results are pages of
  real files (benchmarks/realtext: Debian changelogs and man pages, CPython's news, crates'
  changelogs), each text cut at a word to the length that makes the total, shaped as
  tests/integration/test_gateway_loops.py shapes a Chat Completions tool loop. One call
  (`?record=1`) has its upstream body kept by the provider and checked: whole tool groups, the
  system prompt and the last message kept, each kept message byte for byte as sent, and the prompt
  under the window less the reserve by the provider's own count (tiktoken, OpenAI's cookbook rule:
  tests/fake_provider.py).

Each case runs on one worker and (full run) on `--workers 2`, as a user with two cores would run
it.

Targets (issue 39): added time to the first byte at 48 KiB, concurrency 8 (p50, gateway less
direct) at most the shift's own p50 + 1 ms; streaming at least 90% of the direct events/s with the
server's RSS flat; the 135k-token request fitted, whole groups, in under 100 ms added (p50).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests/fake_provider.py's count and what it imports

import httpx  # noqa: E402

import contextshift  # noqa: E402
from benchmarks import ghz_bench, memory_bench  # noqa: E402
from benchmarks.hysteresis import whole_conversations  # noqa: E402
from benchmarks.output import Column, command, print_table, run_and_publish  # noqa: E402
from benchmarks.realtext import chats as realtext_chats  # noqa: E402
from benchmarks.realtext import sources  # noqa: E402
from tests.integration.conftest import ServerProcess, free_port, start_server  # noqa: E402

WRK = shutil.which("wrk") or "/usr/bin/wrk"
SCRIPT = Path(__file__).with_name("gateway_wrk.lua")
PROVIDER = Path(__file__).with_name("gateway_provider.py")
PATH = "/v1/chat/completions"
MODEL = "gpt-4o"
KEY_HEADER = "Authorization: Bearer sk-bench-not-a-key"
EVENTS = 1000
SLICE_SECONDS = 3
ROUNDS = 3
SOAK_SECONDS = 12
WARM_CALLS = 20
WAYS = ("direct", "gateway")
# The judged cases and the informational ones: (name, body, concurrency).
CASES = (("48k c1", "48k", 1), ("48k c8", "48k", 8), ("stream c64", "stream", 64), ("135k c1", "135k", 1))
ADDED_MS = 1.0  # the first byte's target: the shift's own p50 + this
STREAM_SHARE = 0.9
BIG_ADDED_MS = 100.0
# The agent's request: as the measurement of another proxy had it.
BIG_MESSAGES = 3202
BIG_TOKENS = 135_000
BIG_RESERVE = 4096
BIG_WINDOW = 128_000  # gpt-4o's, as the model registry has it
BIG_SOURCES = (
    "openssh-changelog",
    "systemd-changelog",
    "glibc-changelog",
    "curl-changelog",
    "coreutils-changelog",
    "postgresql-changelog",
    "git-changelog",
    "dpkg-changelog",
    "cpython-news",
    "cpython-news-library",
    "pyo3-changelog",
    "regex-changelog",
    "rayon-releases",
    "libc-changelog",
    "tar-man",
    "git-config-man",
    "dpkg-man",
    "apt-conf-man",
)
AGENT_SYSTEM = "You are a release engineer's agent. Read the files you need with read_file, then answer."
READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "A page of a file on the build machine",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "page": {"type": "integer"}},
            "required": ["path", "page"],
        },
    },
}
LAST_QUESTION = "Given all of this, which fixes should we ship first, and why?"


# --- the requests --------------------------------------------------------------------------------


def chat_body(kib: int, *, stream: bool = False) -> bytes:
    """ShareGPT text as OpenAI chat messages, up to `kib` KiB of blocks (benchmarks/ghz_bench.py)."""
    messages = [{"role": b["role"], "content": b["content"]} for b in json.loads(ghz_bench.blocks_json(kib))]
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 256}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return json.dumps(body, ensure_ascii=False).encode()


@functools.cache
def _exchanges() -> list[tuple[str, str]]:
    """ShareGPT's person-assistant exchanges, in the file's order."""
    found = []
    for turns in whole_conversations():
        pending = None
        for turn in turns:
            text = str(turn.get("value", "")).strip()
            if turn.get("from") == "human" and text:
                pending = text
            elif turn.get("from") == "gpt" and text and pending is not None:
                found.append((pending, text))
                pending = None
        if len(found) >= BIG_MESSAGES:
            break
    return found


@functools.cache
def _pages() -> list[tuple[str, int, str]]:
    """Pages of real files (path, page, text), a page of each file in turn."""
    per_file = []
    for name in BIG_SOURCES:
        source = sources.BY_NAME[name]
        path = source.path.replace("{purelib}", "site-packages").replace("{crates}", "~/.cargo/registry/src")
        per_file.append((path, realtext_chats.chunks(sources.read(source), 700)))
    longest = max(len(pages) for _, pages in per_file)
    return [(path, k, pages[k]) for k in range(longest) for path, pages in per_file if k < len(pages)]


def _cut(text: str, cap: int) -> str:
    """`text`, or its first words up to `cap` characters."""
    if len(text) <= cap:
        return text
    at = text.rfind(" ", 0, cap)
    return text[: at if at > cap // 2 else cap]


def agent_messages(cap: int) -> list[dict[str, Any]]:
    """BIG_MESSAGES messages: the system prompt, ShareGPT exchanges alternating with read_file
    calls and their results (pages of real files, in turn), each text at most `cap` characters,
    and a last question."""
    exchanges, pages = _exchanges(), _pages()
    messages: list[dict[str, Any]] = [{"role": "system", "content": AGENT_SYSTEM}]
    for n in range((BIG_MESSAGES - 2) // 2):
        if n % 2 == 0:
            person, answer = exchanges[(n // 2) % len(exchanges)]
            messages += [
                {"role": "user", "content": _cut(person, cap)},
                {"role": "assistant", "content": _cut(answer, cap)},
            ]
            continue
        path, page, text = pages[(n // 2) % len(pages)]
        call = {
            "id": f"call_{n}",
            "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": path, "page": page})},
        }
        messages += [
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{n}", "content": _cut(text, cap)},
        ]
    messages.append({"role": "user", "content": LAST_QUESTION})
    assert len(messages) == BIG_MESSAGES
    return messages


@functools.cache
def agent_request() -> tuple[bytes, int]:
    """The agent's request (see the module's doc) and its tokens (o200k_base, as contextshift counts
    them): the cap on each text found by bisection, the total nearest BIG_TOKENS."""

    def tokens(cap: int) -> int:
        return sum(contextshift.count_tokens(agent_messages(cap), "o200k_base"))

    low, high = 20, 4000
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if tokens(middle) <= BIG_TOKENS else (low, middle)
    cap = min((low, high), key=lambda c: abs(tokens(c) - BIG_TOKENS))
    body = {
        "model": MODEL,
        "messages": agent_messages(cap),
        "tools": [READ_FILE],
        "max_completion_tokens": BIG_RESERVE,
    }
    return json.dumps(body, ensure_ascii=False).encode(), tokens(cap)


# --- what the provider received ---------------------------------------------------------------


def check_fitted(sent: bytes, received: bytes) -> dict[str, Any]:
    """What the provider received of the agent's request: kept and left-out messages, the prompt by
    the provider's own count, and the problems found (none: fitted under the window, whole)."""
    # tests/fake_provider.py's count (o200k_base by OpenAI's cookbook rule), as the tests' provider
    # refuses a prompt over its window.
    count_openai: Callable[[dict[str, Any]], int] = importlib.import_module("fake_provider").count_openai
    sent_body, body = json.loads(sent), json.loads(received)
    sent_messages, kept = sent_body["messages"], body["messages"]
    problems = []
    if {k: v for k, v in body.items() if k != "messages"} != {
        k: v for k, v in sent_body.items() if k != "messages"
    }:
        problems.append("a field other than messages changed")
    if kept[0] != sent_messages[0] or kept[-1] != sent_messages[-1]:
        problems.append("the system prompt or the last message was left out")
    at = 0
    for message in kept:  # in order, each as it was sent
        while at < len(sent_messages) and sent_messages[at] != message:
            at += 1
        if at == len(sent_messages):
            problems.append("a message the caller did not send, or out of order")
            break
        at += 1
    calls = {c["id"] for m in kept for c in m.get("tool_calls") or []}
    results = {m["tool_call_id"] for m in kept if m.get("role") == "tool"}
    if calls != results:
        problems.append(f"{len(calls ^ results)} tool calls without their results or results without calls")
    tokens = count_openai(body)
    if tokens > BIG_WINDOW - BIG_RESERVE:
        problems.append(f"{tokens} tokens over the window less the reserve ({BIG_WINDOW - BIG_RESERVE})")
    return {
        "sent_messages": len(sent_messages),
        "sent_tokens": count_openai(sent_body),
        "kept_messages": len(kept),
        "provider_tokens": tokens,
        "problems": problems,
    }


# --- the processes ------------------------------------------------------------------------------


@contextlib.contextmanager
def provider(tmp: Path) -> Iterator[tuple[str, Path]]:
    """The fake provider on a free port: its base URL (OpenAI's, ending in /v1) and where it writes
    a recorded body."""
    port, record = free_port(), tmp / "recorded.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(PROVIDER),
            "--port",
            str(port),
            "--events",
            str(EVENTS),
            "--record",
            str(record),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "listening":
            raise RuntimeError("the fake provider did not start")
        yield f"http://127.0.0.1:{port}/v1", record
    finally:
        proc.terminate()
        proc.wait(10)


def worker_pids(server: ServerProcess) -> list[int]:
    return sorted({int(line["pid"]) for line in server.log_lines() if line.get("msg") == "serving"})


@dataclass
class Rss:
    """The server's RSS (its workers' summed), sampled from a thread while a slice runs."""

    pids: list[int]
    samples: list[int] = field(default_factory=list)

    @contextlib.contextmanager
    def sampling(self, every: float = 0.25) -> Iterator[None]:
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(every):
                self.samples.append(sum(memory_bench.rss_bytes(pid) for pid in self.pids))

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self.samples.append(sum(memory_bench.rss_bytes(pid) for pid in self.pids))


# --- wrk ----------------------------------------------------------------------------------------


@dataclass
class Slices:
    """One way's calls of one case, over its slices: wrk's quantiles, weighted by each slice's calls."""

    quantiles: list[tuple[int, int]] = field(default_factory=list)  # (latency µs, weight)
    calls: int = 0
    seconds: float = 0.0
    errors: int = 0
    shift_ms: list[float] = field(default_factory=list)  # the server's log, gateway only

    def add(self, report: dict[str, Any]) -> None:
        self.calls += report["requests"]
        self.seconds += report["duration_us"] / 1e6
        self.errors += sum(report["errors"].values())
        self.quantiles += [(q, report["requests"]) for q in report["quantiles_us"]]

    def percentile(self, p: float) -> float:
        """The latency (ms) below which a share `p` of the pooled calls fall."""
        ordered = sorted(self.quantiles)
        total = sum(w for _, w in ordered)
        if not total:
            return float("nan")
        seen = 0
        for value, weight in ordered:
            seen += weight
            if seen >= p * total:
                return value / 1e3
        return ordered[-1][0] / 1e3


def wrk(url: str, body: Path, concurrency: int, seconds: int) -> dict[str, Any]:
    """wrk's report of `seconds` of POSTs of `body` to `url` on `concurrency` connections."""
    done = subprocess.run(
        [
            WRK,
            "--threads",
            "1",
            "--connections",
            str(concurrency),
            "--duration",
            f"{seconds}s",
            "--timeout",
            "10s",
            "--script",
            str(SCRIPT),
            url,
            "--",
            str(body),
            KEY_HEADER,
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=False,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("gateway-bench ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed: {done.stderr or done.stdout}")
    report: dict[str, Any] = json.loads(line.removeprefix("gateway-bench "))
    return report


def _warm(url: str, body: bytes, calls: int) -> None:
    with httpx.Client(timeout=60) as client:
        for _ in range(calls):
            answer = client.post(url, content=body, headers={"authorization": KEY_HEADER.split(": ", 1)[1]})
            answer.raise_for_status()
            answer.read()


def _shift_ms(lines: list[dict[str, Any]]) -> list[float]:
    return [
        float(line["shift_ms"])
        for line in lines
        if line.get("msg") == "http" and line.get("method") == f"POST {PATH}" and line.get("status") == "200"
    ]


# --- the run ------------------------------------------------------------------------------------


def measure(
    tmp: Path, provider_url: str, record: Path, workers: int, rounds: int, seconds: int, soak: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every case on a server of `workers` workers, rounds of alternating slices; the rows, and what
    the gateway sent of the agent's request and the RSS over the streaming slices."""
    bodies = {"48k": chat_body(ghz_bench.TARGET_KIB), "stream": chat_body(4, stream=True)}
    bodies["135k"] = agent_request()[0]
    files = {}
    for name, content in bodies.items():
        files[name] = tmp / f"{name}.json"
        files[name].write_bytes(content)
    server = start_server(
        tmp,
        "--upstream-openai",
        provider_url,
        "--workers",
        str(workers),
        "--drain-seconds",
        "0",
        store=f"sqlite:///{tmp}/gateway-{workers}.db",
    )
    try:
        server.wait_serving(workers)
        urls = {"direct": provider_url + PATH.removeprefix("/v1"), "gateway": server.http_url + PATH}
        for name, content in bodies.items():
            for way in WAYS:
                _warm(urls[way], content, 3 if name == "135k" else WARM_CALLS)
        # The agent's request once more, its upstream body kept (not timed).
        answer = httpx.post(
            urls["gateway"] + "?record=1",
            content=bodies["135k"],
            headers={"authorization": KEY_HEADER.split(": ", 1)[1]},
            timeout=60,
        )
        answer.raise_for_status()
        fitted = check_fitted(bodies["135k"], record.read_bytes()) | {
            "budget": int(answer.headers["x-contextshift-budget"]),
            "prompt_tokens": int(answer.headers["x-contextshift-prompt-tokens"]),
            "tools_tokens": int(answer.headers["x-contextshift-tools-tokens"]),
            "excluded": int(answer.headers["x-contextshift-excluded"]),
        }
        measured = {(case, way): Slices() for case, _, _ in CASES for way in WAYS}
        for _ in range(rounds):
            for case, body, concurrency in CASES:
                for way in WAYS:
                    before = len(server.log_lines())
                    slices = measured[case, way]
                    slices.add(wrk(urls[way], files[body], concurrency, seconds))
                    if way == "gateway":
                        slices.shift_ms += _shift_ms(server.log_lines()[before:])
        rss = Rss(worker_pids(server))
        with rss.sampling():
            wrk(urls["gateway"], files["stream"], 64, soak)
    finally:
        server.terminate()
    rows = []
    for case, _, concurrency in CASES:
        for way in WAYS:
            s = measured[case, way]
            events = EVENTS if case.startswith("stream") else 0
            rows.append(
                {
                    "workers": workers,
                    "case": case,
                    "concurrency": concurrency,
                    "way": way,
                    "calls": s.calls,
                    "calls_per_s": s.calls / s.seconds if s.seconds else 0.0,
                    "events_per_s": events * s.calls / s.seconds if s.seconds else 0.0,
                    "p50_ms": s.percentile(0.5),
                    "p90_ms": s.percentile(0.9),
                    "p99_ms": s.percentile(0.99),
                    "errors": s.errors,
                    "shift_p50_ms": statistics.median(s.shift_ms) if s.shift_ms else float("nan"),
                }
            )
    return rows, {"fitted": fitted, "rss_bytes": rss.samples, "rss_seconds": soak}


def run(quick: bool) -> list[dict[str, Any]]:
    rounds, seconds, soak = (1, 1, 3) if quick else (ROUNDS, SLICE_SECONDS, SOAK_SECONDS)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp_name, provider(Path(tmp_name)) as (url, record):
        for workers in (1,) if quick else (1, 2):
            tmp = Path(tmp_name) / f"workers-{workers}"
            tmp.mkdir()
            found, seen = measure(tmp, url, record, workers, rounds, seconds, soak)
            for row in found:
                if row["way"] == "gateway" and row["case"].startswith("135k"):
                    row["fitted"] = seen["fitted"]
                if row["way"] == "gateway" and row["case"].startswith("stream"):
                    row["rss_bytes"], row["rss_seconds"] = seen["rss_bytes"], seen["rss_seconds"]
            rows += found
    return rows


# --- the report ---------------------------------------------------------------------------------

TABLE = (
    Column("workers", "workers", 7),
    Column("case", "case", 10),
    Column("way", "way", 7),
    Column("calls", "calls", 6),
    Column("calls/s", "calls_per_s", 8, ".0f"),
    Column("events/s", "events_per_s", 9, ".0f"),
    Column("p50 ms", "p50_ms", 7, ".2f"),
    Column("p90 ms", "p90_ms", 7, ".2f"),
    Column("p99 ms", "p99_ms", 7, ".2f"),
    Column("shift p50", "shift_p50_ms", 9, ".3f"),
    Column("errors", "errors", 6),
)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report(rows: list[dict[str, Any]]) -> list[str]:
    """Prints the table; returns the findings against the targets."""
    print_table(TABLE, rows)
    by = {(r["workers"], r["case"], r["way"]): r for r in rows}
    errors = sum(r["errors"] for r in rows)
    findings = [f"calls that failed: {errors}: {_verdict(errors == 0)}"]
    mib = 1024 * 1024
    for workers in sorted({r["workers"] for r in rows}):
        where = f"{workers} worker{'s' if workers > 1 else ''}"
        for case in ("48k c1", "48k c8"):
            gateway, direct = by[workers, case, "gateway"], by[workers, case, "direct"]
            added = gateway["p50_ms"] - direct["p50_ms"]
            bound = gateway["shift_p50_ms"] + ADDED_MS
            judged = (
                f" (target <= {bound:.2f} ms): {_verdict(added <= bound)}"
                if case == "48k c8"
                else f" (within it + {ADDED_MS:g} ms: {'yes' if added <= bound else 'no'}; judged at concurrency 8)"
            )
            findings.append(
                f"{where}, 48 KiB, concurrency {gateway['concurrency']}: first byte p50 {gateway['p50_ms']:.2f} ms "
                f"through the gateway, {direct['p50_ms']:.2f} ms direct: {added:.2f} ms added; the shift's own p50 "
                f"{gateway['shift_p50_ms']:.3f} ms{judged}"
            )
        gateway, direct = by[workers, "stream c64", "gateway"], by[workers, "stream c64", "direct"]
        share = gateway["events_per_s"] / direct["events_per_s"] if direct["events_per_s"] else 0.0
        findings.append(
            f"{where}, streaming {EVENTS} events at concurrency 64: {gateway['events_per_s']:.0f} events/s through "
            f"the gateway = {share:.0%} of direct ({direct['events_per_s']:.0f}) (target >= {STREAM_SHARE:.0%}): "
            f"{_verdict(share >= STREAM_SHARE)}"
        )
        samples = gateway.get("rss_bytes") or []
        if len(samples) >= 4:
            half = len(samples) // 2
            early, late = max(samples[:half]), max(samples[half:])
            growth = (late - early) / early
            findings.append(
                f"{where}, the server's RSS streaming for {gateway['rss_seconds']} s more: {samples[0] / mib:.1f} -> {samples[-1] / mib:.1f} "
                f"MiB, peak in the first half {early / mib:.1f}, in the second {late / mib:.1f} MiB: growth "
                f"{growth:+.1%} (flat: <= {memory_bench.FLAT_TOLERANCE:.0%}): "
                f"{_verdict(growth <= memory_bench.FLAT_TOLERANCE)}"
            )
        gateway, direct = by[workers, "135k c1", "gateway"], by[workers, "135k c1", "direct"]
        fitted = gateway["fitted"]
        under = (
            fitted["prompt_tokens"] + fitted["tools_tokens"] <= fitted["budget"] and not fitted["problems"]
        )
        findings.append(
            f"{where}, the agent's request ({fitted['sent_messages']} messages, {fitted['sent_tokens']} tokens by "
            f"the provider's count, for gpt-4o): {fitted['kept_messages']} messages went upstream "
            f"({fitted['excluded']} blocks left out), {fitted['provider_tokens']} tokens by the provider's count, "
            f"{fitted['prompt_tokens']} + {fitted['tools_tokens']} (tools) by contextshift's, budget "
            f"{fitted['budget']}; {'; '.join(fitted['problems']) or 'whole groups, system and last message kept'}: "
            f"{_verdict(under)}"
        )
        added = gateway["p50_ms"] - direct["p50_ms"]
        findings.append(
            f"{where}, the agent's request: p50 {gateway['p50_ms']:.1f} ms through the gateway, {direct['p50_ms']:.1f} "
            f"ms direct: {added:.1f} ms added, the shift's own p50 {gateway['shift_p50_ms']:.1f} ms "
            f"(target < {BIG_ADDED_MS:g} ms): {_verdict(added < BIG_ADDED_MS)}"
        )
    return findings


def main(quick: bool = False) -> int:
    print(f"the gateway beside its provider called directly: wrk ({WRK}), the fake provider {PROVIDER.name}")
    return run_and_publish("gateway", run, report, quick)


if __name__ == "__main__":
    command(main, __doc__, "smoke run: one worker, one round of 1 s slices")

"""Tokenizer profiles measured on a caller's own corpus (`contextshift bench-profiles`, and the
BenchmarkProfiles RPC): for every profile, counting throughput on one thread and as a batch; for
every approximate profile, how far its counts are from each exact profile of its family.

A corpus is a set of documents: chat JSON in any shape the library reads (a list of blocks, or a
request body with `messages`, `input` or `blocks`) or plain text. Each block is one message (its
text: every string in it but ids, types, roles and URLs; tool inputs as JSON); in plain text, each
paragraph is one. Counts are text tokens, so framing (which each profile documents exactly) does
not blur the comparison; they bypass the count cache, so throughput measures the tokenizer.

Families: `heuristic` stands in for any model without a tokenizer, so it is compared with every
exact profile; `anthropic` has no exact profile (Anthropic publishes no tokenizer); an `hf:`
profile is compared with nothing but itself. Relative error per message is `(approximate - exact) /
exact` over messages with at least one exact token; the report gives the mean and the 95th
percentile of its absolute value, and the total drift `(sum approximate - sum exact) / sum exact`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from contextshift import engine, request_body
from contextshift.errors import InvalidInput, InvalidOptions
from contextshift.profiles import Resolution, list_profiles, resolve

# A corpus larger than this is refused (the RPC answers RESOURCE_EXHAUSTED).
MAX_CORPUS_BYTES = 1 << 20
# Wall time the throughput measurements may take in all, shared by the profiles (each gets at
# least one timed run per mode, so the total stays bounded by the corpus size cap).
TIME_BUDGET_SECONDS = 10.0
# Each profile's family, for the accuracy comparison ("*": every family).
FAMILIES = {
    "heuristic": "*",
    "anthropic": "anthropic",
    "o200k_base": "openai",
    "cl100k_base": "openai",
    "qwen": "qwen",
    "deepseek_v3": "deepseek",
    "mistral_tekken": "mistral",
    "llama3": "llama",
}
# Strings in a block that are not text a model reads.
_NOT_TEXT = {"id", "type", "role", "kind", "url", "detail", "tool_call_id", "toolCallId", "call_id", "callId"}
_NOT_TEXT |= {"tool_use_id", "media_type", "data"}


class CorpusTooLarge(InvalidInput):
    """The corpus is over `MAX_CORPUS_BYTES`."""


@dataclass(frozen=True)
class Corpus:
    """The messages of a corpus, as texts."""

    texts: list[str]
    documents: int

    @property
    def bytes(self) -> int:
        return sum(len(t.encode()) for t in self.texts)


def _strings(value: Any, key: str = "") -> Iterator[str]:
    if isinstance(value, str):
        if key not in _NOT_TEXT:
            yield value
    elif isinstance(value, Mapping):
        if key == "input":  # a tool call's arguments, as the model sees them
            yield json.dumps(value, ensure_ascii=False)
            return
        for k, v in value.items():
            yield from _strings(v, str(k))
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item, key)


def message_text(block: Any) -> str:
    """The text a block carries (see the module docstring)."""
    return "\n".join(_strings(block))


def _messages(name: str, data: bytes) -> list[str]:
    """The message texts of one document: its blocks (`request_body`), or paragraphs of plain
    text."""
    try:
        parsed = request_body.parse_json(data)
    except request_body.RepeatedKey as e:
        raise InvalidInput([(name, f"not chat JSON a provider reads alike: {e}")]) from e
    except ValueError:  # not JSON (or not UTF-8): text
        parsed = None
    blocks = request_body.blocks_in(parsed)
    if blocks is not None:
        return [message_text(b) for b in blocks]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInput([(name, f"neither chat JSON nor UTF-8 text: {e}")]) from e
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def corpus(documents: Iterable[tuple[str, bytes]]) -> Corpus:
    """The corpus of `(name, content)` documents; `name` names a document in errors."""
    texts: list[str] = []
    size = count = 0
    for name, data in documents:
        size += len(data)
        if size > MAX_CORPUS_BYTES:
            raise CorpusTooLarge([(name, f"the corpus is over {MAX_CORPUS_BYTES} bytes")])
        texts.extend(t for t in _messages(name, data) if t)
        count += 1
    if not texts:
        raise InvalidInput([("corpus", "no messages: give chat JSON or text with some text in it")])
    return Corpus(texts, count)


def sample_corpus() -> Corpus:
    """The corpus shipped with contextshift (contextshift/bench_corpus: written for it, Apache-2.0):
    a coding agent, a multilingual chat, an Anthropic research thread, meeting notes."""
    folder = resources.files("contextshift") / "bench_corpus"
    files = sorted((f for f in folder.iterdir() if f.is_file()), key=lambda f: f.name)
    return corpus((f"bench_corpus/{f.name}", f.read_bytes()) for f in files)


@dataclass(frozen=True)
class Throughput:
    profile: str
    approximate: bool
    tokens: int
    single_thread_mb_per_s: float
    batch_mb_per_s: float


@dataclass(frozen=True)
class Accuracy:
    """An approximate profile against an exact one, per message."""

    profile: str
    reference: str
    messages: int
    mean_relative_error: float
    p95_relative_error: float
    total_drift: float


@dataclass(frozen=True)
class Report:
    documents: int
    messages: int
    bytes: int
    throughput: list[Throughput]
    accuracy: list[Accuracy]
    # Profiles not measured, with why (a profile that cannot load here, e.g. llama3 without its file).
    skipped: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _best_seconds(run: Any, deadline: float) -> float:
    """The fastest of repeated timed runs: at least one, more while before `deadline` (at most 5)."""
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() >= deadline:
            break
    return best


def _percentile(values: Sequence[float], share: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def accuracy(profile: str, reference: str, approx: Sequence[int], exact: Sequence[int]) -> Accuracy:
    errors = [abs(a - e) / e for a, e in zip(approx, exact, strict=True) if e > 0]
    total = sum(exact)
    return Accuracy(
        profile,
        reference,
        len(errors),
        sum(errors) / len(errors) if errors else 0.0,
        _percentile(errors, 0.95) if errors else 0.0,
        (sum(approx) - total) / total if total else 0.0,
    )


def _compared(approximate: Resolution, exact: Sequence[Resolution]) -> list[Resolution]:
    family = FAMILIES.get(approximate.profile, approximate.profile)
    return [e for e in exact if family == "*" or FAMILIES.get(e.profile, e.profile) == family]


def run(
    data: Corpus, profiles: Sequence[str] | None = None, time_budget: float = TIME_BUDGET_SECONDS
) -> Report:
    """Measure `profiles` (profile or model names; default: every built-in profile) on `data`. An
    unknown name is `InvalidOptions` on `profiles[i]`; a built-in that cannot load here is
    skipped, with why."""
    named = list(profiles) if profiles else [p.name for p in list_profiles()]
    infos: list[Resolution] = []
    skipped: dict[str, str] = {}
    for i, name in enumerate(named):
        try:
            resolution = resolve(name)
        except InvalidOptions as e:
            if profiles:
                raise InvalidOptions([(f"profiles[{i}]", v.description) for v in e.violations]) from e
            skipped[name] = "; ".join(v.description for v in e.violations)
            continue
        if resolution.profile not in {r.profile for r in infos}:
            infos.append(resolution)
    mb = data.bytes / 1e6
    deadline_step = time_budget / max(1, 2 * len(infos))
    counts: dict[str, list[int]] = {}
    throughput = []
    for info in infos:
        name = info.profile
        counts[name] = engine.count_texts_uncached(
            data.texts, name, as_batch=False
        )  # untimed: warms the tokenizer
        seconds = {
            as_batch: _best_seconds(
                lambda b=as_batch, n=name: engine.count_texts_uncached(data.texts, n, as_batch=b),
                time.perf_counter() + deadline_step,
            )
            for as_batch in (False, True)
        }
        throughput.append(
            Throughput(name, info.approximate, sum(counts[name]), mb / seconds[False], mb / seconds[True])
        )
    exact = [i for i in infos if not i.approximate]
    compared = [
        accuracy(a.profile, e.profile, counts[a.profile], counts[e.profile])
        for a in infos
        if a.approximate
        for e in _compared(a, exact)
    ]
    return Report(data.documents, len(data.texts), data.bytes, throughput, compared, skipped)

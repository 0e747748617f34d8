"""A local, deterministic, extractive summary of conversation turns (no model, no network).

1. Split each turn into sentences: after `.`, `!` or `?` and a space, after `。`, `！` or `？`,
   at line ends; a fenced code block and an inline code span stay in one unit. A sentence is
   put on one line (each run of whitespace one space), except inside fenced code blocks and
   code spans, which are kept byte for byte (their lines and spacing are the code).
2. Facts (contextshift.summarizer.facts) are read from every sentence of the most recent
   MAX_FACTS_CHARS (all of a history up to about a million characters), so `facts_total`
   counts all of them; a longer history's older part is not read, and the summary says so
   (`SummaryText.unread_chars`). A fact outside code is read from its sentence's one-line text
   (a date split by two spaces keeps one).
3. Score each sentence of the most recent MAX_INPUT_CHARS: its TF-IDF centrality (mean cosine
   similarity to the other sentences: what the conversation keeps coming back to) plus its
   cosine similarity to the current user input (what the next answer needs) plus a share for
   the facts it carries. Older sentences are not candidates (scoring is bounded), but their
   facts are.
4. Facts must survive verbatim: those the chosen sentences do not carry go on a compact
   "Facts:" line; when even that line does not fit, the most recent facts are kept.
5. Choose sentences by score while the summary still fits; print them in conversation order.

Same input, same summary, byte for byte.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from contextshift.summarizer import facts as fact_spans

HEADER = "[Conversation summary]"
FACTS_LABEL = "Facts: "
# The sentences scored: those of the most recent part of what is summarized, so a shift of a
# very long history stays fast.
MAX_INPUT_CHARS = 256 * 1024
# The text facts are read from, most recent first: fact-dense text (logs, tool output) reads at
# about 1 MB/s, so this bounds a shift's summary at about a second however long its history.
MAX_FACTS_CHARS = 1024 * 1024
# Sentences looked at for selection, best first: each try recounts the summary.
MAX_CANDIDATES = 400
# Weights of the three parts of a sentence's score.
QUERY_WEIGHT = 1.0
FACTS_WEIGHT = 0.5

_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])|\n+")
_SPACE = re.compile(r"\s+")
_TERM = re.compile(r"[^\W_]+", re.U)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


@dataclass(frozen=True)
class Turn:
    role: str
    text: str


@dataclass(frozen=True)
class SummaryText:
    text: str
    facts_kept: int
    facts_total: int
    # Characters of the oldest summarized text whose facts were not read (past MAX_FACTS_CHARS).
    unread_chars: int = 0


def unread_warning(unread_chars: int) -> list[str]:
    """The result's warning when a summary's facts were not read from all summarized text."""
    if not unread_chars:
        return []
    return [
        f"summary: facts read from the most recent {MAX_FACTS_CHARS} characters of the history "
        f"summarized; the {unread_chars} before them were not read (facts_total counts the read part)"
    ]


@dataclass(frozen=True)
class _Sentence:
    position: int
    role: str
    text: str
    facts: tuple[str, ...]


def _terms(text: str) -> list[str]:
    out: list[str] = []
    for word in _TERM.findall(text.lower()):
        out.extend(_CJK.findall(word) if _CJK.search(word) else [word])
    return out


def sentences(text: str) -> list[str]:
    """`text` split into sentences; fenced code blocks stay whole."""
    out: list[str] = []
    last = 0
    for fence in _FENCE.finditer(text):
        out.extend(_split_prose(text[last : fence.start()]))
        out.append(fence.group().strip())
        last = fence.end()
    out.extend(_split_prose(text[last:]))
    return [s for s in out if s]


def _split_prose(text: str) -> list[str]:
    """Sentences of text without fences; an end inside a code span does not end one."""
    spans = iter(m.span() for m in fact_spans.CODE_SPAN.finditer(text))
    span = next(spans, None)
    parts, start = [], 0
    for end in _SENTENCE_END.finditer(text):
        while span is not None and span[1] <= end.start():
            span = next(spans, None)
        if span is not None and span[0] < end.start():
            continue  # inside `a. b`: not a sentence end
        parts.append(text[start : end.start()])
        start = end.end()
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


def one_line(sentence: str) -> str:
    """`sentence` on one line: each run of whitespace one space, except in a fenced code block or
    a code span, kept byte for byte (re-spacing code would change it)."""
    if sentence.startswith("```"):
        return sentence
    out, last = [], 0
    for span in fact_spans.CODE_SPAN.finditer(sentence):
        out += [_SPACE.sub(" ", sentence[last : span.start()]), span.group()]
        last = span.end()
    out.append(_SPACE.sub(" ", sentence[last:]))
    return "".join(out).strip()


def _vectors(docs: Sequence[list[str]]) -> list[dict[str, float]]:
    """Unit TF-IDF vectors (smoothed idf over `docs`)."""
    df = Counter(term for doc in docs for term in set(doc))
    n = len(docs)
    vectors = []
    for doc in docs:
        weights = {t: c * (math.log((1 + n) / (1 + df[t])) + 1) for t, c in Counter(doc).items()}
        norm = math.sqrt(sum(w * w for w in weights.values())) or 1.0
        vectors.append({t: w / norm for t, w in weights.items()})
    return vectors


def _dot(a: dict[str, float], b: dict[str, float]) -> float:
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    return sum(w * large.get(t, 0.0) for t, w in small.items())


def _scores(items: Sequence[_Sentence], query: str) -> list[float]:
    docs = [_terms(s.text) for s in items]
    vectors = _vectors([*docs, _terms(query)])
    query_vector = vectors.pop()
    # Centrality through the summed vector: the mean similarity to the others, in linear time.
    total: dict[str, float] = {}
    for v in vectors:
        for t, w in v.items():
            total[t] = total.get(t, 0.0) + w
    others = max(len(items) - 1, 1)
    most_facts = max((len(s.facts) for s in items), default=0) or 1
    return [
        (_dot(v, total) - _dot(v, v)) / others
        + QUERY_WEIGHT * _dot(v, query_vector)
        + FACTS_WEIGHT * len(s.facts) / most_facts
        for s, v in zip(items, vectors, strict=True)
    ]


def with_facts(text: str, facts_line: Sequence[str]) -> str:
    """`text` and, when there are facts, the facts line under it."""
    return f"{text}\n{FACTS_LABEL}{'; '.join(facts_line)}" if facts_line else text


def _render(chosen: Sequence[_Sentence], facts_line: Sequence[str]) -> str:
    return with_facts("\n".join([HEADER, *(f"{s.role}: {s.text}" for s in chosen)]), facts_line)


def recent(turns: Sequence[Turn], room: int = MAX_INPUT_CHARS) -> list[Turn]:
    """The most recent turns within `room` characters (the last one cut at its start if need be)."""
    kept: list[Turn] = []
    for turn in reversed(turns):
        if room <= 0:
            break
        kept.append(Turn(turn.role, turn.text[-room:]))
        room -= len(turn.text)
    return kept[::-1]


def facts_window(turns: Sequence[Turn]) -> tuple[list[Turn], int]:
    """The turns facts are read from (the most recent MAX_FACTS_CHARS) and the characters of
    the older text left unread (0 for most histories)."""
    read = recent(turns, MAX_FACTS_CHARS)
    return read, sum(len(t.text) for t in turns) - sum(len(t.text) for t in read)


def _sentences_of(turns: Sequence[Turn]) -> list[_Sentence]:
    """Every sentence of `turns`, one-lined, with its facts (read from that text)."""
    items: list[_Sentence] = []
    for turn in turns:
        # An earlier summary being summarized again: its header is not content.
        for sentence in sentences(turn.text.replace(HEADER, "")):
            text = one_line(sentence)
            items.append(_Sentence(len(items), turn.role, text, tuple(fact_spans.extract(text))))
    return items


def _scored_window(items: Sequence[_Sentence]) -> Sequence[_Sentence]:
    """The most recent sentences within MAX_INPUT_CHARS: the candidates selection scores."""
    start, room = len(items), MAX_INPUT_CHARS
    while start > 0 and len(items[start - 1].text) <= room:
        start -= 1
        room -= len(items[start].text)
    return items[start:]


def summarize(turns: Sequence[Turn], query: str, fits: Callable[[str], bool]) -> SummaryText | None:
    """The summary of `turns` (oldest first) for the next answer to `query`, as long as `fits`
    allows (it is asked about whole summary texts); None when not even the header fits."""
    if not fits(HEADER):
        return None
    read, unread = facts_window(turns)
    items = _sentences_of(read)
    # The facts of all the text read, not only of the scored window: facts_total must be honest.
    all_facts = fact_spans.distinct(f for s in items for f in s.facts)

    def missing(chosen: Sequence[_Sentence]) -> list[str]:
        carried = {f for s in chosen for f in s.facts}
        return [f for f in all_facts if f not in carried]

    # The facts line alone first: when it cannot fit whole, the most recent facts that fit.
    if not fits(_render([], all_facts)):
        line = fact_spans.recent_that_fit(all_facts, lambda facts: fits(_render([], facts)))
        return SummaryText(_render([], line), len(line), len(all_facts), unread)

    window = _scored_window(items)
    scores = dict(zip((s.position for s in window), _scores(window, query), strict=True))
    ranked = sorted(window, key=lambda s: (-scores[s.position], -s.position))[:MAX_CANDIDATES]
    chosen: list[_Sentence] = []
    for candidate in ranked:
        trial = sorted([*chosen, candidate], key=lambda s: s.position)
        if fits(_render(trial, missing(trial))):
            chosen = trial
    text = _render(chosen, missing(chosen))
    kept = sum(fact_spans.value(f) in text for f in all_facts)
    return SummaryText(text, kept, len(all_facts), unread)

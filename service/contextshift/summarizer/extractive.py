"""A local, deterministic, extractive summary of conversation turns (no model, no network).

1. Units. A turn's fenced code blocks stay whole. The rest is cut into paragraphs at blank
   lines, and a paragraph into units: a list item (a line starting with a bullet or a number),
   a heading, a shell line stay units of their own; the other lines are hard-wrapped text and
   are joined (a short line followed by deeper-indented ones, a man page's item tag, is joined
   to them by ": "). A unit is split into sentences after `.`, `!` or `?` and a space when what
   follows does not start in lower case, and after `。`, `！` or `？`; never inside a code span.
   Sentences are on one line; code spans and fenced blocks are kept byte for byte.
2. Facts (contextshift.summarizer.facts) are read from every sentence of the most recent
   MAX_FACTS_CHARS (all of a history up to about a million characters), so `facts_total`
   counts all of them; a longer history's older part is not read, and the summary says so
   (`SummaryText.unread_chars`).
3. Candidates: the sentences of the most recent MAX_INPUT_CHARS; a long one also cut to the
   clauses that hold its facts (at `, ; :`, dashes and parentheses, never inside a fact), with
   "…" where it was cut. Each is counted once (one batch).
4. Selection, greedily by value per token. A candidate's value is the facts it adds that no
   chosen one holds, each weighing what it would cost on the facts line, more when it is
   recent. When the facts line alone cannot hold every fact, sentences take at most
   SENTENCE_SHARE of the room, each (but the first MIN_SENTENCES) only when the facts it carries
   would cost at least SENTENCE_EFFICIENCY of its tokens on the facts line: a sentence then
   says what a fact belongs to at little cost in facts. When the line can hold them all,
   sentences fill the room, the ones with facts first, then the most recent others.
5. The `Facts:` line holds the facts no chosen sentence holds, newest first, each once, as many
   as fit.
6. Printed: the header, the chosen sentences in conversation order, a line per turn (`role: …`)
   and per further unit of it (indented), "…" where sentences of a unit were left out between,
   then the facts line.

Same input, same summary, byte for byte; the chosen text is the conversation's own, in its
language.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from contextshift.summarizer import facts as fact_spans

HEADER = "[Conversation summary]"
FACTS_LABEL = "Facts: "
# The sentences scored: those of the most recent part of what is summarized, so a shift of a
# very long history stays fast.
MAX_INPUT_CHARS = 256 * 1024
# The text facts are read from, most recent first: fact-dense text (logs, changelogs, JSON) reads
# at 0.5 to 0.8 MB/s, so this bounds a shift's summary at one to two seconds however long its
# history.
MAX_FACTS_CHARS = 1024 * 1024
# When not every fact fits the facts line: the room sentences may take, the facts a sentence must
# carry for its tokens (their cost on the facts line over its own), and the sentences taken
# whatever they carry, so the summary still says something. Tuned on the real-text benchmark
# (benchmarks/realtext): more room or a lower bar for sentences costs facts.
SENTENCE_SHARE = 0.3
SENTENCE_EFFICIENCY = 0.7
MIN_SENTENCES = 2
# How much more the newest fact weighs than the oldest.
RECENCY = 0.5
# A sentence is cut to the clauses holding its facts when it is longer than this (characters).
CLAUSE_CUT_CHARS = 120
# The letters a candidate must have besides its facts (about three words).
READING_LETTERS = 8
ELLIPSIS = "…"

_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
_BULLET = re.compile(r"(?:[-*+•◦‣]|\d{1,3}[.)]|\(\w\)|--)\s+\S")
_RULE = re.compile(r"([=\-~^*#_+])\1{2,}")
_HEADING = re.compile(r"#{1,6}\s|\S+ \([^)\s]+\) [^;]*; urgency=")  # Markdown, a Debian changelog entry
_SHELL = re.compile(r"(?:\$|>>>|#)\s")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?![a-zà-ÿ])|(?<=[。！？])\s*")
_CLAUSE_END = re.compile(r"(?<=[,;:])\s+|\s+(?=[\u2013\u2014]\s)|\s+(?=\()|(?<=\))\s+")  # en and em dashes
_SPACE = re.compile(r"\s+")
_CJK = re.compile(r"[\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]")


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
    # The distinct facts of the text read (values, as found verbatim), for the plan's figures.
    facts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Room:
    """What a summary may take: `limit` tokens of `block_tokens(text)` (the summary block's
    tokens for a text); `text_tokens` counts pieces of text, in one batch."""

    limit: int
    block_tokens: Callable[[str], int]
    text_tokens: Callable[[Sequence[str]], list[int]]


def unread_warning(unread_chars: int) -> list[str]:
    """The result's warning when a summary's facts were not read from all summarized text."""
    if not unread_chars:
        return []
    return [
        f"summary: facts read from the most recent {MAX_FACTS_CHARS} characters of the history "
        f"summarized; the {unread_chars} before them were not read (facts_total counts the read part)"
    ]


# --- 1. units and sentences -----------------------------------------------------------------


def _join(left: str, right: str, separator: str = " ") -> str:
    """Two pieces of wrapped text as one line (no space between CJK characters)."""
    if not left:
        return right
    if separator == " " and _CJK.match(left[-1]) and _CJK.match(right[0]):
        return left + right
    return left + separator + right


def _paragraph_units(paragraph: str) -> Iterator[str]:
    """A paragraph's units: hard-wrapped lines joined, list items, headings and shell lines apart."""
    unit, text_column, lines = "", 0, 0
    for line in paragraph.split("\n"):
        text = line.strip()
        if not text or _RULE.fullmatch(text):
            continue
        indent = len(line) - len(line.lstrip())
        starts = _BULLET.match(text) or _HEADING.match(text) or _SHELL.match(text)
        if starts or not unit or (_SHELL.match(unit) and lines):
            if unit:
                yield unit
            unit, lines = text, 1
            bullet = _BULLET.match(text)
            text_column = indent + (bullet.end() - 1 if bullet else 0)
            continue
        # A short first line followed by deeper-indented text: an item's tag and what it says.
        tag = lines == 1 and indent > text_column and unit[-1] not in ".,;:!?。"
        unit = _join(unit, text, ": " if tag else " ")
        lines += 1
    if unit:
        yield unit


def _sentences_of_unit(unit: str) -> list[str]:
    """A unit's sentences; an end inside a code span does not end one."""
    spans = [m.span() for m in fact_spans.CODE_SPAN.finditer(unit)]
    parts, start = [], 0
    for end in _SENTENCE_END.finditer(unit):
        if any(a < end.start() < b for a, b in spans) or end.end() >= len(unit):
            continue
        parts.append(unit[start : end.start()])
        start = end.end()
    parts.append(unit[start:])
    return [part.strip() for part in parts if part.strip()]


def one_line(text: str) -> str:
    """`text` on one line: each run of whitespace one space, except in code spans, kept byte for
    byte (re-spacing code would change it)."""
    out, last = [], 0
    for span in fact_spans.CODE_SPAN.finditer(text):
        out += [_SPACE.sub(" ", text[last : span.start()]), span.group()]
        last = span.end()
    out.append(_SPACE.sub(" ", text[last:]))
    return "".join(out).strip()


def _units(text: str) -> Iterator[list[str]]:
    """`text`'s units (see the module's step 1), each as its sentences, one-lined."""
    last = 0
    for fence in [*_FENCE.finditer(text), None]:
        prose = text[last : fence.start() if fence else len(text)]
        for paragraph in re.split(r"\n\s*\n", prose):
            for unit in _paragraph_units(paragraph):
                yield [one_line(s) for s in _sentences_of_unit(unit)]
        if fence:
            yield [fence.group().strip()]
            last = fence.end()


def sentences(text: str) -> list[str]:
    """`text` split into sentences (hard-wrapped lines joined first); fenced code blocks stay
    whole."""
    return [s for unit in _units(text) for s in unit if s]


# --- 2. facts and candidates ------------------------------------------------------------------


@dataclass(frozen=True)
class _Sentence:
    position: int  # in the conversation, over all sentences
    turn: int
    unit: int  # the list item, heading or paragraph of hard-wrapped lines it comes from
    role: str
    text: str
    facts: tuple[str, ...]  # values, each once


@dataclass
class _Candidate:
    sentence: _Sentence
    text: str  # the sentence, or the clauses holding its facts
    cost: int = 0


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
    """Every sentence of `turns`, one-lined, with the values of its facts."""
    items: list[_Sentence] = []
    units = 0
    for k, turn in enumerate(turns):
        # An earlier summary being summarized again: its header is not content.
        for unit in _units(turn.text.replace(HEADER, "")):
            for text in unit:
                values = tuple(dict.fromkeys(fact_spans.value(f) for f in fact_spans.extract(text)))
                items.append(_Sentence(len(items), k, units, turn.role, text, values))
            units += 1
    return items


def _newest_first(items: Sequence[_Sentence]) -> tuple[list[str], dict[str, int]]:
    """Each fact value once, newest first (the last said first), and the position of the last
    sentence holding it."""
    last: dict[str, int] = {}
    for s in items:
        for v in s.facts:
            last.pop(v, None)  # insertion order: the order of last appearance
            last[v] = s.position
    return list(reversed(last)), last


def facts_newest_first(turns: Sequence[Turn]) -> list[str]:
    """The distinct facts (values) of `turns`, newest first, read as a summary reads them."""
    return _newest_first(_sentences_of(turns))[0]


def _scored_window(items: Sequence[_Sentence]) -> Sequence[_Sentence]:
    """The most recent sentences within MAX_INPUT_CHARS: the candidates."""
    start, room = len(items), MAX_INPUT_CHARS
    while start > 0 and len(items[start - 1].text) <= room:
        start -= 1
        room -= len(items[start].text)
    return items[start:]


def _clauses(sentence: _Sentence) -> str | None:
    """A long sentence cut to the clauses that hold its facts (None: no shorter cut)."""
    text = sentence.text
    if len(text) <= CLAUSE_CUT_CHARS or not sentence.facts:
        return None
    protected = [m.span() for m in fact_spans.CODE_SPAN.finditer(text)]
    protected += [(text.find(v), text.find(v) + len(v)) for v in sentence.facts if v in text]
    bounds = [0]
    for end in _CLAUSE_END.finditer(text):
        if not any(a < end.start() < b or a < end.end() < b for a, b in protected):
            bounds += [end.start(), end.end()]
    bounds.append(len(text))
    pieces = [(bounds[k], bounds[k + 1]) for k in range(0, len(bounds), 2)]
    holding = [k for k, (a, b) in enumerate(pieces) if any(v in text[a:b] for v in sentence.facts)]
    if not holding:
        return None
    first, last = holding[0], holding[-1]
    cut = text[pieces[first][0] : pieces[last][1]]
    if len(cut) >= len(text) - 20 or not _reads(cut, sentence.facts):
        return None
    return (ELLIPSIS + " " if first else "") + cut + (" " + ELLIPSIS if last < len(pieces) - 1 else "")


def _reads(text: str, facts: Sequence[str]) -> bool:
    """Whether `text` says something besides its facts (READING_LETTERS letters at least): a
    list of ids reads no better than the facts line, which holds them for fewer tokens."""
    for value in facts:
        text = text.replace(value, " ")
    return sum(c.isalpha() for c in text) >= READING_LETTERS


# --- 4-6. selection and printing --------------------------------------------------------------


def with_facts(text: str, facts_line: Sequence[str]) -> str:
    """`text` and, when there are facts, the facts line under it."""
    return f"{text}\n{FACTS_LABEL}{'; '.join(facts_line)}" if facts_line else text


def _render(chosen: Sequence[_Candidate], facts_line: Sequence[str]) -> str:
    """A line per turn (`role: …`) and per further unit of it (indented); sentences of one unit
    on its line, "…" where some were left out between."""
    lines = [HEADER]
    previous: _Candidate | None = None
    for c in sorted(chosen, key=lambda c: c.sentence.position):
        s = c.sentence
        if previous is None or previous.sentence.turn != s.turn:
            lines.append(f"{s.role}: {c.text}")
        elif previous.sentence.unit != s.unit:
            lines.append(f"  {c.text}")
        else:
            gap = s.position - previous.sentence.position > 1
            cut = gap and not (lines[-1].endswith(ELLIPSIS) or c.text.startswith(ELLIPSIS))
            lines[-1] += f" {ELLIPSIS} {c.text}" if cut else f" {c.text}"
        previous = c
    return with_facts("\n".join(lines), facts_line)


class _Selection:
    """The greedy choice of step 4 over `candidates`, with the facts line's costs."""

    def __init__(
        self, candidates: list[_Candidate], line_cost: dict[str, int], weight: dict[str, float]
    ) -> None:
        self.candidates = candidates
        self.line_cost = line_cost
        self.weight = weight
        self.chosen: list[_Candidate] = []
        self.covered: set[str] = set()
        self.spent = 0
        self.line_left = sum(line_cost.values())  # the facts line's tokens for what is not covered

    def gain(self, c: _Candidate) -> float:
        return sum(self.line_cost[v] * self.weight[v] for v in c.sentence.facts if v not in self.covered)

    def carried(self, c: _Candidate) -> int:
        return sum(self.line_cost[v] for v in c.sentence.facts if v not in self.covered)

    def run(self, room: int, accept: Callable[[_Candidate], bool]) -> None:
        """Takes candidates by gain per token (lazily re-scored) while they fit `room` and
        `accept` them; one variant per sentence."""
        taken = {c.sentence.position for c in self.chosen}
        heap = [(-self.gain(c) / c.cost, k) for k, c in enumerate(self.candidates) if c.cost]
        heapq.heapify(heap)
        while heap:
            score, k = heapq.heappop(heap)
            c = self.candidates[k]
            if c.sentence.position in taken or self.spent + c.cost > room:
                continue
            now = -self.gain(c) / c.cost
            if now > score + 1e-12:  # worth less since: back in line
                heapq.heappush(heap, (now, k))
                continue
            if not accept(c):
                continue
            self.chosen.append(c)
            taken.add(c.sentence.position)
            self.line_left -= self.carried(c)
            self.covered.update(c.sentence.facts)
            self.spent += c.cost


def summarize(turns: Sequence[Turn], room: Room) -> SummaryText | None:
    """The summary of `turns` (oldest first) within `room`; None when not even the header fits."""
    base = room.block_tokens(HEADER)
    if base > room.limit:
        return None
    read, unread = facts_window(turns)
    items = _sentences_of(read)
    # Each fact once, at its last sentence (newest first on the line, heavier when recent).
    newest_first, last = _newest_first(items)
    # The latest of sentences said twice (a repeated changelog line) is the one offered.
    window = list({s.text: s for s in _scored_window(items)}.values())
    candidates = [_Candidate(s, s.text) for s in window if _reads(s.text, s.facts)]
    candidates += [_Candidate(s, cut) for s in window if (cut := _clauses(s)) is not None]
    roles = sorted({c.sentence.role for c in candidates})
    counts = room.text_tokens([*newest_first, *(c.text for c in candidates), *(f"{r}: " for r in roles)])
    line_cost = {v: n + 1 for v, n in zip(newest_first, counts, strict=False)}
    label = dict(zip(roles, counts[len(newest_first) + len(candidates) :], strict=True))
    for c, n in zip(candidates, counts[len(newest_first) :], strict=False):
        c.cost = n + label[c.sentence.role] + 1  # as if on a line of its own: an upper bound
    span = max(len(items) - 1, 1)
    weight = {v: 1.0 + RECENCY * last[v] / span for v in newest_first}

    body = room.limit - base - 2  # the label and line breaks
    selection = _Selection(candidates, line_cost, weight)
    every_fact_fits = selection.line_left <= body
    if every_fact_fits:
        # Every fact fits the line: sentences with facts take over theirs, then others fill.
        def takes_over(c: _Candidate) -> bool:
            carried = selection.carried(c)
            return carried > 0 and selection.spent + c.cost + selection.line_left - carried <= body

        selection.run(body, takes_over)
        by_recency = sorted(candidates, key=lambda c: -c.sentence.position)
        selection.candidates = [
            c for c in by_recency if c.text == c.sentence.text and len(c.text.split()) >= 4
        ]
        selection.run(body - selection.line_left, lambda _: True)
    else:
        share = int(body * SENTENCE_SHARE)

        def worth_it(c: _Candidate) -> bool:
            carried = selection.carried(c)
            return carried > 0 and (
                len(selection.chosen) < MIN_SENTENCES or carried >= SENTENCE_EFFICIENCY * c.cost
            )

        selection.run(share, worth_it)
    return _fitted(selection, newest_first, room, unread, every_fact_fits)


# Facts the line may hold at most: more than any room up to SUMMARY_CEILING takes.
MAX_LINE_FACTS = 2000


def _on_line(newest_first: Sequence[str], sentences: str) -> list[str]:
    """The facts the line needs: those no chosen sentence holds, less those another of them holds
    ("1:9.2p1-2" in "1:9.2p1-2+deb12u1": verbatim in the prompt all the same)."""
    pending = [v for v in newest_first if v not in sentences][:MAX_LINE_FACTS]
    held: set[str] = set()
    longer = ""  # the facts seen so far, longest first, a line each (no fact holds a line break)
    for v in sorted(pending, key=len, reverse=True):
        if v in longer:
            held.add(v)
        longer += "\n" + v
    return [v for v in pending if v not in held]


def _fitted(
    selection: _Selection, newest_first: list[str], room: Room, unread: int, every_fact_fits: bool
) -> SummaryText:
    """The chosen sentences and the facts line as counted for real (counts of pieces are not
    additive): sentences dropped from the last chosen while they alone are over, or, when every
    fact fitted the line, while the line cannot hold the facts they leave to it; then the line as
    long as fits."""
    chosen = list(selection.chosen)
    while True:
        text = "\n".join(c.text for c in chosen)
        pending = _on_line(newest_first, text)
        whole = room.block_tokens(_render(chosen, pending if every_fact_fits else [])) <= room.limit
        if whole or not chosen:
            break
        chosen.pop()
    line = fact_spans.longest_that_fits(
        pending, lambda line: room.block_tokens(_render(chosen, line)) <= room.limit
    )
    summary = _render(chosen, line)
    kept = sum(v in summary for v in newest_first)
    return SummaryText(summary, kept, len(newest_first), unread, tuple(newest_first))

"""What the real-text benchmark counts as a fact: written apart from the extractor under test
(contextshift.summarizer.facts), on another principle, so the benchmark does not grade the
extractor by its own definition.

The extractor scans text with patterns. Here text is cut into words (runs without whitespace),
each word trimmed of the punctuation around it, and a word is a fact when it is, as a whole, one
of the kinds below; a few kinds span words (dates with month names, timestamps, a number and its
unit) and are found first, their words then left alone. A fact's value is what must appear
verbatim in the prompt for the fact to count as kept (a code span's inside).

Kinds: url, email, cve (CVE and GHSA ids), issue (#123, gh-123, gh-issue-123, bpo-123), flag
(-x, --long, --long=value), setting (KEY=value), version (1.2.3, v1.2, 1:9.2p1-2+deb12u5,
3.11.0rc1), hash (hex, 7 to 64 digits, letters and digits mixed), path (absolute, ~/ or ./,
or with two slashes, or with a file name), name (dotted or :: names: core.hooksPath,
std::io::Read), code (a `code span` or ``literal``), date (2024-05-02, 25 Feb 2022, Feb 25,
2022, with a time and zone when given; a time alone), quantity (512 MiB, 30%, 10ms), number (two digits or
more, or with a decimal point).
"""

# ruff: noqa: RUF001  (typographic quotes and dashes in real text are the point)

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_MONTHS = (
    "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec|January|February|March|April|June|July|"
    "August|September|October|November|December"
)
_DAYS = "Mon|Tue|Wed|Thu|Fri|Sat|Sun"
_TIME = r"\d{1,2}:\d{2}(?::\d{2})?(?:\s?(?:[+-]\d{4}|UTC|GMT|Z))?"
# Kinds that span words: found in the text first.
_SPANNING = [
    ("code", re.compile(r"``[^`\n]+``|(?<!`)`[^`\n]+`(?!`)")),
    (
        "date",
        re.compile(
            rf"(?:(?:{_DAYS}),?\s+)?\d{{1,2}}\s+(?:{_MONTHS})\.?\s+\d{{4}}(?:\s+{_TIME})?"
            rf"|(?:{_MONTHS})\.?\s+\d{{1,2}},?\s+\d{{4}}(?:\s+{_TIME})?"
            rf"|\d{{4}}-\d{{2}}-\d{{2}}(?:[T ]{_TIME})?"
            rf"|(?<![\w:.]){_TIME}(?![\w:])"
        ),
    ),
    (
        "quantity",
        re.compile(
            r"(?<![\w.])\d+(?:[.,]\d+)?\s?(?:%|[KMGTP]i?B|[kKMG]?[bB]ytes?|bits?|ms|µs|ns|[kMG]?Hz|"
            r"seconds?|minutes?|hours?|days?|KB|MB|GB)(?![\w])"
        ),
    ),
]
# Kinds of a whole word, in the order they are tried.
_WORD = [
    ("url", re.compile(r"(?:https?|ftp|git|ssh|file)://\S+")),
    ("email", re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")),
    ("cve", re.compile(r"CVE-\d{4}-\d{4,}|GHSA(?:-[0-9a-z]{4}){3}")),
    ("issue", re.compile(r"#\d+|(?:gh|GH|bpo|gh-issue)-\d+")),
    ("flag", re.compile(r"--[A-Za-z0-9][\w-]*(?:=\S+)?|-[A-Za-z][A-Za-z0-9]*")),
    ("setting", re.compile(r"[A-Za-z_][\w.-]*=[^\s=][^\s]*")),
    (
        "version",
        re.compile(r"v?\d+(?:\.\d+){2,}[\w.+~-]*|\d+:\d[\w.+~-]*|v?\d+\.\d+[a-z~+-][\w.+~-]*|v\d+\.\d+"),
    ),
    ("hash", re.compile(r"(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,64}")),
    (
        "path",
        re.compile(
            r"(?:~|\.{1,2})?/[\w.@+-]+(?:/[\w.@+-]*)*|[\w.@+-]+(?:/[\w.@+-]+){2,}/?"
            r"|[\w.@+-]+/[\w@+-]*\.[A-Za-z0-9]{1,8}"
        ),
    ),
    ("name", re.compile(r"[A-Za-z_][\w-]+(?:\.[A-Za-z_][\w-]+)+|[A-Za-z_][\w-]*(?:::[A-Za-z_][\w-]*)+")),
    ("number", re.compile(r"\d+[.,]\d+|\d{2,}")),
]
_OPENERS = "([{<\"'“‘«„"
_CLOSERS = ")]}>\"'”’».,;:!?"


@dataclass(frozen=True)
class Fact:
    kind: str
    value: str


def _word_facts(text: str) -> Iterable[Fact]:
    # Markup's brackets and quotes end a word too: href="https://…" holds a URL.
    for word in re.split(r"[\s<>\"]+", text):
        word = word.lstrip(_OPENERS).rstrip(_CLOSERS)
        # A closing bracket belongs to the word when it opened one: "foo(1)".
        if word.count("(") > word.count(")"):
            word = word.split("(", 1)[0] if word.startswith("(") else word
        for kind, pattern in _WORD:
            if pattern.fullmatch(word):
                yield Fact(kind, word)
                break


def facts(text: str) -> list[Fact]:
    """The facts of `text`, in order of kinds found (spanning ones first), repeats included."""
    found: list[Fact] = []
    rest = text
    for kind, pattern in _SPANNING:
        pieces = []
        last = 0
        for match in pattern.finditer(rest):
            value = match.group()
            found.append(Fact(kind, value.strip("`") if kind == "code" else " ".join(value.split())))
            pieces.append(rest[last : match.start()])
            last = match.end()
        pieces.append(rest[last:])
        rest = " \n ".join(pieces)  # what a spanning fact took is no word of another fact
    found.extend(_word_facts(rest))
    return found


def distinct(text: str) -> dict[str, str]:
    """Each fact value of `text` once, with its kind: value -> kind."""
    return {f.value: f.kind for f in facts(text)}


def kept(values: Iterable[str], prompt: str) -> set[str]:
    """The values found verbatim in `prompt` (its whitespace runs read as one space, as a
    summary re-spaces hard-wrapped lines)."""
    flat = " ".join(prompt.split())
    return {v for v in values if v in prompt or v in flat}

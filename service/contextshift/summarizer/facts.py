"""Facts: the strings of a text a summary must keep verbatim (DESIGN §7). One extractor serves
`summarize`, llm-compact's facts line and the plans' `facts_kept / facts_total`.

Kinds: code spans (`x`, ``x``), URLs, e-mail addresses, CVE and GHSA ids, issue references
(#123, gh-123, gh-issue-123, bpo-123, PROJ-123), dates and timestamps (2024-05-02T03:11Z, Fri, 25
Feb 2022 23:30:49 +0100, May 1, 2024, 25. Februar 2022, 2023年1月25日, 12:30), command-line flags
(-x, --no-same-owner, --type=bool), `KEY=value` settings (GODEBUG=x509sha1=1), versions (semver,
PEP 440, Debian epochs and revisions: 1:9.2p1-2+deb12u5, 252.39-1~deb12u2, 3.11.0rc1), hashes
and UUIDs, paths (absolute, ~/ and ./, relative with two slashes or a file name: doc/bash.1),
file names, dotted and `::` names (core.hooksPath, os.path.join(), Dir::Etc::Parts), code names
(MAX_RETRIES, load_settings_v4, hooksPath), amounts and measures (512 MiB, 30%, $5), and numbers
other than a lone digit.

A fact is a whole string: at each place the longest match of any kind wins, and the scan goes on
after it, so no piece of a larger fact is a fact of its own. A path or name starts where a word
does (the "/or" of "and/or" is none), a flag after a space or a bracket, and trailing sentence
punctuation is not part of a fact.

Text with none of the characters a fact holds (a digit, `/`, `\\`, `@`, a backtick, `#`, `=`, `_`,
a currency sign, a `.` or `::` before a letter, a `-` starting a word, a lower-case letter before
an upper-case one) has no fact and is not scanned: that skips most prose, and the scan reads only
0.5 to 0.8 MB/s of text dense with facts (logs, changelogs, JSON).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

_MONTHS = (
    r"Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sept?(?:ember)?|"
    r"Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?"
    # German, French, Spanish (lower-case as written in French and Spanish).
    r"|Januar|Februar|März|Juni|Juli|Oktober|Dezember"
    r"|janvier|février|mars|avril|mai|juin|juillet|août|septembre|octobre|novembre|décembre"
    r"|enero|febrero|marzo|abril|mayo|junio|julio|agosto|septiembre|setiembre|octubre|noviembre|diciembre"
)
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*,?\s+"
_CLOCK = r"\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?"
_ZONE = r"(?:\s?(?:[+-]\d{2}:?\d{2}|Z|UTC|GMT))?"
_EXTENSIONS = (
    r"py|pyi|js|jsx|mjs|ts|tsx|rs|go|java|kt|rb|php|cs|c|h|cc|cpp|hpp|swift|sh|sql|json|ya?ml|toml|"
    r"ini|cfg|conf|env|lock|md|rst|txt|csv|tsv|xml|html?|css|scss|log|pdf|docx?|xlsx?|png|jpe?g|"
    r"svg|zip|gz|xz|bz2|zst|tar|tgz|deb|dsc|rpm|whl|so|diff|patch|proto|ipynb|[1-9]"
)
_UNITS = (
    r"USD|EUR|GBP|JPY|CHF|CNY|%|ms|µs|ns|s|sec|secs|seconds?|min|mins|minutes?|h|hrs|hours?|days?|"
    r"weeks?|months?|years?|[KMGTP]i?B|[kKMG]?[bB]ytes?|bits?|[kMG]?Hz|kg|g|mg|lbs?|km|cm|mm|m|mi|"
    r"ft|°[CF]|px|tokens?"
)
# Where a word starts: not after a letter, digit or one of the characters that join words.
_WORD_START = r"(?<![\w./\\~:@+-])"

# Each kind, as one pattern; the scan takes the longest match of any at each place.
KINDS: dict[str, str] = {
    # Inside, no space or underscore first and no space last: "`text <url>`__ and `x`" (a
    # reStructuredText link, then a span) holds the span `x` only.
    "code": r"``[^`\n]+``|(?<!`)`(?![\s_])[^`\n]{0,199}(?<!\s)`(?!`)",
    "url": r"\b(?:https?|ftp|file|git|ssh|s3|gs)://[^\s<>\"'`)\]}]+",
    "email": r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+",
    "cve": r"\b(?:CVE-\d{4}-\d{4,}|GHSA(?:-[0-9a-z]{4}){3})\b",
    "issue": r"(?<![\w&#])#\d+\b|\b(?:gh-issue|gh|GH|bpo)-\d+\b|\b[A-Z][A-Z0-9]{1,9}-\d+\b",
    "date": (
        rf"(?:{_DAY})?\b\d{{1,2}}\.?\s+(?:de\s+)?(?:{_MONTHS})\.?(?:\s+de)?\s+\d{{4}}(?:,?\s+{_CLOCK}{_ZONE})?"
        rf"|\b(?:{_MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}(?:,?\s+{_CLOCK}{_ZONE})?"
        rf"|\b\d{{4}}-\d{{2}}-\d{{2}}(?:[T ]{_CLOCK}{_ZONE})?"
        r"|\b\d{4}年\d{1,2}月(?:\d{1,2}日)?"
        r"|\b\d{1,2}/\d{1,2}/\d{2,4}\b"
        rf"|\b{_CLOCK}(?:\s?[AaPp]\.?[Mm]\.?)?{_ZONE}(?![\d:])"
    ),
    "flag": r"(?<![^\s(\[{|,;\"'`=])--?[A-Za-z][\w-]*(?:=[^\s,;)\]}\"'`]+)?",
    "setting": (
        rf"{_WORD_START}[A-Za-z_][\w.:-]*=(?:\"[^\"\n]*\"|'[^'\n]*'|[^\s,;)\]}}\"'`=][^\s,;)\]}}\"'`]*)"
    ),
    "version": (
        # A trailing + or ~ belongs to it: "3.8+" (or later), "3.0.0~" (Debian: before 3.0.0).
        rf"{_WORD_START}v?(?:\d+:)?\d+(?:\.\d+)+(?:[a-z]+\d*)?(?:[.+~-][A-Za-z0-9]+)*(?:[+~](?!\w))?"
        rf"|{_WORD_START}\d+:\d+[a-z]*\d*(?:[.+~-][A-Za-z0-9]+)+"
    ),
    "uuid": r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
    "hash": r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,64}\b",
    "path": (
        r"(?<![\w/.~-])(?:~|\.{1,2})?/[\w.@+%-]+(?:/[\w.@+%-]+)*/?"
        r"|\b[A-Za-z]:\\(?:[^\\\s:*?\"<>|]+\\)*[^\\\s:*?\"<>|]*"
        rf"|{_WORD_START}[\w.@+-]+(?:/[\w.@+-]+){{2,}}/?"
        rf"|{_WORD_START}[\w.@+-]+(?:/[\w.@+-]+)*/[\w@+-]+(?:\.[\w-]+)*\.(?:{_EXTENSIONS})\b"
    ),
    # A stem of two characters at least: "d.h." (German "that is") is no C header.
    "file": rf"{_WORD_START}[A-Za-z_][\w-]+(?:\.[\w-]+)*\.(?:{_EXTENSIONS})\b",
    "name": (
        rf"{_WORD_START}[A-Za-z_][\w-]+(?:\.[A-Za-z_][\w-]+)+(?:\(\))?"
        rf"|{_WORD_START}[A-Za-z_][\w-]*(?:::[A-Za-z_~][\w-]*)+(?:\(\))?"
    ),
    # Code names: CONSTANT_CASE and snake_case (an underscore between parts), camelCase.
    "identifier": r"\b[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\b|\b[a-z]+(?:[A-Z][a-z0-9]+)+\b",
    "amount": (
        r"[$€£¥₹]\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:[kKmMbB]n?|million|billion|thousand)\b)?"
        rf"|(?<![\w.,])\d[\d,]*(?:\.\d+)?\s?(?:{_UNITS})(?![\w%])"
    ),
    # A number other than a lone digit; digits may touch CJK text (2024年), not Latin letters.
    "number": r"(?<![\w.,-])-?\d+(?:[.,]\d+)+(?![\w]|[.,]\d)|(?<![\w.,])-?\d{2,}(?![\w]|[.,]\d)",
}
_COMPILED = [re.compile(p) for p in KINDS.values()]
_SCAN = re.compile("|".join(f"(?:{p})" for p in KINDS.values()))
# Searches the regex engine runs fast (a character set, a literal first byte), rather than the
# alternation above, whose word-starting branches would be tried almost everywhere.
_TRIGGERS = (
    re.compile(r"[0-9/\\@`#=_$€£¥₹]"),
    re.compile(r"[a-z][A-Z]"),
    re.compile(r"[.:][A-Za-z_]"),
    re.compile(r"(?<![\w-])-[A-Za-z-]"),
    re.compile(r"GHSA-"),  # an id of letters only
)
_TRAILING = ".,;:!?'\")]}"
_OPENERS = {")": "(", "]": "[", "}": "{", '"': '"', "'": "'"}
# Code spans, as the summarizer keeps them byte for byte.
CODE_SPAN = re.compile(KINDS["code"])


def _spans(text: str) -> Iterable[tuple[int, int]]:
    """The longest match at each place where one starts, left to right, never overlapping (an
    alternation alone would take the first kind that matches, not the longest)."""
    position = 0
    while (match := _SCAN.search(text, position)) is not None:
        start = match.start()
        end = max(m.end() for p in _COMPILED if (m := p.match(text, start)) is not None)
        if end == start:
            position = start + 1
            continue
        yield start, end
        position = end


def _trimmed(fact: str) -> str:
    """`fact` without the sentence punctuation after it; a bracket or quote it opened stays."""
    while fact and fact[-1] in _TRAILING:
        closer = fact[-1]
        opener = _OPENERS.get(closer)
        balanced = (
            fact.count(closer) % 2 == 0
            if opener == closer
            else fact.count(opener or "") >= fact.count(closer)
        )
        if opener is not None and balanced:
            break
        fact = fact[:-1]
    return fact


def extract(text: str) -> list[str]:
    """The facts of `text`, in order of appearance (repeats included)."""
    if not any(trigger.search(text) for trigger in _TRIGGERS):
        return []
    found = []
    for start, end in _spans(text):
        fact = text[start:end]
        if not fact.startswith("`"):
            fact = _trimmed(fact)
        if len(fact) > 1:
            found.append(fact)
    return found


def distinct(facts: Iterable[str]) -> list[str]:
    """Each fact once, at its last appearance (what a cut by recency keeps)."""
    last = {fact: k for k, fact in enumerate(facts)}
    return sorted(last, key=last.__getitem__)


def value(fact: str) -> str:
    """What must appear verbatim for a fact to be kept: a code span's code."""
    return fact.strip("`") if fact.startswith("`") and fact.endswith("`") and len(fact) > 2 else fact


def longest_that_fits(items: Sequence[str], fits: Callable[[Sequence[str]], bool]) -> Sequence[str]:
    """The longest prefix of `items` that `fits` (binary search: `fits` must hold for a prefix
    when it holds for a longer one, and for the empty prefix)."""
    low, high = 0, len(items)
    while low < high:
        middle = (low + high + 1) // 2
        if fits(items[:middle]):
            low = middle
        else:
            high = middle - 1
    return items[:low]

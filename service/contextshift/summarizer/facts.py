"""Facts: the spans of a text a summary must keep verbatim — URLs, e-mail addresses, file paths,
dates and times, amounts and measures, identifiers (UUIDs, hashes, tickets, code names,
versions), code spans and multi-digit numbers. A single bare digit is not a fact ("2 options"):
it would crowd the facts line with noise.

`extract` scans once with every pattern, keeps the longest match at each place (a URL is not
also a path and a number), and returns the facts in order of appearance. Text with none of the
characters every fact holds (a digit, `/`, `\\`, `@`, a backtick, `_`, `#`, a currency sign, a
`.` before a letter, a lower-case letter before an upper-case one) has no fact and is not
scanned: that skips most prose, and the scan reads only about 1 MB/s. The one fact that can lack
them all, a UUID of letters only, has odds of about 1 in 10^13.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
    r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_EXTENSIONS = (
    r"(?:py|pyi|js|jsx|ts|tsx|rs|go|java|kt|rb|php|cs|c|h|cc|cpp|hpp|swift|sh|sql|json|ya?ml|toml|"
    r"ini|cfg|conf|env|lock|md|rst|txt|csv|tsv|xml|html?|css|scss|log|pdf|docx?|xlsx?|png|jpe?g|"
    r"svg|zip|gz|tar|whl|proto|ipynb|dockerfile)"
)
# A code span: kept byte for byte (the summarizer neither splits nor re-spaces one).
CODE_SPAN = re.compile(r"`[^`\n]{1,200}`")
_PATTERNS = [
    CODE_SPAN.pattern,
    r"\b(?:https?|ftp|file|s3|gs)://[^\s<>\"'`)\]}]+",  # URL
    r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+",  # e-mail
    r"\b[A-Za-z]:\\(?:[^\\\s:*?\"<>|]+\\)*[^\\\s:*?\"<>|]*",  # Windows path
    r"(?:~|\.{1,2})?/(?:[\w.@+-]+/)*[\w.@+-]+/?",  # Unix path (absolute, ~ or ./)
    rf"\b(?:[\w.-]+/)+[\w.-]+\.{_EXTENSIONS}\b",  # relative path with a file name
    rf"\b[\w-]+(?:\.[\w-]+)*\.{_EXTENSIONS}\b",  # file name
    r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b",  # ISO date
    r"\b\d{1,2}/\d{1,2}/\d{2,4}\b",  # numeric date
    rf"\b{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?(?:,? \d{{4}})?\b",  # May 1, 2024
    rf"\b\d{{1,2}}(?:st|nd|rd|th)? {_MONTH}\.?(?: \d{{4}})?\b",  # 1 May 2024
    r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s?[AaPp]\.?[Mm]\.?)?",  # time
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",  # UUID
    r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,64}\b",  # hash
    r"(?<![\w#])#\d{2,}\b",  # issue number
    r"\b[A-Z][A-Z0-9]{1,9}-\d+\b",  # ticket (JIRA-123)
    r"[$€£¥₹]\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:[kKmMbB]n?|million|billion|thousand)\b)?",  # currency amount
    r"\b\d[\d,]*(?:\.\d+)?\s?(?:USD|EUR|GBP|JPY|CHF|CNY|%|ms|µs|ns|sec|secs|s|min|mins|h|hrs|"
    r"days?|weeks?|months?|years?|[KMGT]i?B|bytes?|kg|g|mg|lbs?|km|cm|mm|m|mi|ft|°[CF]|px|tokens?)(?!\w)",
    r"\bv?\d+\.\d+(?:\.\d+)+(?:[-+][\w.]*\w)?",  # version
    r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b",  # CONSTANT_CASE
    r"\b[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\b",  # snake_case
    r"\b[a-z]+(?:[A-Z][a-z0-9]+)+\b",  # camelCase
    r"\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+\(\)",  # dotted call: os.path.join()
    # A number other than a lone digit; digits may touch CJK text (2024年), not Latin letters.
    r"(?<![A-Za-z0-9_.])-?\d+(?:[.,]\d+)+(?![A-Za-z0-9_]|\.\d)|(?<![A-Za-z0-9_.])-?\d{2,}(?![A-Za-z0-9_]|\.\d)",
]
_SCAN = re.compile("|".join(f"(?:{p})" for p in _PATTERNS))
# Three searches the regex engine runs fast (a character set, a literal first byte), rather than
# one alternation, whose lower-case first letters would match almost everywhere.
_TRIGGERS = (re.compile(r"[0-9/\\@`_#$€£¥₹]"), re.compile(r"\.[A-Za-z_]"), re.compile(r"[a-z][A-Z]"))
_COMPILED = [re.compile(p) for p in _PATTERNS]
_TRAILING = ".,;:!?'\")]}"


def _spans(text: str) -> Iterable[tuple[int, int]]:
    """The longest match at each place where one starts, left to right, never overlapping (an
    alternation alone would take the first pattern that matches, not the longest)."""
    position = 0
    while (match := _SCAN.search(text, position)) is not None:
        start = match.start()
        end = max(m.end() for p in _COMPILED if (m := p.match(text, start)) is not None)
        if end == start:
            position = start + 1
            continue
        yield start, end
        position = end


def extract(text: str) -> list[str]:
    """The facts of `text`, in order of appearance (repeats included)."""
    if not any(trigger.search(text) for trigger in _TRIGGERS):
        return []
    found = []
    for start, end in _spans(text):
        fact = text[start:end]
        if not fact.startswith("`") and not fact.endswith("()"):
            fact = fact.rstrip(_TRAILING)
        if fact:
            found.append(fact)
    return found


def distinct(facts: Iterable[str]) -> list[str]:
    """Each fact once, at its last appearance (what a cut by recency keeps)."""
    last = {fact: k for k, fact in enumerate(facts)}
    return sorted(last, key=last.__getitem__)


def value(fact: str) -> str:
    """What must appear verbatim for a fact to be kept: a code span's code."""
    return fact[1:-1] if len(fact) > 1 and fact.startswith("`") and fact.endswith("`") else fact


def retained(texts: Iterable[str], summary: str) -> tuple[int, int]:
    """`(kept, total)`: the distinct facts of `texts`, and how many `summary` carries verbatim."""
    found = distinct(f for text in texts for f in extract(text))
    return sum(value(f) in summary for f in found), len(found)


def recent_that_fit(facts: Sequence[str], fits: Callable[[Sequence[str]], bool]) -> Sequence[str]:
    """The longest tail of `facts` (oldest dropped first) that `fits`; `fits` must hold for the
    empty tail when it holds for none longer."""
    low, high = 0, len(facts)  # the fewest facts dropped from the oldest end that fits
    while low < high:
        middle = (low + high) // 2
        if fits(facts[middle:]):
            high = middle
        else:
            low = middle + 1
    return facts[low:]

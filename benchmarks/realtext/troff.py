"""A man page's troff source as the text `man` shows: paragraphs filled and hard-wrapped at a fixed
width, headings flush left, tags of `.TP` / `.IP` items on their own line, examples (`.nf`,
`.EX`, Pod's `.Vb`) kept line for line.

Only what Debian's man pages use is read: the `man` macros, Pod::Man's and DocBook's preambles
(skipped), font and size escapes (dropped), named characters and accents (`\\(:u` is ü). The
output depends on the source alone (no groff, no terminal), so the corpus is the same on every
machine that has the same file.
"""

# ruff: noqa: RUF001  (typographic quotes and dashes in real text are the point)

from __future__ import annotations

import re
import textwrap
import unicodedata

WIDTH = 78
INDENT = 7  # man's body indentation
_NAMED = {
    "em": "—",
    "en": "–",
    "hy": "-",
    "aq": "'",
    "dq": '"',
    "lq": "“",
    "rq": "”",
    "oq": "‘",
    "cq": "’",
    "Bq": "„",
    "bq": "‚",
    "Fo": "«",
    "Fc": "»",
    "fo": "‹",
    "fc": "›",
    "bu": "•",
    "co": "©",
    "rg": "®",
    "tm": "™",
    "de": "°",
    "ga": "`",
    "ti": "~",
    "ha": "^",
    "rs": "\\",
    "ss": "ß",
    "mu": "×",
    "pl": "+",
    "mi": "-",
    "eq": "=",
    "->": "→",
    "<-": "←",
    "sc": "§",
    "ae": "æ",
    "AE": "Æ",
    "o/": "ø",
    "O/": "Ø",
    "ao": "å",
    "AO": "Å",
}
# `\(:u` and friends: a letter and an accent.
_ACCENTS = {":": "\u0308", "'": "\u0301", "`": "\u0300", "^": "\u0302", "~": "\u0303", ",": "\u0327"}
# Pod::Man's strings in nroff.
_STRINGS = {"--": "--", "PI": "pi", 'L"': '"', 'R"': '"', "C`": "", "C'": "", "C+": "C++", "Aq": "'"}
_ESCAPE = re.compile(
    r"\\(?:"
    r"f(?:\[[^\]]*\]|\(..|.)"  # font
    r"|s[-+]?(?:\(\d\d|\d)"  # size
    r"|[vhwoxlLbDNZR]'[^']*'"  # motions and other quoted-argument escapes
    r"|\*(?:\[([^\]]*)\]|\((..)|(.))"  # string
    r"|\((..)"  # named character
    r"|\[([^\]]*)\]"  # named character (groff)
    r"|(.)"  # anything else
    r")"
)


def _character(name: str) -> str:
    if name in _NAMED:
        return _NAMED[name]
    if len(name) == 2 and name[0] in _ACCENTS:
        return unicodedata.normalize("NFC", name[1] + _ACCENTS[name[0]])
    if name.startswith("u") and re.fullmatch(r"u[0-9A-Fa-f]{4,6}", name):
        return chr(int(name[1:], 16))
    return ""


def _unescape(match: re.Match[str]) -> str:
    string = match.group(1) or match.group(2) or match.group(3)
    if string is not None:
        return _STRINGS.get(string, "")
    named = match.group(4) or match.group(5)
    if named is not None:
        return _character(named)
    other = match.group(6)
    if other is None:
        return ""  # a font, size or motion
    return {"-": "-", "e": "\\", " ": " ", "~": " ", "0": " ", "'": "'", "`": "`", ".": "."}.get(other, "")


def text_of(line: str) -> str:
    """A line's text with its escapes resolved."""
    return _ESCAPE.sub(_unescape, line)


def _arguments(line: str) -> list[str]:
    """A request's arguments (quoted ones may hold spaces)."""
    return [a[1:-1] if a.startswith('"') else a for a in re.findall(r'"[^"]*"|\S+', line)]


class _Page:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.words: list[str] = []
        self.indent = INDENT

    def flush(self) -> None:
        if self.words:
            prefix = " " * self.indent
            self.lines += textwrap.wrap(
                " ".join(self.words),
                WIDTH,
                initial_indent=prefix,
                subsequent_indent=prefix,
                break_long_words=False,
                break_on_hyphens=False,
            )
            self.words = []

    def gap(self) -> None:
        self.flush()
        if self.lines and self.lines[-1]:
            self.lines.append("")

    def line(self, text: str, indent: int) -> None:
        self.flush()
        self.lines.append(" " * indent + text if text else "")


def _table(lines: list[str]) -> list[str]:
    """A `tbl` table's rows, cells two spaces apart: its options and format lines (up to the one
    ending with a period) skipped, `T{ … T}` text blocks joined."""
    options = re.search(r"tab\s*\((.)\)", lines[0]) if lines else None
    separator = options.group(1) if options else "\t"
    body = lines[next((k + 1 for k, line in enumerate(lines) if line.rstrip().endswith(".")), 0) :]
    rows = "\n".join(line for line in body if not line.startswith((".", "'")))
    rows = re.sub(r"T\{\n?|\n?T\}", "", rows)
    return ["  ".join(text_of(cell).strip() for cell in row.split(separator)) for row in rows.splitlines()]


def render(source: str) -> str:
    """The text of a man page's troff `source`."""
    page = _Page()
    table: list[str] | None = None  # inside `.TS` … `.TE`
    fill = True
    skip_depth = 0  # inside `.if … \\{` blocks
    in_macro = False  # inside a `.de` definition
    tag_next = False  # the next text line is a `.TP` tag
    base = INDENT
    for raw in source.splitlines():
        if in_macro:
            in_macro = raw.strip() != ".."
            continue
        if skip_depth:
            skip_depth += raw.count("\\{") - raw.count("\\}")
            continue
        if table is not None:
            if raw.startswith(".TE"):
                for row in _table(table):
                    page.line(row, page.indent)
                table = None
            else:
                table.append(raw)
            continue
        if raw.startswith((".", "'")):
            request = raw[1:].strip()
            name, _, rest = request.partition(" ")
            if name.startswith('\\"') or not name:
                continue
            if name in {"de", "de1", "am"}:
                in_macro = True
            elif name == "TS":
                page.gap()
                table = []
            elif name in {"if", "ie", "el"} or name.startswith(("if", "ie", "el")):
                skip_depth = max(0, raw.count("\\{") - raw.count("\\}"))
            elif name in {"SH", "SS"}:
                page.gap()
                heading = text_of(" ".join(_arguments(rest)))
                page.line(heading, 0 if name == "SH" else 3)
                base = page.indent = INDENT
            elif name in {"PP", "LP", "P"}:
                page.gap()
                page.indent = base
            elif name in {"sp", "Sp"}:
                page.gap()  # a space only: an item's paragraphs keep its indentation
            elif name == "br":
                page.flush()
            elif name == "TP":
                page.gap()
                tag_next = True
            elif name in {"IP", "HP"}:
                page.gap()
                tag = text_of(_arguments(rest)[0]) if rest and name == "IP" else ""
                if tag:
                    page.line(tag, base)
                page.indent = base + 4
            elif name == "RS":
                page.flush()
                base += 4
                page.indent = base
            elif name == "RE":
                page.flush()
                base = max(INDENT, base - 4)
                page.indent = base
            elif name in {"nf", "EX", "Vb"}:
                page.flush()
                fill = False
            elif name in {"fi", "EE", "Ve"}:
                fill = True
            elif name in {"B", "I", "SM", "SB", "UR", "MT"}:
                words = text_of(" ".join(_arguments(rest)))
                if fill:
                    page.words.append(words)
                else:
                    page.line(words, page.indent)
            elif name in {"BR", "IR", "RB", "BI", "IB", "RI"}:
                words = text_of("".join(_arguments(rest)))
                if tag_next:
                    page.line(words, base)
                    page.indent = base + 4
                    tag_next = False
                elif fill:
                    page.words.append(words)
                else:
                    page.line(words, page.indent)
            elif name == "TH":
                title = _arguments(rest)
                page.line(text_of(" ".join(title[:2])), 0)
            continue  # any other request: no text
        text = text_of(raw)
        if tag_next:
            page.line(text.strip(), base)
            page.indent = base + 4
            tag_next = False
        elif fill:
            if text.strip():
                page.words.append(text.strip())
            else:
                page.gap()
        else:
            page.line(text.rstrip(), page.indent)
    page.flush()
    return "\n".join(page.lines).strip("\n") + "\n"

"""Chats and agent loops made of the real text of benchmarks/realtext/sources.py.

A chat is a source's text cut into turns at paragraph ends (about CHUNK_CHARS each), answered by
the assistant, each after a short user question in the source's language; the last question is
the current input. An agent loop is a task, tool calls whose results are a source's chunks (or a
tool's JSON), the agent's answer and a question. Only the questions, tasks and call arguments are
written here; everything else is the sources' text, unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from benchmarks.realtext import sources

CHUNK_CHARS = 1400
TURNS = 12  # assistant turns of a chat
QUESTIONS = {
    "en": ["What does it say?", "Go on.", "And then?", "What comes next?", "Anything else there?"],
    "de": ["Was steht darin?", "Weiter, bitte.", "Und dann?", "Was kommt als Nächstes?", "Noch etwas?"],
    "fr": ["Qu'est-ce que ça dit ?", "Continue.", "Et ensuite ?", "Quelle est la suite ?", "Autre chose ?"],
    "es": ["¿Qué dice?", "Sigue, por favor.", "¿Y después?", "¿Qué viene ahora?", "¿Algo más?"],
    "ja": ["何と書いてありますか？", "続けてください。", "それから？", "次は何ですか？", "ほかには？"],
}
CURRENT = {
    "en": "Which of these details matter for our upgrade?",
    "de": "Welche dieser Angaben sind für unser Upgrade wichtig?",
    "fr": "Lesquels de ces détails comptent pour notre mise à niveau ?",
    "es": "¿Cuáles de estos detalles importan para nuestra actualización?",
    "ja": "このうち、アップグレードで重要な点はどれですか？",
}
SYSTEM = "You are a helpful assistant for a team that maintains Debian servers and Python services."


@dataclass(frozen=True)
class Chat:
    name: str
    lang: str
    blocks: list[dict[str, Any]]
    loop: bool = False


def chunks(text: str, size: int = CHUNK_CHARS) -> list[str]:
    """`text` in pieces of about `size` characters, cut after a paragraph (a blank line), else
    (a paragraph longer than a piece) after a line."""
    parts: list[str] = []
    for paragraph in text.split("\n\n"):
        if len(paragraph) > size:
            parts += [line + "\n" for line in paragraph.split("\n")]
        else:
            parts.append(paragraph + "\n\n")
    out: list[str] = []
    current = ""
    for part in parts:
        if current and len(current) + len(part.rstrip("\n")) > size:
            out.append(current.strip("\n"))
            current = ""
        current += part
    out.append(current.strip("\n"))
    return [c for c in out if c.strip()]


def chat(source: sources.Source, turns: int = TURNS) -> Chat:
    parts = chunks(sources.read(source))[:turns]
    questions = QUESTIONS[source.lang]
    blocks: list[dict[str, Any]] = [{"id": "sys", "role": "system", "content": SYSTEM}]
    for k, part in enumerate(parts):
        blocks.append({"id": f"u{k}", "role": "user", "content": questions[k % len(questions)]})
        blocks.append({"id": f"a{k}", "role": "assistant", "content": part})
    blocks.append({"id": "now", "role": "user", "content": CURRENT[source.lang]})
    return Chat(source.name, source.lang, blocks)


def _sbom_pages(source: sources.Source, per_page: int = 6) -> list[str]:
    """A CycloneDX SBOM's components, `per_page` at a time, as a tool would return them."""
    components = json.loads(sources.read(source))["components"]
    return [
        json.dumps({"components": components[k : k + per_page], "offset": k}, indent=1)
        for k in range(0, len(components), per_page)
    ]


@dataclass(frozen=True)
class Loop:
    """An agent loop's recipe: its task and the sources its tool results come from."""

    name: str
    task: str
    tool: str
    results: tuple[str, ...]  # source names
    steps: int = 21


LOOPS = [
    Loop(
        "sbom-audit",
        "List the Rust crates maturin 1.16.0 and ruff 0.17.6 ship, with versions and licenses.",
        "read_sbom",
        ("maturin-sbom", "ruff-sbom"),
    ),
    Loop(
        "security-review",
        "Which security fixes reached openssh, systemd, glibc and curl in bookworm? Cite the CVEs.",
        "read_changelog",
        ("openssh-changelog", "systemd-changelog", "glibc-changelog", "curl-changelog"),
    ),
    Loop(
        "apt-config",
        "How do we pin a package and set apt's proxy and retries? Collect the exact settings.",
        "read_manual",
        ("apt-conf-man", "dpkg-man", "apt-get-man-de"),
    ),
]


def loop(recipe: Loop) -> Chat:
    per_source = []
    for name in recipe.results:
        source = sources.BY_NAME[name]
        per_source.append(_sbom_pages(source) if source.lang == "json" else chunks(sources.read(source)))
    # A page of each source in turn, as an agent reading them side by side.
    turns = max(len(pages) for pages in per_source)
    results = [pages[k] for k in range(turns) for pages in per_source if k < len(pages)][: recipe.steps]
    blocks: list[dict[str, Any]] = [
        {"id": "sys", "role": "system", "content": SYSTEM + " Use the tools."},
        {"id": "task", "role": "user", "content": recipe.task},
    ]
    for n, result in enumerate(results):
        function = {"name": recipe.tool, "arguments": json.dumps({"page": n})}
        call = {"id": f"call_{n}", "type": "function", "function": function}
        blocks.append({"id": f"c{n}", "role": "assistant", "content": None, "tool_calls": [call]})
        blocks.append({"id": f"r{n}", "role": "tool", "tool_call_id": f"call_{n}", "content": result})
    blocks.append(
        {"id": "answer", "role": "assistant", "content": "I have read everything; here is what I found."}
    )
    blocks.append({"id": "now", "role": "user", "content": "Which of these should we act on first?"})
    return Chat(recipe.name, "en", blocks, loop=True)

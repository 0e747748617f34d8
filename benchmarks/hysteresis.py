"""Hysteresis benchmark: how often the prompt's prefix changes when a long chat is replayed turn
by turn, for `target_ratio` 1.0 and 0.8 and for LangChain's `trim_messages`.

A provider caches a prompt's prefix: while each turn's prompt starts with the previous turn's
prompt, only the new messages are processed afresh. The caller works as an agent loop does: it
keeps what it sent, appends the answer and the next user turn, and shifts that. Once the chat
outgrows the budget, a shift that cuts just enough changes the prefix every turn; with
`target_ratio` 0.8 it cuts down to 80% of the budget and then grows back for several turns before
cutting again. A caller that resends the whole history every turn (a stateless chat backend)
keeps its prefix through the server's memory of the chat's last cut instead: cache-stable shifts
(the `cache_stable` option, on by default for a `chat_id`), measured through the real server with
and without it. Same chat, same counts (o200k_base) and same budget for every contender, in one
run.

    python benchmarks/hysteresis.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, trim_messages  # noqa: E402

import contextshift  # noqa: E402
from tests.integration.conftest import serving  # noqa: E402

PROFILE = "o200k_base"
BUDGET = 8_000
WORDS = ["the", "order", "shipped", "late", "so", "we", "opened", "a", "ticket", "and", "courier", "promised"]


def chat(turns: int) -> list[dict[str, Any]]:
    """A system prompt, then `turns` user turns each answered by the assistant."""
    rng = random.Random(300)
    blocks: list[dict[str, Any]] = [{"id": "system", "role": "system", "content": "You are a support agent."}]
    for n in range(turns):
        for role, length in (("user", rng.randrange(10, 60)), ("assistant", rng.randrange(30, 150))):
            text = " ".join(rng.choice(WORDS) for _ in range(length))
            blocks.append({"id": f"{role[0]}{n}", "role": role, "content": text})
    return blocks


Prompt = Callable[[list[dict[str, Any]]], list[str]]


def contextshift_prompt(target_ratio: float) -> Prompt:
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


def server_prompt(client: contextshift.Client, chat: str, cache_stable: bool) -> Prompt:
    """ShiftContext of the whole history for `chat`, every turn, as a stateless backend sends it."""

    def prompt(blocks: list[dict[str, Any]]) -> list[str]:
        options = {"target_ratio": 0.8, "cache_stable": cache_stable}
        result = client.shift_context(blocks, budget=BUDGET, profile=PROFILE, chat_id=chat, options=options)
        return [d.id for d in result.kept]

    return prompt


def replay(
    blocks: list[dict[str, Any]], prompt: Prompt, counts: dict[str, int], *, resend_all: bool = False
) -> dict[str, Any]:
    """Prefix changes (turns whose prompt does not start with the previous turn's) and the share of
    prompt tokens in the prefix shared with the previous turn (what a provider's cache can serve).
    The caller keeps what it sent and appends to it, or with `resend_all` sends the whole history."""
    by_id = {b["id"]: b for b in blocks}
    previous: list[str] = []
    changes = cached = sent = turns = 0
    for end in range(2, len(blocks) + 1, 2):  # each user turn: the answer before it, then it
        new = [b["id"] for b in blocks[max(1, end - 2) : end]]
        history = [b["id"] for b in blocks[:end]] if resend_all else (previous or [blocks[0]["id"]]) + new
        ids = prompt([by_id[i] for i in history])
        turns += 1
        common = 0
        while common < min(len(ids), len(previous)) and ids[common] == previous[common]:
            common += 1
        if previous and common < len(previous):
            changes += 1
        cached += sum(counts[i] for i in ids[:common])
        sent += sum(counts[i] for i in ids)
        previous = ids
    return {
        "turns": turns,
        "prefix_changes": changes,
        "per_100_turns": 100 * changes / turns,
        "cached_share": cached / sent,
    }


def main(quick: bool = False) -> int:
    blocks = chat(100 if quick else 300)
    counts = dict(zip((b["id"] for b in blocks), contextshift.count_tokens(blocks, PROFILE), strict=True))
    contenders = {
        "keeps what it sent: target_ratio=1.0": contextshift_prompt(1.0),
        "keeps what it sent: target_ratio=0.8": contextshift_prompt(0.8),
        "keeps what it sent: LangChain trim_messages": langchain_prompt(counts),
    }
    rows = {name: replay(blocks, prompt, counts) for name, prompt in contenders.items()}
    with (
        tempfile.TemporaryDirectory() as tmp,
        serving(Path(tmp)) as server,
        contextshift.Client(server.address) as client,
    ):
        for cache_stable in (False, True):
            name = f"resends all, server, 0.8, cache_stable={'on' if cache_stable else 'off'}"
            prompt = server_prompt(client, f"replay-{cache_stable}", cache_stable)
            rows[name] = replay(blocks, prompt, counts, resend_all=True)
    width = max(len(name) for name in rows)
    print(
        f"{'contender':<{width}} {'turns':>6} {'prefix changes':>15} {'per 100 turns':>14} {'cached share':>13}"
    )
    for name, r in rows.items():
        print(
            f"{name:<{width}} {r['turns']:>6} {r['prefix_changes']:>15} {r['per_100_turns']:>14.1f} "
            f"{r['cached_share']:>13.1%}"
        )
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "hysteresis.json").write_text(
        json.dumps({"budget": BUDGET, "profile": PROFILE, "rows": rows}, indent=2)
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run: a 100-turn chat")
    raise SystemExit(main(parser.parse_args().quick))

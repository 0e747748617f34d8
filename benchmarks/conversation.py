"""Deterministic synthetic conversations for benchmarks: a system prompt, lorebook entries, then
chat history with tool calls (parallel calls, results not always adjacent) and some non-ASCII
text, so every part of the engine is exercised."""

from __future__ import annotations

import random
from typing import Any

WORDS = [
    *[
        "the",
        "chain",
        "shipped",
        "order",
        "courier",
        "parcel",
        "tubeless",
        "sealant",
        "wheel",
        "return",
        "receipt",
        "invoice",
    ],
    *[
        "refund",
        "saddle",
        "brake",
        "pad",
        "rotor",
        "cassette",
        "derailleur",
        "tyre",
        "pressure",
        "frame",
        "warranty",
    ],
    *["Lieferung", "Rückgabe", "配送", "返品", "注文", "🚲", "✅"],
]


def _text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def generate(n_blocks: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    blocks: list[dict[str, Any]] = [{"id": "sys", "role": "system", "content": _text(rng, 60, 120)}]
    for k in range(min(8, n_blocks // 20)):
        blocks.append({"id": f"lore{k}", "role": "system", "kind": "lorebook", "content": _text(rng, 20, 60)})
    call = 0
    pending: list[str] = []
    while len(blocks) < n_blocks:
        i = len(blocks)
        roll = rng.random()
        if pending and roll < 0.35:
            call_id = pending.pop(rng.randrange(len(pending)))
            blocks.append(
                {"id": f"b{i}", "role": "tool", "tool_call_id": call_id, "content": _text(rng, 10, 50)}
            )
        elif roll < 0.55:
            calls = []
            for _ in range(rng.randint(1, 3)):
                call += 1
                calls.append(
                    {
                        "id": f"call{call}",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": f'{{"q": "{rng.choice(WORDS)}"}}'},
                    }
                )
                pending.append(f"call{call}")
            blocks.append(
                {"id": f"b{i}", "role": "assistant", "content": _text(rng, 5, 20), "tool_calls": calls}
            )
        elif roll < 0.8:
            blocks.append({"id": f"b{i}", "role": "assistant", "content": _text(rng, 20, 80)})
        else:
            blocks.append({"id": f"b{i}", "role": "user", "content": _text(rng, 5, 40)})
    blocks.append({"id": "current", "role": "user", "content": _text(rng, 5, 30)})
    return blocks

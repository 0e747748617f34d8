"""Writes benchmarks/data/fact_chats.json: the corpus of the facts benchmark (facts.py).

Long support and engineering chats, generated from templates with a fixed seed (so the file is
reproducible and licence-clean), each with the list of facts it states: file paths, URLs, dates,
times, amounts, identifiers, numbers and code spans, each said once among ordinary turns without
facts. `python benchmarks/data/make_fact_chats.py` rewrites it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

CHATS = 8
TURNS = 160  # user and assistant turns in each chat
# Turns that state a fact: from sparse chats to dense ones, where 512 tokens get tight.
FACT_TURNS = [20, 28, 36, 44, 52, 60, 68, 76]

FILLER = [
    "Thanks, that helps a lot.",
    "Let me check on that and get back to you.",
    "Understood, I will look into it this afternoon.",
    "Could you explain that part again in simpler words?",
    "Sure, happy to walk through it once more.",
    "That sounds reasonable to me, let us go with it.",
    "I am not sure that is the root cause, but it is worth a try.",
    "Good point, I had not thought about the caching side of things.",
    "We discussed this with the team and nobody objected.",
    "Can we keep the old behaviour behind a flag for a while?",
    "Yes, and we should write down the decision somewhere visible.",
    "I will ping the on-call engineer and ask for a second opinion.",
    "The dashboard looked normal for most of the morning.",
    "Please keep me posted when you hear back from them.",
]

SERVICES = ["billing", "search", "checkout", "ledger", "gateway", "scheduler", "mailer", "reports"]
NAMES = ["parse_invoice", "retry_budget", "flush_queue", "load_settings", "merge_rows", "rotate_keys"]
CONSTS = ["MAX_RETRIES", "POOL_SIZE", "CACHE_TTL_SECONDS", "BATCH_LIMIT", "READ_TIMEOUT_MS"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "September", "October"]


def fact_sentence(rng: random.Random) -> tuple[str, str]:
    """A sentence stating one fact, and the fact."""
    service = rng.choice(SERVICES)
    kind = rng.randrange(11)
    if kind == 0:
        fact = f"/srv/{service}/config/{rng.choice(['settings', 'limits', 'routes'])}_{rng.randrange(10, 99)}.toml"
        return f"The setting lives in {fact} on every host.", fact
    if kind == 1:
        fact = f"https://runbooks.example.com/{service}/incident-{rng.randrange(100, 999)}"
        return f"The runbook for this is at {fact} if you need it.", fact
    if kind == 2:
        fact = f"2025-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
        return f"The migration is scheduled for {fact} after the freeze.", fact
    if kind == 3:
        fact = f"${rng.randrange(1, 90)},{rng.randrange(100, 999)}.{rng.randrange(10, 99)}"
        return f"The refund we approved comes to {fact} in total.", fact
    if kind == 4:
        fact = f"{service.upper()[:4]}-{rng.randrange(1000, 9999)}"
        return f"I filed it as {fact} so we can track the follow-up.", fact
    if kind == 5:
        fact = f"{rng.choice(CONSTS)}"
        value = rng.randrange(2, 500)
        return f"We raised {fact} to {value} in the last release.", fact
    if kind == 6:
        fact = f"`{rng.choice(['make', 'cargo', 'npm run', 'pytest -k'])} {rng.choice(NAMES)}`"
        return f"Run {fact} before you merge anything there.", fact[1:-1]
    if kind == 7:
        fact = "".join(rng.choice("0123456789abcdef") for _ in range(7)) + rng.choice("abcdef") + "1"
        return f"Commit {fact} is where the regression came in.", fact
    if kind == 8:
        fact = f"{rng.randrange(120, 990)} ms"
        return f"The p99 latency went up to {fact} during the spike.", fact
    if kind == 9:
        fact = f"{rng.choice(NAMES)}_v{rng.randrange(2, 9)}"
        return f"The function {fact} is the one that fails under load.", fact
    fact = f"{rng.choice(MONTHS)} {rng.randrange(1, 29)}, 2025"
    return f"The contract renews on {fact}, so we have some time.", fact


def chat(rng: random.Random, number: int) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        {"id": "system", "role": "system", "content": "You are a careful support engineer. Answer briefly."}
    ]
    fact_turns = set(rng.sample(range(TURNS - 10), FACT_TURNS[number]))  # none in the last turns
    facts = []
    for n in range(TURNS):
        text = " ".join(rng.sample(FILLER, rng.randrange(2, 5)))
        if n in fact_turns:
            sentence, fact = fact_sentence(rng)
            while fact in facts:
                sentence, fact = fact_sentence(rng)
            facts.append(fact)
            text = f"{rng.choice(FILLER)} {sentence} {rng.choice(FILLER)}"
        blocks.append({"id": f"t{n}", "role": "user" if n % 2 == 0 else "assistant", "content": text})
    blocks.append(
        {"id": "now", "role": "user", "content": "Can you remind me where we stand on all of this?"}
    )
    return {"name": f"chat-{number}", "blocks": blocks, "facts": facts}


def main() -> None:
    rng = random.Random(20261201)
    corpus = [chat(rng, n) for n in range(CHATS)]
    out = Path(__file__).with_name("fact_chats.json")
    out.write_text(json.dumps(corpus, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}: {CHATS} chats, {sum(len(c['facts']) for c in corpus)} facts")


if __name__ == "__main__":
    main()

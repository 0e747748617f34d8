"""Real-text benchmark: the facts a `summarize` shift keeps of what it leaves out, on chats and
agent loops made of text this project did not write (benchmarks/realtext/sources.py), with facts
counted by a definition of their own (benchmarks/realtext/facts.py).

Each chat is shifted with `summarize` (o200k_base, a budget of 30% of its tokens) at
`summary_max_tokens` 512 and at the default summary size. Retention is the share of the distinct
facts of the left-out blocks found verbatim in the final prompt (the summary and the kept
blocks). Beside it, in the same room (the summary's limit) and with the same kept blocks:
- `cut`: the most recent left-out text that fits (what truncate would have kept there);
- `first`: the first sentence of each left-out turn, newest first;
- `ceiling`: the left-out facts alone, verbatim, newest first ("; " between them).
Also: the plan's own `facts_kept / facts_total` beside the independent count; per fact kind; the
CVE ids, flags, versions, settings and dotted names of the left-out text the extractor
(contextshift.summarizer.facts) splits or misses; and agent loops' prompt tokens against their
budget (truncate and summarize).

The exit status is 1 when a figure falls below the one recorded in
benchmarks/data/realtext_figures.json (`--record` writes this run's), when the extractor splits
a fact of those kinds, or when an agent loop keeps less than half its budget.

    python -m benchmarks.realtext.bench [--quick] [--record]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

import contextshift  # noqa: E402
from benchmarks import strategies  # noqa: E402
from benchmarks.realtext import chats, facts, sources  # noqa: E402
from contextshift.strategies.summarize import default_summary_size  # noqa: E402
from contextshift.summarizer import facts as extractor  # noqa: E402

PROFILE = "o200k_base"
BUDGET_SHARE = 0.3
SUMMARY_TOKENS = 512
HEADER = "[Conversation summary]\n"
WHOLE_KINDS = ("cve", "flag", "version", "setting", "name")
FIGURES = ROOT / "benchmarks" / "data" / "realtext_figures.json"
QUICK_CHATS = (
    "coreutils-changelog",
    "cpython-news",
    "pyo3-changelog",
    "postgresql-changelog",
    "dpkg-deb-man-de",
    "apt-get-man-fr",
    "apt-cache-man-es",
)
QUICK_LOOPS = ("sbom-audit",)
METHODS = ("summarize", "cut", "first", "ceiling")


def text_of(block: Mapping[str, Any]) -> str:
    """A block's text as the prompt carries it: its content and its calls' arguments."""
    parts = [block["content"]] if isinstance(block.get("content"), str) else []
    parts += [c["function"]["arguments"] for c in block.get("tool_calls") or []]
    return "\n".join(parts)


def block_tokens(text: str) -> int:
    return contextshift.count_tokens([{"role": "system", "content": HEADER + text}], PROFILE)[0]


def longest_fitting(items: Sequence[str], join: Callable[[Sequence[str]], str], room: int) -> str:
    """`join` of the longest prefix of `items` whose block fits `room` tokens."""
    low, high = 0, len(items)
    while low < high:
        middle = (low + high + 1) // 2
        if block_tokens(join(items[:middle])) <= room:
            low = middle
        else:
            high = middle - 1
    return join(items[:low])


def cut_baseline(dropped: Sequence[str], room: int) -> str:
    """The most recent left-out text that fits: its lines, newest first, kept in order."""
    lines = "\n".join(dropped).split("\n")[::-1]
    return longest_fitting(lines, lambda chosen: "\n".join(reversed(chosen)), room)


_SENTENCE = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])")


def first_sentence_baseline(dropped: Sequence[str], room: int) -> str:
    firsts = [_SENTENCE.split(" ".join(text.split()), maxsplit=1)[0] for text in dropped if text.strip()]
    return longest_fitting(firsts[::-1], lambda chosen: "\n".join(reversed(chosen)), room)


def ceiling_baseline(dropped: Sequence[str], room: int) -> str:
    """The left-out facts, verbatim, newest first: the most facts a summary of this room holds."""
    last: dict[str, int] = {}
    for k, text in enumerate(dropped):
        for value in facts.distinct(text):
            last[value] = k
    newest_first = sorted(last, key=lambda v: -last[v])
    return longest_fitting(newest_first, "; ".join, room)


@dataclass
class Row:
    chat: str
    lang: str
    size: str  # "512" or "default"
    budget: int
    summary_tokens: int
    room: int
    facts: int
    kept: dict[str, int]  # method -> facts kept
    plan: tuple[int, int]  # the plan's facts_kept, facts_total
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> method/total -> n
    split: dict[str, list[str]] = field(default_factory=dict)  # kind -> values split or missed


def split_facts(dropped: Sequence[str]) -> dict[str, list[str]]:
    """The facts of WHOLE_KINDS that no extracted fact holds whole."""
    out: dict[str, list[str]] = defaultdict(list)
    for text in dropped:
        extracted = extractor.extract(text)
        for value, kind in facts.distinct(text).items():
            if kind in WHOLE_KINDS and not any(value in e for e in extracted):
                out[kind].append(value)
    return dict(out)


def measure(chat: chats.Chat, size: str, strategy: str = "summarize") -> Row:
    blocks = chat.blocks
    budget = int(sum(contextshift.count_tokens(blocks, PROFILE)) * BUDGET_SHARE)
    options = {"summary_max_tokens": SUMMARY_TOKENS} if size == "512" else None
    result = contextshift.shift_context(
        blocks, budget=budget, profile=PROFILE, strategy=strategy, options=options
    )
    summary = result.summary
    assert summary is not None, f"{chat.name}: no summary"
    by_id = {b["id"]: b for b in blocks}
    dropped = [text_of(by_id[d.id]) for d in result.excluded]
    kept = [text_of(by_id[d.id]) for d in result.kept if d.id != summary.id]
    # The room the summary had: what the plan left, at most its size (as the strategy sets it).
    cut = contextshift.shift_context(blocks, budget=budget, profile=PROFILE)
    left_out = sum(d.tokens for d in cut.excluded if d.reason != "ORPHAN_TOOL_RESULT")
    most = SUMMARY_TOKENS if size == "512" else default_summary_size(budget, left_out)
    room = min(result.budget - (result.prompt_tokens - summary.tokens), most)
    values: dict[str, str] = {}
    for text in dropped:
        values.update(facts.distinct(text))
    made = {
        "summarize": summary.text,
        "cut": cut_baseline(dropped, room),
        "first": first_sentence_baseline(dropped, room),
        "ceiling": ceiling_baseline(dropped, room),
    }
    found = {m: facts.kept(values, "\n\n".join([*kept, text])) for m, text in made.items()}
    by_kind: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for value, kind in values.items():
        by_kind[kind]["total"] += 1
        for method in METHODS:
            by_kind[kind][method] += value in found[method]
    return Row(
        chat.name,
        chat.lang,
        size,
        budget,
        summary.tokens,
        room,
        len(values),
        {m: len(f) for m, f in found.items()},
        (summary.facts_kept, summary.facts_total),
        {k: dict(v) for k, v in by_kind.items()},
        split_facts(dropped) if size == "512" else {},
    )


def share(rows: Sequence[Row], method: str) -> float:
    total = sum(r.facts for r in rows)
    return sum(r.kept[method] for r in rows) / total if total else 0.0


def plan_share(rows: Sequence[Row]) -> float:
    total = sum(r.plan[1] for r in rows)
    return sum(r.plan[0] for r in rows) / total if total else 0.0


@dataclass
class LoopRow:
    loop: str
    strategy: str
    budget: int
    prompt_tokens: int
    task_kept: bool


def measure_loop(loop: chats.Chat, strategy: str) -> LoopRow:
    budget = int(sum(contextshift.count_tokens(loop.blocks, PROFILE)) * BUDGET_SHARE)
    result = contextshift.shift_context(loop.blocks, budget=budget, profile=PROFILE, strategy=strategy)
    return LoopRow(
        loop.name, strategy, budget, result.prompt_tokens, any(d.id == "task" for d in result.kept)
    )


def print_rows(rows: Sequence[Row]) -> None:
    print(f"{'chat':<24} {'lang':<4} {'size':>7} {'budget':>6} {'room':>5} {'facts':>5}", end="")
    print("".join(f" {m:>9}" for m in METHODS) + f" {'plan says':>10}")
    for r in rows:
        cells = "".join(f" {r.kept[m] / r.facts if r.facts else 0:>9.0%}" for m in METHODS)
        plan = r.plan[0] / r.plan[1] if r.plan[1] else 0.0
        print(
            f"{r.chat:<24} {r.lang:<4} {r.size:>7} {r.budget:>6} {r.room:>5} {r.facts:>5}{cells} {plan:>10.0%}"
        )


def print_kinds(rows: Sequence[Row]) -> None:
    totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        for kind, counts in r.by_kind.items():
            for key, n in counts.items():
                totals[kind][key] += n
    print(f"{'kind':<10} {'facts':>6}" + "".join(f" {m:>9}" for m in METHODS))
    for kind, counts in sorted(totals.items(), key=lambda item: -item[1]["total"]):
        cells = "".join(f" {counts[m] / counts['total']:>9.0%}" for m in METHODS)
        print(f"{kind:<10} {counts['total']:>6}{cells}")


def figures(rows: Sequence[Row], loops: Sequence[LoopRow]) -> dict[str, float]:
    """The figures recorded and compared: retention by language group and size, the ceiling's,
    and the smallest share of its budget an agent loop keeps."""
    out: dict[str, float] = {}
    for size in ("512", "default"):
        for group in ("en", "other"):
            chosen = [r for r in rows if r.size == size and (r.lang == "en") == (group == "en")]
            out[f"{group}_{size}_retention"] = round(share(chosen, "summarize"), 4)
    out["loop_min_prompt_share"] = round(min((r.prompt_tokens / r.budget for r in loops), default=0.0), 4)
    return out


def verdicts(rows: Sequence[Row], loops: Sequence[LoopRow]) -> list[tuple[str, bool]]:
    """The issue's targets on this run, each a finding and whether it is met."""
    out = []
    for size in ("512", "default"):
        en = [r for r in rows if r.lang == "en" and r.size == size]
        other = [r for r in rows if r.lang != "en" and r.size == size]
        ratio = share(en, "summarize") / share(en, "ceiling") if share(en, "ceiling") else 0.0
        out.append(
            (
                f"English chats, size {size}: {share(en, 'summarize'):.1%} kept, {ratio:.0%} of the "
                f"verbatim-facts ceiling {share(en, 'ceiling'):.1%} (target >= 80% of it; cut "
                f"{share(en, 'cut'):.1%}, first sentences {share(en, 'first'):.1%})",
                ratio >= 0.8,
            )
        )
        out.append(
            (
                f"other languages, size {size}: {share(other, 'summarize'):.1%} of the left-out facts "
                f"kept (target >= 80%; ceiling {share(other, 'ceiling'):.1%}, cut {share(other, 'cut'):.1%})",
                share(other, "summarize") >= 0.8,
            )
        )
        for group, chosen in (("English", en), ("other languages", other)):
            gap = abs(plan_share(chosen) - share(chosen, "summarize"))
            out.append(
                (
                    f"{group}, size {size}: the plan says {plan_share(chosen):.1%}, the independent count "
                    f"{share(chosen, 'summarize'):.1%} (target: within 10 points)",
                    gap <= 0.10,
                )
            )
    splits = [(r.chat, kind, v) for r in rows for kind, values in r.split.items() for v in values]
    shown = ", ".join(f"{v} ({kind}, {chat})" for chat, kind, v in splits[:8])
    out.append(
        (
            f"CVE ids, flags, versions, settings, dotted names split or missed: {len(splits)} {shown}",
            not splits,
        )
    )
    for r in loops:
        out.append(
            (
                f"agent loop {r.loop} ({r.strategy}): {r.prompt_tokens} of {r.budget} tokens "
                f"({r.prompt_tokens / r.budget:.0%}; target >= 50%), task kept: {r.task_kept}",
                r.prompt_tokens * 2 >= r.budget,
            )
        )
    return out


def room_study(conversations: Sequence[chats.Chat]) -> None:
    """The summary's size against what the prompt keeps: of every fact of the history (all blocks
    but the system prompt and the current input), the share the final prompt holds, and the share
    of the budget left to verbatim history, by summary size (fixed, and the default)."""
    print(f"{'summary size':<14} {'history facts kept':>19} {'verbatim history':>17}")
    for size in (0, 128, 256, 384, 512, 768, 1024):
        kept = total = verbatim = budgets = 0
        for chat in conversations:
            blocks = chat.blocks
            budget = int(sum(contextshift.count_tokens(blocks, PROFILE)) * BUDGET_SHARE)
            options = {"summary_max_tokens": size} if size else None
            result = contextshift.shift_context(
                blocks, budget=budget, profile=PROFILE, strategy="summarize", options=options
            )
            values = {v for b in blocks[1:-1] for v in facts.distinct(text_of(b))}
            kept += len(facts.kept(values, "\n\n".join(text_of(m) for m in result.messages)))
            total += len(values)
            summary = result.summary.tokens if result.summary else 0
            protected = sum(d.tokens for d in result.kept if d.reason in {"PROTECTED_SYSTEM", "PINNED"})
            verbatim += result.prompt_tokens - summary - protected
            budgets += budget
        name = "default" if not size else str(size)
        print(f"{name:<14} {kept / total:>19.1%} {verbatim / budgets:>17.1%}")


def versus(conversations: Sequence[chats.Chat], revision: str, repeat: int = 5) -> None:
    """Today's `summarize` beside `summarize` at git `revision` on these chats, at
    summary_max_tokens 512: what each keeps (its own figures and the independent count), and its
    time (median of `repeat` runs each, in this process)."""
    old = strategies.baseline_summarize(revision)
    for name in ("summarize", old):
        rows = [measure(c, "512", name) for c in conversations]
        for group in ("en", "other"):
            chosen = [r for r in rows if (r.lang == "en") == (group == "en")]
            kept, ceiling = share(chosen, "summarize"), share(chosen, "ceiling")
            print(
                f"{name} {group}: {kept:.1%} kept ({kept / ceiling:.0%} of the ceiling {ceiling:.1%}), "
                f"the plan says {plan_share(chosen):.1%}"
            )
    options = {"summary_max_tokens": SUMMARY_TOKENS}
    now = before = 0.0
    for chat in conversations:
        budget = int(sum(contextshift.count_tokens(chat.blocks, PROFILE)) * BUDGET_SHARE)
        for name in ("summarize", old):
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                contextshift.shift_context(
                    chat.blocks, budget=budget, profile=PROFILE, strategy=name, options=options
                )
                times.append(time.perf_counter() - start)
            if name == old:
                before += statistics.median(times)
            else:
                now += statistics.median(times)
    verdict = "PASS" if now <= 2 * before else "FAIL"
    print(
        f"summarize on {len(conversations)} real-text chats: {now * 1e3:.1f} ms, {old}: {before * 1e3:.1f} ms, "
        f"{now / before:.2f}x (target <= 2x): {verdict}"
    )


def main(quick: bool = False, record: bool = False) -> int:
    """Runs the benchmark; nonzero when a figure falls below the recorded one, a fact is split,
    or an agent loop keeps less than half its budget (see the module's doc)."""
    try:
        picked = [s for s in sources.SOURCES if s.lang != "json" and (not quick or s.name in QUICK_CHATS)]
        conversations = [chats.chat(s) for s in picked]
        loops = [chats.loop(recipe) for recipe in chats.LOOPS if not quick or recipe.name in QUICK_LOOPS]
    except sources.CorpusError as error:
        print(f"real-text corpus: {error}: FAIL")
        return 1
    rows = [measure(c, size) for size in ("512", "default") for c in conversations]
    loop_rows = [measure_loop(loop, s) for loop in loops for s in ("truncate", "summarize")]
    print(f"Real text: {len(conversations)} chats, {len(loops)} agent loops, {PROFILE}, budget 30%")
    print_rows(rows)
    print()
    print_kinds([r for r in rows if r.size == "512"])
    print()
    found = verdicts(rows, loop_rows)
    for line, met in found:
        print(f"{line}: {'PASS' if met else 'FAIL'}")
    now = figures(rows, loop_rows)
    key = "quick" if quick else "full"
    recorded = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    status = int(any(not met for line, met in found if line.startswith(("CVE", "agent loop"))))
    for name, value in recorded.get(key, {}).items():
        if now.get(name, 0.0) < value:
            print(f"{name}: {now.get(name, 0.0):.4f} < recorded {value:.4f}: FAIL")
            status = 1
    if record:
        FIGURES.write_text(json.dumps({**recorded, key: now}, indent=2, sort_keys=True) + "\n")
        print(f"recorded {key} figures in {FIGURES}")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "realtext.json").write_text(
        json.dumps(
            {
                "rows": [asdict(r) for r in rows],
                "loops": [asdict(r) for r in loop_rows],
                "figures": now,
                "findings": [f"{line}: {'PASS' if met else 'FAIL'}" for line, met in found],
            },
            indent=2,
        )
    )
    return status


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run: a few chats and one loop")
    parser.add_argument("--record", action="store_true", help="write this run's figures as the reference")
    parser.add_argument("--room-study", action="store_true", help="only: facts kept by summary size")
    parser.add_argument("--baseline", help="only: summarize beside its own at this git revision")
    args = parser.parse_args()
    if args.room_study or args.baseline:
        every = [chats.chat(s) for s in sources.SOURCES if s.lang != "json"]
        room_study(every) if args.room_study else versus(every, args.baseline)
        raise SystemExit(0)
    raise SystemExit(main(args.quick, args.record))

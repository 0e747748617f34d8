"""Command line: serve the gRPC API, preview what a shift keeps and drops, and count tokens.

contextshift serve --port 50051
contextshift preview examples/support-chat.json --context-limit 8000 --response-reserve 2000
contextshift count examples/support-chat.json
contextshift bench-profiles [FILES... | -] [--profiles heuristic o200k_base] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from contextshift import engine
from contextshift.api import config
from contextshift.budget import Budget
from contextshift.engine import BlockDecision
from contextshift.errors import ContextShiftError, InvalidInput, TokenBudgetExceeded
from contextshift.profiles import list_profiles
from contextshift.shift import ShiftResult, shift_context


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different (`json` would keep the last of a repeated key,
    where a provider's parser may read the other value)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r} in a JSON object")
        seen[key] = value
    return seen


def load_blocks(path: Path) -> list[Any]:
    """A JSON list of blocks, or a request body holding one: `blocks`, `messages` (OpenAI chat,
    Anthropic, whose top-level `system` string becomes a system block) or `input` (Responses)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_refuse_repeated_keys)
    except ValueError as e:  # also json.JSONDecodeError
        raise SystemExit(f"{path}: {e}") from e
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        for key in ("blocks", "messages", "input"):
            if isinstance(data.get(key), list):
                blocks: list[Any] = list(data[key])
                if key == "messages" and isinstance(data.get("system"), str):
                    blocks.insert(0, {"role": "system", "content": data["system"]})
                return blocks
    raise SystemExit(f"{path}: expected a JSON list of blocks or an object with blocks/messages/input")


def _label(block: Any) -> str:
    if not isinstance(block, Mapping):
        return "?"
    role = block.get("role") or block.get("type") or "?"
    kind = block.get("kind")
    return f"{role}/{kind}" if kind else str(role)


def _preview_text(block: Any, width: int = 48) -> str:
    content = block.get("content") if isinstance(block, Mapping) else None
    if isinstance(content, list):
        content = " ".join(
            str(p.get("text", f"[{p.get('type')}]")) for p in content if isinstance(p, Mapping)
        )
    text = " ".join(str(content or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def render_table(blocks: Sequence[Any], result: ShiftResult) -> str:
    decisions = {d.id: ("kept", d) for d in result.kept} | {d.id: ("EXCLUDED", d) for d in result.excluded}
    rows = [("#", "id", "role/kind", "tokens", "decision", "reason", "text")]
    for index, block in enumerate(blocks):
        given = block.get("id") if isinstance(block, Mapping) else None
        block_id = given if isinstance(given, str) else f"#{index}"
        decision, entry = decisions[block_id]
        rows.append(
            (
                str(index),
                block_id,
                _label(block),
                str(entry.tokens),
                decision,
                entry.reason,
                _preview_text(block),
            )
        )
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    approx = " (approximate)" if result.approximate else ""
    lines.append("")
    lines.append(
        f"{len(result.kept)} kept, {len(result.excluded)} excluded, {len(result.truncated)} truncated; "
        f"prompt {result.prompt_tokens} of {result.budget} tokens, profile {result.profile}{approx}"
        + (f"; tool definitions {result.tools_tokens}" if result.tools_tokens else "")
    )
    lines.extend(f"warning: {w}" for w in result.warnings)
    return "\n".join(lines)


def _budget(args: argparse.Namespace) -> int | Budget:
    if args.budget is not None:
        return int(args.budget)
    return Budget(args.context_limit, args.response_reserve, args.system_reserve)


def _preview(args: argparse.Namespace) -> int:
    blocks = load_blocks(args.file)
    tools = args.tools.read_bytes() if args.tools else None  # JSON text, read by the core
    result = shift_context(
        blocks, budget=_budget(args), profile=args.profile, strategy=args.strategy, tools=tools
    )
    if args.json:
        print(json.dumps(_result_json(result), ensure_ascii=False, indent=2))
    else:
        print(render_table(blocks, result))
    return 0


def _result_json(result: ShiftResult) -> dict[str, Any]:
    return {
        "kept": [_decision_json(d) for d in result.kept],
        "excluded": [_decision_json(d) for d in result.excluded],
        "truncated": [dataclasses.asdict(t) for t in result.truncated],
        "prompt_tokens": result.prompt_tokens,
        "tools_tokens": result.tools_tokens,
        "budget": result.budget,
        "profile": result.profile,
        "approximate": result.approximate,
        "warnings": result.warnings,
        "messages": result.messages,
    }


def _decision_json(decision: BlockDecision) -> dict[str, Any]:
    return {"id": decision.id, "tokens": decision.tokens, "reason": decision.reason}


def _count(args: argparse.Namespace) -> int:
    items: list[Any] = [args.text] if args.text is not None else load_blocks(args.file)
    counts = engine.count_items(items, args.profile)
    for index, (item, tokens) in enumerate(zip(items, counts, strict=True)):
        label = "text" if isinstance(item, str) else _label(item)
        print(f"{index:>4}  {label:<18} {tokens:>8}")
    print(f"total {sum(counts)} tokens, profile {args.profile}")
    return 0


def _bench_profiles(args: argparse.Namespace) -> int:
    from contextshift import profile_bench

    if not args.files:
        data = profile_bench.sample_corpus()
    else:
        documents = (
            ("-", sys.stdin.buffer.read()) if str(path) == "-" else (str(path), path.read_bytes())
            for path in args.files
        )
        data = profile_bench.corpus(documents)
    report = profile_bench.run(data, args.profiles)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print_bench_report(report)
    return 0


def _print_bench_report(report: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    speed = Table(
        title=f"Counting throughput: {report.messages} messages, {report.bytes / 1000:.1f} kB "
        f"from {report.documents} documents (count cache bypassed)"
    )
    for column in ("profile", "approximate", "tokens", "1 thread MB/s", "batch MB/s"):
        speed.add_column(column, justify="left" if column == "profile" else "right")
    for t in report.throughput:
        approx = "yes" if t.approximate else "no"
        speed.add_row(
            t.profile, approx, str(t.tokens), f"{t.single_thread_mb_per_s:.1f}", f"{t.batch_mb_per_s:.1f}"
        )
    console.print(speed)
    errors = Table(title="Approximate profiles against exact ones (text tokens per message)")
    for column in ("profile", "against", "messages", "mean |error|", "p95 |error|", "total drift"):
        errors.add_column(column, justify="left" if column in {"profile", "against"} else "right")
    for a in report.accuracy:
        errors.add_row(
            a.profile,
            a.reference,
            str(a.messages),
            f"{a.mean_relative_error:.1%}",
            f"{a.p95_relative_error:.1%}",
            f"{a.total_drift:+.1%}",
        )
    console.print(errors)
    compared = {a.profile for a in report.accuracy}
    for t in report.throughput:
        if t.approximate and t.profile not in compared:
            console.print(f"{t.profile}: no exact profile of its family to compare with")
    for name, why in report.skipped.items():
        console.print(f"skipped {name}: {why}")


def _serve(args: argparse.Namespace) -> int:
    from contextshift.api import server  # grpc is loaded only to serve

    try:
        settings = config.load(vars(args), config_file=args.config)
    except config.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return server.run(settings)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="contextshift", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    profile_names = [p.name for p in list_profiles()]

    serve = sub.add_parser(
        "serve", help="serve the gRPC API (settings: flags > environment > --config TOML > defaults)"
    )
    config.add_flags(serve)
    serve.set_defaults(run=_serve)

    preview = sub.add_parser("preview", help="show what a shift of a conversation file keeps and excludes")
    preview.add_argument("file", type=Path)
    preview.add_argument("--budget", type=int, help="token budget, used as is (overrides the window flags)")
    preview.add_argument("--context-limit", type=int, default=128_000)
    preview.add_argument("--response-reserve", type=int, default=0)
    preview.add_argument("--system-reserve", type=int, default=0)
    preview.add_argument("--profile", default="heuristic", choices=profile_names)
    preview.add_argument("--strategy", default="truncate")
    preview.add_argument(
        "--tools", type=Path, help="a JSON array of the tool definitions the prompt is sent with"
    )
    preview.add_argument("--json", action="store_true", help="print the full result as JSON")
    preview.set_defaults(run=_preview)

    count = sub.add_parser("count", help="count tokens of each block in a file, or of --text")
    source = count.add_mutually_exclusive_group(required=True)
    source.add_argument("file", type=Path, nargs="?")
    source.add_argument("--text")
    count.add_argument("--profile", default="heuristic", choices=profile_names)
    count.set_defaults(run=_count)

    bench = sub.add_parser(
        "bench-profiles",
        help="measure every profile on a corpus: throughput, and each approximate profile's error",
    )
    bench.add_argument(
        "files",
        type=Path,
        nargs="*",
        help="chat JSON (any supported shape) or text files, - for stdin; none: the shipped sample corpus",
    )
    bench.add_argument(
        "--profiles", nargs="+", help="profile or model names (default: every built-in profile)"
    )
    bench.add_argument("--json", action="store_true", help="print the report as JSON")
    bench.set_defaults(run=_bench_profiles)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except TokenBudgetExceeded as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except InvalidInput as e:
        for v in e.violations:
            print(f"error: {v.field}: {v.description}", file=sys.stderr)
        return 2
    except ContextShiftError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return code

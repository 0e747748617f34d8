"""Command line: serve the API, preview what a shift keeps and drops (here or on a server), show a
chat's last audit or list the chats, count tokens, and measure the tokenizer profiles.

contextshift serve --port 50051 --http-port 8080
contextshift preview examples/support-chat.json --budget 300 [--server 127.0.0.1:50051]
contextshift audit CHAT_ID --server 127.0.0.1:50051
contextshift chats --server 127.0.0.1:50051 [--page-size N] [--page-token T]
contextshift count examples/support-chat.json other.json   (or - for stdin)
contextshift bench-profiles [FILES... | -] [--profiles heuristic o200k_base] [--json]
contextshift store check | backup PATH | restore BACKUP [--store URL]

Tables are coloured by decision when the output is a terminal, plain when piped; what takes about a
second or more (a long table, a large input) shows progress on stderr (a terminal only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from contextshift import engine, request_body
from contextshift.api import config
from contextshift.audit.store import StoreConfigError, StoreError
from contextshift.budget import Budget
from contextshift.engine import BlockDecision
from contextshift.errors import ContextShiftError, InvalidInput, TokenBudgetExceeded
from contextshift.profiles import resolve_request
from contextshift.result import ShiftResult, Truncation
from contextshift.shift import shift_context

if TYPE_CHECKING:
    import grpc

    from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
    from contextshift.audit import maintenance
    from contextshift.client import Client, ServiceError

API_KEY_ENV = "CONTEXTSHIFT_API_KEY"
# Measured on 2 cores: reading, parsing and counting (or shifting) 8 MiB of JSON takes about 0.15 s
# with o200k_base, 64 MiB about a second; such inputs show progress on a terminal.
PROGRESS_BYTES = 64 * 1024 * 1024
# Measured likewise: rich renders a decision table at about 400 to 700 rows a second, so printing
# a table of this many rows takes about a second; it shows progress on a terminal.
PROGRESS_ROWS = 500
TABLE_CHUNK = 100  # rows rendered per step of the progress bar
PREVIEW_CHARS = 1_000  # of a block's text, before its whitespace is collapsed for the table
COUNT_BATCH = 2_000  # items counted per step of the progress bar
MAX_COUNT_ROWS = 10_000  # more blocks than this in a file: its total only (all counts with --json)
STYLES = {"kept": "green", "excluded": "red", "summary": "blue", "truncated": "yellow"}


def stdout() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 160)  # a pipe or a file: no wrapping at 80 columns
    return console


def stderr() -> Console:
    return Console(stderr=True, highlight=False)


# --- input ------------------------------------------------------------------------------------


class UsageError(Exception):
    """Input the command cannot read, or flags it cannot use: exit code 2, as argparse's own."""


def read_text(source: str) -> str:
    """A file's text, or stdin's for `-`."""
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{source}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{source}: not UTF-8 text: {e}") from None


def _read_bytes(path: Path) -> bytes:
    """A file's bytes, or stdin's for `-`."""
    if str(path) == "-":
        return sys.stdin.buffer.read()
    try:
        return path.read_bytes()
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e}") from None


def load_blocks(text: str, source: str) -> list[Any]:
    """The blocks of a file (`request_body`: a JSON list of blocks, or a request body holding one)."""
    try:
        data = request_body.parse_json(text)
    except ValueError as e:
        raise UsageError(f"{source}: not JSON: {e}") from None
    blocks = request_body.blocks_in(data)
    if blocks is None:
        raise UsageError(f"{source}: expected a JSON list of blocks or an object with blocks/messages/input")
    return blocks


def _waiting(what: str, size: int) -> AbstractContextManager[Any]:
    """A spinner on stderr while a large input is worked on (a terminal only): a parse or a shift
    says nothing of how far it is."""
    console = stderr()
    if size < PROGRESS_BYTES or not console.is_terminal:
        return nullcontext()
    return console.status(what)


def _progress(what: str, size: int, threshold: int) -> Progress:
    """A bar on stderr, transient, for a task of `size` steps (a terminal only, from `threshold`)."""
    console = stderr()
    return Progress(
        TextColumn(what),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=size < threshold or not console.is_terminal,
        transient=True,
        # Nothing is printed while it runs; rich would send stdout to the bar's console (stderr).
        redirect_stdout=False,
        redirect_stderr=False,
    )


# --- tables -----------------------------------------------------------------------------------


def _label(block: Any) -> tuple[str, str]:
    if not isinstance(block, Mapping):
        return "?", ""
    return str(block.get("role") or block.get("type") or "?"), str(block.get("kind") or "")


def _preview_text(block: Any) -> str:
    content = block.get("content") if isinstance(block, Mapping) else None
    if isinstance(content, list):
        content = " ".join(
            str(p.get("text", f"[{p.get('type')}]")) for p in content if isinstance(p, Mapping)
        )
    # The table shows 48 cells of it: measuring a megabyte of text per row would take seconds.
    return " ".join(str(content or "")[:PREVIEW_CHARS].split())


@dataclasses.dataclass(frozen=True)
class Row:
    id: str
    tokens: int | None
    decision: str
    reason: str
    # What the input block says; an audit records none of them (only ids, tokens and reasons).
    role: str = ""
    kind: str = ""
    text: str = ""


@dataclasses.dataclass(frozen=True)
class Column:
    header: str
    right: bool = False  # numbers
    max_width: int | None = None  # longer cells end in an ellipsis


def print_table(
    console: Console,
    columns: Sequence[Column],
    rows: Sequence[tuple[Sequence[str], str | None]],
    title: str | None = None,
) -> None:
    """`rows` (cells, style) as one table on `console`. Rendering is the slow part of a large table
    (rich measures and lays out every cell), so it is rendered in chunks of TABLE_CHUNK rows with a
    progress bar on stderr, then written at once; the columns get fixed widths, the widest cell's,
    so the chunks line up as one table."""
    widths = [
        min(max([cell_len(col.header), *(cell_len(cells[k]) for cells, _ in rows)]), col.max_width or 10**9)
        for k, col in enumerate(columns)
    ]
    rendered: list[str] = []
    with _progress("printing rows", len(rows), PROGRESS_ROWS) as progress:
        task = progress.add_task("print", total=len(rows))
        for start in range(0, max(len(rows), 1), TABLE_CHUNK):
            first = start == 0
            table = Table(
                box=box.SIMPLE,
                pad_edge=False,
                show_edge=False,
                show_header=first,
                title=title if first else None,
                title_justify="left",
            )
            for col, width in zip(columns, widths, strict=True):
                justify: Literal["left", "right"] = "right" if col.right else "left"
                table.add_column(col.header, justify=justify, no_wrap=True, overflow="ellipsis", width=width)
            chunk = rows[start : start + TABLE_CHUNK]
            for cells, style in chunk:
                table.add_row(*map(Text, cells), style=style)  # text as is, never rich markup
            with console.capture() as captured:
                console.print(table)
            rendered.append(captured.get())
            progress.advance(task, len(chunk))
    console.file.write("".join(rendered))
    console.file.flush()


def print_decisions(console: Console, rows: Sequence[Row], *, content: bool = True) -> None:
    """The rows in order, coloured by decision; without `content`, no role, kind or text columns."""
    columns = [Column("#", right=True), Column("id")]
    if content:
        columns += [Column("role"), Column("kind")]
    columns += [Column("tokens", right=True), Column("decision"), Column("reason")]
    if content:
        columns.append(Column("text", max_width=48))
    cells = []
    for index, row in enumerate(rows):
        tokens = "" if row.tokens is None else str(row.tokens)
        described = [row.role, row.kind or "-"] if content else []
        text = [row.text] if content else []
        cells.append(
            (
                [str(index), row.id, *described, tokens, row.decision, row.reason, *text],
                STYLES.get(row.decision),
            )
        )
    print_table(console, columns, cells)


def _cut(decision: str, reason: str, cut: Truncation | pb.Truncation | None) -> tuple[str, str]:
    """A block's decision and reason, saying how its text was cut, if it was."""
    if cut is None:
        return decision, reason
    return "truncated", f"{reason}, cut {cut.tokens_before}->{cut.tokens_after} ({cut.how})"


def plan_rows(blocks: Sequence[Any], result: ShiftResult) -> list[Row]:
    """The input blocks in order with their decisions; a block the shift added (a summary) comes
    before the kept block it precedes."""
    decisions: dict[str, tuple[str, BlockDecision]] = {d.id: ("kept", d) for d in result.kept}
    decisions |= {d.id: ("excluded", d) for d in result.excluded}
    cuts = {t.id: t for t in result.truncated}
    rows = []
    for index, block in enumerate(blocks):
        given = block.get("id") if isinstance(block, Mapping) else None
        block_id = given if isinstance(given, str) else f"#{index}"
        decided, entry = decisions[block_id]
        decision, reason = _cut(decided, entry.reason, cuts.get(block_id))
        role, kind = _label(block)
        rows.append(Row(block_id, entry.tokens, decision, reason, role, kind, _preview_text(block)))
    given_ids = {row.id for row in rows}
    for at, added in enumerate(result.kept):
        if added.id in given_ids:
            continue
        following = next((k.id for k in result.kept[at + 1 :] if k.id in given_ids), None)
        position = next((i for i, row in enumerate(rows) if row.id == following), len(rows))
        rows.insert(position, Row(added.id, added.tokens, "summary", added.reason, "system", "summary"))
    return rows


def plan_summary(result: ShiftResult) -> str:
    approx = " (approximate)" if result.approximate else ""
    return (
        f"{len(result.kept)} kept, {len(result.excluded)} excluded, {len(result.truncated)} truncated; "
        f"prompt {result.prompt_tokens} of {result.budget} tokens, profile {result.profile}{approx}"
        + (f"; tool definitions {result.tools_tokens}" if result.tools_tokens else "")
    )


# --- the server -------------------------------------------------------------------------------


def _channel(args: argparse.Namespace) -> grpc.Channel:
    import grpc  # loaded only to talk to a server

    if args.tls_ca is None and args.tls_cert is None:
        return grpc.insecure_channel(args.server)
    files = [
        None if path is None else Path(path).read_bytes()
        for path in (args.tls_ca, args.tls_key, args.tls_cert)
    ]
    return grpc.secure_channel(args.server, grpc.ssl_channel_credentials(*files))


def _api_key(args: argparse.Namespace) -> str | None:
    key: str | None = args.api_key or os.environ.get(API_KEY_ENV)
    return key


class ServerFailed(Exception):
    """A call to the server failed other than with an error of the library (exit code 1)."""

    def __init__(self, error: ServiceError, what: str) -> None:
        code, details = error.code().name, error.details()
        if code == "UNIMPLEMENTED":
            message = f"the server cannot {what} yet: {details}"
        elif code == "UNAUTHENTICATED":
            message = f"{details} (give --api-key or ${API_KEY_ENV})"
        else:
            message = f"{code}: {details}"
        super().__init__(message)


def _client(args: argparse.Namespace) -> Client:
    from contextshift.client import Client  # grpc is loaded only to talk to a server

    return Client(channel=_channel(args), api_key=_api_key(args))


# --- commands ---------------------------------------------------------------------------------


def _budget(args: argparse.Namespace) -> int | Budget:
    """--budget as is, else the window flags given: the figures left out resolve in the library
    (or on the server) as docs/design.md says."""
    if args.budget is not None:
        return int(args.budget)
    return Budget(args.context_limit, args.response_reserve, args.system_reserve)


def _options(args: argparse.Namespace) -> dict[str, Any] | None:
    """`--option KEY=VALUE` flags as the shift's options: a VALUE that is JSON (a number, true,
    a list) is that value, any other is a string."""
    options: dict[str, Any] = {}
    for given in args.option:
        key, sep, value = given.partition("=")
        if not sep or not key:
            raise UsageError(f"--option {given!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options or None


def _tools(args: argparse.Namespace) -> bytes | None:
    """The --tools file's JSON text, read by the core (or the server)."""
    return None if args.tools is None else _read_bytes(Path(args.tools))


def _shift(args: argparse.Namespace, blocks: list[Any]) -> ShiftResult:
    if args.server is None:
        return shift_context(
            blocks,
            budget=_budget(args),
            profile=args.profile,
            strategy=args.strategy,
            model=args.model,
            options=_options(args),
            tools=_tools(args),
        )
    from contextshift.client import ServiceError

    with _client(args) as client:
        try:
            return client.preview_context(
                blocks,
                budget=_budget(args),
                profile=args.profile or "",
                strategy=args.strategy,
                model=args.model or "",
                options=_options(args),
                tools=_tools(args),
                timeout=600,
            )
        except ServiceError as error:  # what the client does not raise as the library's errors
            raise ServerFailed(error, "preview") from error


def _preview(args: argparse.Namespace) -> int:
    text = read_text(args.file)
    with _waiting(f"shifting {len(text) / 2**20:.0f} MiB", len(text)):
        blocks = load_blocks(text, args.file)
        result = _shift(args, blocks)
    console = stdout()
    if args.json:
        console.print_json(json.dumps(_result_json(result), ensure_ascii=False))
        return 0
    print_decisions(console, plan_rows(blocks, result))
    console.print(plan_summary(result))
    for warning in result.warnings:
        console.print(Text(f"warning: {warning}", style="yellow"))
    for d in result.diagnostics:
        console.print(Text(f"{d.source}: {d.event}: {d.detail}", style="blue"))
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
        "diagnostics": [dataclasses.asdict(d) for d in result.diagnostics],
        "messages": result.messages,
    }


def _decision_json(decision: BlockDecision) -> dict[str, Any]:
    return {"id": decision.id, "tokens": decision.tokens, "reason": decision.reason}


def audit_rows(audit: pb.ContextAudit) -> list[Row]:
    """The audit's blocks in the prompt's order (its summary block where it was sent), each cut
    block with its truncation from the audit's plan."""
    cuts = {t.id: t for t in audit.plan.truncated}
    summary = audit.plan.summary.id if audit.plan.HasField("summary") else None
    rows = []
    for block in audit.blocks:
        decided = "summary" if block.id == summary else "kept" if block.kept else "excluded"
        decision, reason = _cut(decided, block.reason, cuts.get(block.id))
        rows.append(Row(block.id, block.tokens, decision, reason))
    return rows


def _audit(args: argparse.Namespace) -> int:
    from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
    from contextshift.client import ServiceError

    with _client(args) as client:
        try:
            audit = client.get_context_audit(args.chat_id, timeout=30)
        except ServiceError as error:
            raise ServerFailed(error, "show audits") from error
    plan = audit.plan
    console = stdout()
    print_decisions(console, audit_rows(audit), content=False)
    kept = sum(b.kept for b in audit.blocks)
    approx = " (approximate)" if plan.approximate else ""
    console.print(
        f"chat {audit.chat_id}, generation {audit.generation_id}: {kept} kept, {len(audit.blocks) - kept} "
        f"excluded, {len(plan.truncated)} truncated; prompt {plan.prompt_tokens} of {plan.budget} tokens, "
        f"profile {plan.profile}{approx}; "
        f"{' '.join(filter(None, [audit.provider, audit.model])) or 'no provider'}; "
        f"status {pb.GenerationStatus.Name(audit.status)}"
    )
    for warning in plan.warnings:
        console.print(Text(f"warning: {warning}", style="yellow"))
    for d in plan.diagnostics:
        console.print(Text(f"{d.source}: {d.event}: {d.detail}", style="blue"))
    return 0


def _chats(args: argparse.Namespace) -> int:
    from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
    from contextshift.client import ServiceError

    with _client(args) as client:
        try:
            page = client.list_chats(args.page_size, args.page_token, timeout=30)
        except ServiceError as error:
            raise ServerFailed(error, "list chats") from error
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("chat id", "status", "model", "prompt tokens", "kept / excluded", "shifted (UTC)"):
        table.add_column(column, justify="right" if column == "prompt tokens" else "left")
    for chat in page.chats:
        status = pb.GenerationStatus.Name(chat.status).removeprefix("GENERATION_STATUS_").lower()
        if chat.provider_error_code:
            code = pb.ProviderErrorCode.Name(chat.provider_error_code).removeprefix("PROVIDER_ERROR_CODE_")
            status += f" ({code.lower().replace('_', ' ')})"
        known = chat.HasField("kept_count")  # unknown: audited before the store kept the counts
        counts = f"{chat.kept_count} / {chat.excluded_count}" if known else "? / ?"
        shifted = chat.create_time.ToDatetime().isoformat(sep=" ", timespec="seconds")
        table.add_row(chat.chat_id, status, chat.model, str(chat.prompt_tokens), counts, shifted)
    console = stdout()
    console.print(table if page.chats else "no chat has an audit")
    if page.next_page_token:
        console.print(f"more: --page-token {page.next_page_token}")
    return 0


def _batches(items: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), COUNT_BATCH):
        yield items[start : start + COUNT_BATCH]


def _count(args: argparse.Namespace) -> int:
    resolution = resolve_request(args.profile, args.model)
    profile = resolution.profile
    inputs: list[tuple[str, list[Any]]] = [("--text", [args.text])] if args.text is not None else []
    texts = [(source, read_text(source)) for source in args.files]
    size = sum(len(text) for _, text in texts)
    with _waiting(f"reading {size / 2**20:.0f} MiB", size):
        inputs += [(source, load_blocks(text, source)) for source, text in texts]
    console = stdout()
    counted: list[tuple[str, list[Any], list[int]]] = []
    with _progress("counting", size, PROGRESS_BYTES) as progress:
        task = progress.add_task("count", total=sum(len(items) for _, items in inputs))
        for source, items in inputs:
            counts: list[int] = []
            for batch in _batches(items):
                counts += engine.count_items(batch, profile, resolution.reasoning)
                progress.advance(task, len(batch))
            counted.append((source, items, counts))
    if args.json:
        console.print_json(json.dumps({"profile": profile, "files": {s: c for s, _, c in counted}}))
        return 0
    for source, items, counts in counted:
        if len(items) <= MAX_COUNT_ROWS:
            rows = []
            for index, (item, tokens) in enumerate(zip(items, counts, strict=True)):
                role, kind = ("text", "") if isinstance(item, str) else _label(item)
                rows.append(([str(index), role, kind or "-", str(tokens)], None))
            columns = [Column("#", right=True), Column("role"), Column("kind"), Column("tokens", right=True)]
            print_table(console, columns, rows, title=source)
        console.print(
            f"{source}: {len(items)} {'texts' if args.text is not None else 'blocks'}, {sum(counts)} tokens"
        )
    console.print(f"total {sum(sum(c) for _, _, c in counted)} tokens, profile {profile}")
    return 0


def _bench_profiles(args: argparse.Namespace) -> int:
    from contextshift import profile_bench

    if not args.files:
        data = profile_bench.sample_corpus()
    else:
        data = profile_bench.corpus((str(path), _read_bytes(path)) for path in args.files)
    report = profile_bench.run(data, args.profiles)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print_bench_report(report)
    return 0


def _print_bench_report(report: Any) -> None:
    console = stdout()
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
        return server.run(config.load(vars(args), config_file=args.config))
    except config.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _store(args: argparse.Namespace) -> int:
    """`contextshift store check | backup PATH | restore BACKUP` on the store the settings name."""
    from contextshift.audit import maintenance, open_store

    try:
        url = config.load({"store": args.store}, config_file=args.config).store
        store = open_store(url, pool_size=1)
    except (config.ConfigError, StoreConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    copied = None
    try:
        if args.store_command == "backup":
            copied = maintenance.backup(store, args.path)
        elif args.store_command == "restore":
            copied = maintenance.restore(store, args.path, overwrite=args.overwrite)
        checked = copied.checked if copied else maintenance.check(store)
    except StoreError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        store.close()
    if args.json:
        print(json.dumps(copied.as_json() if copied else checked.as_json(), indent=2))
    else:
        _print_checked(checked, copied)
    return 0 if checked.ok else 1


def _print_checked(checked: maintenance.Checked, copied: maintenance.Copied | None) -> None:
    console = stdout()
    if copied is not None:
        console.print(f"copied to {copied.path}: {copied.bytes / 2**20:.1f} MiB in {copied.seconds:.2f} s")
    console.print(f"store: {checked.store}")
    console.print(f"schema: version {checked.schema_version} (this contextshift: {checked.latest_schema})")
    if checked.chats is not None and checked.data_bytes is not None:
        console.print(f"chats: {checked.chats}; data: {checked.data_bytes / 2**20:.1f} MiB")
    if checked.disk_free_bytes is not None:
        console.print(f"free on its disk: {checked.disk_free_bytes / 2**20:.1f} MiB")
    for problem in checked.problems:
        console.print(f"problem: {problem}", style="red")
    console.print("ok" if checked.ok else f"{len(checked.problems)} problems")


def _add_server_flags(parser: argparse.ArgumentParser, *, required: bool) -> None:
    server = "required" if required else "default: none, the local engine"
    parser.add_argument(
        "--server",
        required=required,
        metavar="HOST:PORT",
        help=f"ask this contextshift server (gRPC; {server})",
    )
    parser.add_argument("--api-key", help=f"the server's API key (default ${API_KEY_ENV})")
    parser.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="connect with TLS, trusting these CA certificates (PEM; default: none, plaintext)",
    )
    parser.add_argument(
        "--tls-cert", metavar="FILE", help="client certificate for mutual TLS (PEM; default: none)"
    )
    parser.add_argument("--tls-key", metavar="FILE", help="the client certificate's key (PEM; default: none)")


SERVE_EPILOG = (
    "Settings: a flag wins over its environment variable, which wins over the --config TOML file "
    "(keys: the setting names, e.g. http_port = 8080), which wins over the default. "
    "Health (gRPC health, /healthz, /readyz), reflection, /metrics, /openapi.json and the page need no API key."
)
DESCRIPTION = (
    "Fit an LLM prompt into a model's context window: serve the gRPC and HTTP APIs, preview what a "
    "shift keeps and drops (here or on a server), show a chat's last audit, count tokens, and "
    "measure the tokenizer profiles. `contextshift COMMAND --help` tells more."
)
EXIT_CODES = (
    "Exit codes: 0 done; 1 a server or internal error; 2 invalid input or usage (a file that is not "
    "JSON, a bad flag or option); 3 the protected blocks alone exceed the budget."
)
FILES = (
    "FILE is a JSON list of blocks (OpenAI chat or Responses, Anthropic, Vercel AI SDK, contextshift's "
    "own), or a request body holding one (messages, with Anthropic's top-level system; input; blocks)."
)
WINDOW = (
    "Without --budget the window resolves as the server's does (docs/design.md, Budget): each of "
    "--context-limit and --response-reserve not given comes from LLM_CONTEXT_SIZE / "
    "LLM_MAX_OUTPUT_TOKENS, then the model registry (--model), then 128000 / 64000; a reserve not "
    "given never takes more than a quarter of a --context-limit given. With --server, what is not "
    "given is left to the server (its model configurations come first)."
)


def _command(
    sub: Any, name: str, summary: str, description: str, epilog: str = EXIT_CODES
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=summary, description=f"{summary[0].upper()}{summary[1:]}. {description}", epilog=epilog
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="contextshift", description=DESCRIPTION, epilog=EXIT_CODES)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = _command(
        sub,
        "serve",
        "serve the gRPC and HTTP/JSON APIs, the preview page and /metrics until SIGTERM or Ctrl-C",
        "Runs contextshift.v1.ContextShiftService (with gRPC health and reflection) and its HTTP/JSON "
        "surface in the same processes.",
        epilog=SERVE_EPILOG,
    )
    config.add_flags(serve)
    serve.set_defaults(run=_serve)

    preview = _command(
        sub,
        "preview",
        "show what a shift of a conversation keeps, excludes and cuts, block by block",
        f"Shifts on the local engine, or with --server on a running server (writing nothing there). {FILES} "
        f"{WINDOW}",
    )
    preview.add_argument("file", metavar="FILE", help="a conversation file, or - for stdin")
    preview.add_argument(
        "--budget", type=int, help="token budget, used as is (overrides the window flags; default: none)"
    )
    preview.add_argument(
        "--context-limit", type=int, help="context window (default: see above; 128000 at the end)"
    )
    preview.add_argument(
        "--response-reserve",
        type=int,
        help="tokens kept for the answer (default: see above; 64000 at the end, at most a quarter of "
        "--context-limit)",
    )
    preview.add_argument(
        "--system-reserve", type=int, help="tokens kept for a system prompt not sent (default 0)"
    )
    preview.add_argument(
        "--profile",
        help="tokenizer profile or registered model (default: the model's, else heuristic)",
    )
    preview.add_argument(
        "--model", help="the model, e.g. gpt-4o: picks the profile and the window (default: none)"
    )
    preview.add_argument("--strategy", default="truncate", help="the strategy (default truncate)")
    preview.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='a shift option, repeatable (VALUE as JSON when it parses: 256, true, ["a"]), e.g. '
        "--option target_ratio=0.8 --option summary_max_tokens=256 (default: none)",
    )
    preview.add_argument(
        "--tools",
        type=Path,
        help="a JSON array of the tool definitions the prompt is sent with, or - for stdin (default: none)",
    )
    preview.add_argument("--json", action="store_true", help="print the full result as JSON")
    _add_server_flags(preview, required=False)
    preview.set_defaults(run=_preview)

    audit = _command(
        sub,
        "audit",
        "show a chat's last audit from a server",
        "Prints every block of the chat's last prompt in order with its tokens, decision and reason, "
        "the cut blocks, the summary where it was sent, and the plan's warnings and diagnostics; a "
        "chat without an audit exits 1.",
    )
    audit.add_argument(
        "chat_id", metavar="CHAT_ID", help="the chat whose last audit to show (the chat_id its shifts named)"
    )
    _add_server_flags(audit, required=True)
    audit.set_defaults(run=_audit)

    chats = _command(
        sub,
        "chats",
        "list a server's chats with an audit, newest first",
        "Prints a page of the chats (ListChats): each chat's last status, model, prompt tokens, kept "
        "and excluded blocks and when it was shifted, then the token of the next page, if any.",
    )
    chats.add_argument(
        "--page-size", type=int, default=0, help="chats per page (default 0: 50; at most 1000)"
    )
    chats.add_argument(
        "--page-token", default="", help="the next page's token a listing printed (default: none)"
    )
    _add_server_flags(chats, required=True)
    chats.set_defaults(run=_chats)

    count = _command(
        sub,
        "count",
        "count the tokens of each block of conversation files (or stdin), or of --text",
        f"{FILES} Each block counts with its message overhead; --text counts the text alone.",
    )
    count.add_argument("files", metavar="FILE", nargs="*", help="conversation files, or - for stdin")
    count.add_argument("--text", help="count this text instead of files (default: none)")
    count.add_argument(
        "--profile", help="tokenizer profile or registered model (default: the model's, else heuristic)"
    )
    count.add_argument(
        "--model", help="the model whose tokenizer counts, when --profile is not given (default: none)"
    )
    count.add_argument("--json", action="store_true", help="print every count as JSON")
    count.set_defaults(run=_count)

    bench = _command(
        sub,
        "bench-profiles",
        "measure every tokenizer profile on a corpus: throughput, and each approximate profile's error",
        "Counts the corpus with each profile (count cache bypassed, best of up to 5 runs in about "
        "10 s) and compares each approximate profile with the exact ones of its family.",
    )
    bench.add_argument(
        "files",
        type=Path,
        nargs="*",
        metavar="FILE",
        help="chat JSON (any supported shape) or text files, - for stdin (default: the shipped sample corpus)",
    )
    bench.add_argument(
        "--profiles", nargs="+", help="profile or model names (default: every built-in profile)"
    )
    bench.add_argument("--json", action="store_true", help="print the report as JSON")
    bench.set_defaults(run=_bench_profiles)

    store = _command(
        sub,
        "store",
        "check the store, or back up and restore a SQLite one",
        "The store is the one the serve settings name (--store, CONTEXTSHIFT_STORE or the config "
        "file), or the one --store gives. A backup is consistent while a server writes; a restore "
        "wants the server stopped. PostgreSQL is backed up with pg_dump (docs/operations.md).",
    )
    store_commands = store.add_subparsers(dest="store_command", required=True, help="what to do")
    for name, what in (
        ("check", "the schema version, the database's integrity check and the store's invariants"),
        ("backup", "copy a SQLite store, consistently while a server writes to it, to a new file"),
        ("restore", "replace a SQLite store's contents with a backup's (stop the server first)"),
    ):
        command = store_commands.add_parser(name, help=what, description=f"{what[0].upper()}{what[1:]}.")
        if name == "backup":
            command.add_argument("path", type=Path, metavar="PATH", help="the backup file to make")
        elif name == "restore":
            command.add_argument("path", type=Path, metavar="BACKUP", help="the backup file")
            command.add_argument("--overwrite", action="store_true", help="even when the store holds chats")
        command.add_argument(
            "--store", help="the store URL or a SQLite file's path (default: the serve settings' store)"
        )
        command.add_argument("--config", type=Path, help=f"TOML file with settings (env {config.CONFIG_ENV})")
        command.add_argument("--json", action="store_true", help="print what was found as JSON")
    store.set_defaults(run=_store)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "count" and (args.text is None) == (not args.files):
        parser.error("count: give FILE... (- for stdin) or --text, not both")
    if args.command in {"preview", "audit", "chats"} and (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    try:
        code: int = args.run(args)
    except TokenBudgetExceeded as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except InvalidInput as e:
        for v in e.violations:
            print(f"error: {v.field}: {v.description}", file=sys.stderr)
        return 2
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ContextShiftError, ServerFailed) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return code

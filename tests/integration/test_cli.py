"""The CLI as a user runs it: a real process on the shipped example, here and against a real server,
piped and in a pseudo-terminal."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import contextshift
from contextshift import cli
from contextshift.api import config

from .conftest import ServerProcess, serving, start_server

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "support-chat.json"


def run(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "contextshift", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        input=stdin,
        env=None if env is None else os.environ | env,
    )


def in_terminal(*args: str, timeout: float = 60) -> tuple[int, str]:
    """Runs the CLI with stdout and stderr on a pseudo-terminal; its exit code and what it wrote."""
    leader, follower = pty.openpty()
    env = os.environ | {"TERM": "xterm-256color", "COLUMNS": "200"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "contextshift", *args],
        stdout=follower,
        stderr=follower,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    os.close(follower)
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([leader], [], [], timeout)
        if not ready:
            proc.kill()
            raise AssertionError("no output from the CLI in time")
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.wait(timeout), b"".join(chunks).decode(errors="replace")


def table_rows(stdout: str) -> dict[str, list[str]]:
    """Rows of a decision table by block id: #, id, role, kind, tokens, decision, reason, text..."""
    rows: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        cells = line.split()
        if (
            len(cells) >= 7
            and cells[0].isdigit()
            and cells[5] in {"kept", "excluded", "truncated", "summary"}
        ):
            rows[cells[1]] = cells
    return rows


def test_preview_prints_every_block_with_its_decision() -> None:
    proc = run("preview", str(EXAMPLE), "--budget", "300")
    assert proc.returncode == 0, proc.stderr
    rows = table_rows(proc.stdout)
    assert list(rows) == [block["id"] for block in json.loads(EXAMPLE.read_text(encoding="utf-8"))]
    assert rows["sys"][2:7] == ["system", "-", "34", "kept", "PROTECTED_SYSTEM"]
    assert rows["lore-returns"][3:7] == ["lorebook", "23", "kept", "MANDATORY"]
    assert rows["u1"][5:7] == ["excluded", "BUDGET_OLDEST_FIRST"]
    assert rows["t1"][5:7] == ["excluded", "TOOL_GROUP"]  # went with its call a1
    assert rows["t2"][5:7] == ["excluded", "TOOL_GROUP"]  # the parallel call's result, further on
    assert rows["t-stale"][5:7] == ["excluded", "ORPHAN_TOOL_RESULT"]
    assert rows["u3"][5:7] == ["kept", "PINNED"]  # the current input
    assert (
        "7 kept, 6 excluded, 0 truncated; prompt 224 of 300 tokens, profile heuristic (approximate)"
        in proc.stdout
    )
    assert "\x1b[" not in proc.stdout  # piped: no colour


def test_preview_reads_stdin() -> None:
    proc = run("preview", "-", "--budget", "300", stdin=EXAMPLE.read_text(encoding="utf-8"))
    assert proc.returncode == 0, proc.stderr
    assert table_rows(proc.stdout) == table_rows(run("preview", str(EXAMPLE), "--budget", "300").stdout)


def test_preview_json_matches_the_library() -> None:
    import contextshift

    proc = run("preview", str(EXAMPLE), "--budget", "300", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    blocks = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    lib = contextshift.shift_context(blocks, budget=300)
    assert [(d["id"], d["tokens"], d["reason"]) for d in out["kept"]] == [
        (d.id, d.tokens, d.reason) for d in lib.kept
    ]
    assert out["messages"] == lib.messages


def test_preview_passes_options_here_and_to_a_server(served: ServerProcess) -> None:
    import contextshift

    flags = ["--budget", "200", "--strategy", "summarize", "--option", "summary_max_tokens=60", "--json"]
    blocks = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    lib = contextshift.shift_context(
        blocks, budget=200, strategy="summarize", options={"summary_max_tokens": 60}
    )
    assert lib.summary is not None
    for where in ([], ["--server", served.address]):
        proc = run("preview", str(EXAMPLE), *flags, *where)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert [(d["id"], d["reason"]) for d in out["kept"]] == [(d.id, d.reason) for d in lib.kept]
    wrong = run("preview", str(EXAMPLE), "--budget", "200", "--option", "target_ratio=2")
    assert wrong.returncode == 2 and "options.target_ratio" in wrong.stderr
    bad_option = run("preview", str(EXAMPLE), "--option", "no-equals-sign")
    assert bad_option.returncode == 2 and "expected KEY=VALUE" in bad_option.stderr


@pytest.mark.parametrize("command", ["preview", "count"])
def test_input_that_cannot_be_read_is_a_usage_error(tmp_path: Path, command: str) -> None:
    """Exit code 2, as the README says, with one line naming the file; never a traceback."""
    cases = {
        "not JSON": ("not json at all", "not JSON"),
        "not blocks": ('{"model": "gpt-4o"}', "expected a JSON list of blocks"),
        "not UTF-8": (b"\xff\xfe[]", "not UTF-8 text"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / f"{name}.json"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        proc = run(command, str(path))
        assert (proc.returncode, proc.stderr.count("\n")) == (2, 1), (name, proc.stderr)
        assert proc.stderr.startswith(f"error: {path}: {message}"), proc.stderr
    missing = run(command, str(tmp_path / "missing.json"))
    assert missing.returncode == 2 and "No such file or directory" in missing.stderr
    piped = run(command, "-", stdin="[1, 2")
    assert piped.returncode == 2 and piped.stderr.startswith("error: -: not JSON")


def test_preview_reports_budget_exceeded_with_exit_code() -> None:
    proc = run("preview", str(EXAMPLE), "--budget", "20")
    assert proc.returncode == 3
    assert "TOKEN_BUDGET_EXCEEDED" in proc.stderr


def test_preview_reports_invalid_blocks_by_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "robot"}]}))
    proc = run("preview", str(bad), "--budget", "100")
    assert proc.returncode == 2
    assert "blocks[1].role" in proc.stderr
    proc = run("preview", str(EXAMPLE), "--strategy", "nope")
    assert proc.returncode == 2 and "error: strategy: unknown strategy 'nope'" in proc.stderr


def test_anthropic_body_system_string_becomes_a_block(tmp_path: Path) -> None:
    body = tmp_path / "anthropic.json"
    body.write_text(json.dumps({"system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]}))
    proc = run("preview", str(body), "--budget", "100", "--json")
    assert [d["reason"] for d in json.loads(proc.stdout)["kept"]] == ["PROTECTED_SYSTEM", "PINNED"]


def test_count_files_and_stdin() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    proc = run("count", str(EXAMPLE), "-", "--profile", "o200k_base", stdin=text)
    assert proc.returncode == 0, proc.stderr
    import contextshift

    expected = contextshift.count_tokens(json.loads(text), "o200k_base")
    assert f"{EXAMPLE}: 13 blocks, {sum(expected)} tokens" in proc.stdout
    assert f"-: 13 blocks, {sum(expected)} tokens" in proc.stdout
    assert f"total {2 * sum(expected)} tokens, profile o200k_base" in proc.stdout
    as_json = json.loads(run("count", str(EXAMPLE), "--model", "gpt-4o", "--json").stdout)
    assert as_json == {"profile": "o200k_base", "files": {str(EXAMPLE): expected}}
    proc = run("count", "--text", "abcde")
    assert proc.returncode == 0
    assert "total 2 tokens, profile heuristic" in proc.stdout
    assert run("count").returncode == 2 and run("count", str(EXAMPLE), "--text", "x").returncode == 2


# --- against a server -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    running = start_server(tmp_path_factory.mktemp("cli"))
    yield running
    assert running.terminate() == 0


def test_preview_on_a_server_shows_what_the_local_engine_shows(served: ServerProcess) -> None:
    local = run("preview", str(EXAMPLE), "--budget", "300")
    remote = run("preview", str(EXAMPLE), "--budget", "300", "--server", served.address)
    assert remote.returncode == 0, remote.stderr
    assert table_rows(remote.stdout) == table_rows(local.stdout)
    assert "prompt 224 of 300 tokens" in remote.stdout
    # Without window flags the server's defaults apply: gpt-4o's window from its registry.
    by_model = run("preview", str(EXAMPLE), "--server", served.address, "--model", "gpt-4o")
    assert "profile o200k_base" in by_model.stdout and "of 111616 tokens" in by_model.stdout
    exceeded = run("preview", str(EXAMPLE), "--budget", "20", "--server", served.address)
    assert exceeded.returncode == 3 and "TOKEN_BUDGET_EXCEEDED" in exceeded.stderr


def audit_table_rows(stdout: str) -> list[tuple[str, str, str, str]]:
    """Rows of an audit's table, in order: (id, tokens, decision, reason); # and the reason's
    spaces as printed."""
    rows = []
    for line in stdout.splitlines():
        cells = line.split()
        if (
            len(cells) >= 5
            and cells[0].isdigit()
            and cells[3] in {"kept", "excluded", "truncated", "summary"}
        ):
            assert int(cells[0]) == len(rows)
            rows.append((cells[1], cells[2], cells[3], " ".join(cells[4:])))
    return rows


def test_audit_prints_a_chats_last_audit_as_the_same_table(served: ServerProcess) -> None:
    missing = run("audit", "cli-chat", "--server", served.address)
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr == "error: NOT_FOUND: chat 'cli-chat' has no audit\n"
    assert run("audit", "cli-chat").returncode == 2  # --server is required
    blocks = json.loads(EXAMPLE.read_text())
    with contextshift.Client(served.address) as client:
        # max_block_chars cuts a2: the audit's plan has a truncation.
        shifted = client.shift_context(
            blocks, budget=300, chat_id="cli-chat", provider="openai", options={"max_block_chars": 200}
        )
    assert [(t.id, t.how) for t in shifted.truncated] == [("a2", "CHAR_CAP")]
    proc = run("audit", "cli-chat", "--server", served.address)
    assert proc.returncode == 0, proc.stderr
    # Every block in the prompt's order, with its tokens, decision and reason; the cut one with
    # its truncation, as preview shows it.
    decided = {d.id: ("kept", d) for d in shifted.kept} | {d.id: ("excluded", d) for d in shifted.excluded}
    expected = [
        (
            block["id"],
            str(decided[block["id"]][1].tokens),
            decided[block["id"]][0],
            decided[block["id"]][1].reason,
        )
        for block in blocks
    ]
    a2 = next(i for i, row in enumerate(expected) if row[0] == "a2")
    expected[a2] = ("a2", "62", "truncated", "FITS, cut 70->62 (CHAR_CAP)")
    assert audit_table_rows(proc.stdout) == expected
    local = table_rows(
        run("preview", str(EXAMPLE), "--budget", "300", "--option", "max_block_chars=200").stdout
    )
    assert local["a2"][4:10] == ["62", "truncated", "FITS,", "cut", "70->62", "(CHAR_CAP)"]
    footer = " ".join(proc.stdout.split())  # the console wraps long lines
    assert f"chat cli-chat, generation {shifted.generation_id}: 7 kept, 6 excluded, 1 truncated" in footer
    assert "prompt 216 of 300 tokens" in footer
    assert "openai; status GENERATION_STATUS_PENDING" in footer


def test_audit_shows_the_summary_block_where_it_was_sent(served: ServerProcess) -> None:
    blocks = json.loads(EXAMPLE.read_text())
    with contextshift.Client(served.address) as client:
        shifted = client.shift_context(blocks, budget=200, chat_id="cli-summary", strategy="summarize")
    assert shifted.summary is not None
    rows = audit_table_rows(run("audit", "cli-summary", "--server", served.address).stdout)
    summary = [row for row in rows if row[2] == "summary"]
    assert summary == [(shifted.summary.id, str(shifted.summary.tokens), "summary", "SUMMARY")]
    assert [row[0] for row in rows if row[2] != "excluded"] == [d.id for d in shifted.kept]


def test_chats_lists_a_servers_chats_newest_first_a_page_at_a_time(tmp_path: Path) -> None:
    blocks = json.loads(EXAMPLE.read_text())
    with serving(tmp_path) as running:
        empty = run("chats", "--server", running.address)
        assert (empty.returncode, empty.stdout.strip()) == (0, "no chat has an audit"), empty.stderr
        with contextshift.Client(running.address) as client:
            first = client.shift_context(blocks, budget=300, chat_id="cli-first", model="gpt-4o")
            client.finish_generation(
                first.generation_id, "failed", chat_id="cli-first", provider_error={"http_status": 500}
            )
            client.shift_context(blocks, budget=100_000, chat_id="cli-second")
            listed = client.list_chats()
        proc = run("chats", "--server", running.address)
        assert proc.returncode == 0, proc.stderr
        rows = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith("cli-")]
        second, failed = listed.chats
        assert rows == [
            ["cli-second", "pending", str(second.prompt_tokens), str(second.kept_count), "/",
             str(second.excluded_count),
             *second.create_time.ToDatetime().isoformat(sep=" ", timespec="seconds").split()],
            ["cli-first", "failed", "(provider", "unavailable)", "gpt-4o", str(failed.prompt_tokens),
             str(failed.kept_count), "/", str(failed.excluded_count),
             *failed.create_time.ToDatetime().isoformat(sep=" ", timespec="seconds").split()],
        ]  # fmt: skip
        page = run("chats", "--server", running.address, "--page-size", "1")
        token = page.stdout.strip().splitlines()[-1].removeprefix("more: --page-token ")
        assert "cli-second" in page.stdout and "cli-first" not in page.stdout and token
        rest = run("chats", "--server", running.address, "--page-size", "1", "--page-token", token)
        assert "cli-first" in rest.stdout and "more:" not in rest.stdout
        bad = run("chats", "--server", running.address, "--page-size", "-1")
        assert bad.returncode == 2 and bad.stderr.startswith("error: page_size: must be between 0 and")


def test_an_unreachable_server_is_an_error(tmp_path: Path) -> None:
    proc = run("preview", str(EXAMPLE), "--server", "127.0.0.1:1")
    assert proc.returncode == 1 and "error: UNAVAILABLE" in proc.stderr


def test_api_key_from_the_flag_or_the_environment(tmp_path: Path) -> None:
    key = "cli-test-key-0123456789"
    running = start_server(tmp_path, "--api-keys", f"cli:{key}")
    try:
        refused = run("preview", str(EXAMPLE), "--server", running.address, env={"CONTEXTSHIFT_API_KEY": ""})
        assert refused.returncode == 1 and "(give --api-key or $CONTEXTSHIFT_API_KEY)" in refused.stderr
        assert run("preview", str(EXAMPLE), "--server", running.address, "--api-key", key).returncode == 0
        env = {"CONTEXTSHIFT_API_KEY": key}
        assert run("preview", str(EXAMPLE), "--server", running.address, env=env).returncode == 0
        audit = run("audit", "c", "--server", running.address, env=env)
        assert "error: NOT_FOUND: chat 'c' has no audit" in audit.stderr  # the key passed
    finally:
        assert running.terminate() == 0


# --- terminal, progress, help -----------------------------------------------------------------


def test_colour_in_a_terminal() -> None:
    code, output = in_terminal("preview", str(EXAMPLE), "--budget", "300")
    assert code == 0
    assert "\x1b[32m" in output and "\x1b[31m" in output  # kept rows green, excluded red
    assert "PROTECTED_SYSTEM" in output


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A conversation over cli.PROGRESS_BYTES (64 MiB) in a few blocks, so its table is short."""
    path = tmp_path_factory.mktemp("large") / "large.json"
    blocks = [
        {"role": "user", "content": f"block {n}: " + "lorem ipsum dolor sit amet " * 40_000}
        for n in range(64)
    ]
    path.write_text(json.dumps(blocks))
    assert path.stat().st_size > cli.PROGRESS_BYTES
    return path


def test_count_shows_progress_on_a_large_input_in_a_terminal(large: Path) -> None:
    code, output = in_terminal("count", str(large), "--json")
    assert code == 0
    assert "counting" in output and "64/64" in output
    piped = run("count", str(large), "--json")
    assert piped.returncode == 0 and "counting" not in piped.stdout + piped.stderr


def test_preview_shows_a_spinner_while_it_shifts_a_large_input(large: Path) -> None:
    megabytes = f"{large.stat().st_size / 2**20:.0f} MiB"
    code, output = in_terminal("preview", str(large), "--budget", "100000000")
    assert code == 0
    assert f"shifting {megabytes}" in output
    assert "64 kept, 0 excluded" in output
    piped = run("preview", str(large), "--budget", "100000000")
    assert piped.returncode == 0 and "shifting" not in piped.stdout + piped.stderr
    assert len(table_rows(piped.stdout)) == 64


def test_preview_shows_progress_while_it_prints_a_long_table(tmp_path: Path) -> None:
    """Over cli.PROGRESS_ROWS rows, the table is rendered in chunks with a bar of the rows; the
    chunks line up as one table."""
    rows = cli.PROGRESS_ROWS + 150
    many = tmp_path / "many.json"
    turns = [
        {
            "id": f"b{n}",
            "role": "user" if n % 2 == 0 else "assistant",
            "content": f"turn {n} " + "x" * (n % 7),
        }
        for n in range(rows)
    ]
    many.write_text(json.dumps(turns))
    code, output = in_terminal("preview", str(many), "--budget", "100000")
    assert code == 0
    assert "printing rows" in output and f"{rows}/{rows}" in output
    piped = run("preview", str(many), "--budget", "100000")
    assert piped.returncode == 0 and "printing rows" not in piped.stdout + piped.stderr
    shown = table_rows(piped.stdout)
    assert list(shown) == [turn["id"] for turn in turns]
    assert {cells[5] for cells in shown.values()} == {"kept"}
    # One table: every row's decision starts in the same column, across the chunks.
    lines = [line for line in piped.stdout.splitlines() if " kept " in line]
    assert len(lines) == rows and len({line.index(" kept ") for line in lines}) == 1
    # A short table: no bar, in a terminal too.
    assert "printing rows" not in in_terminal("preview", str(EXAMPLE), "--budget", "300")[1]


def test_serve_help_documents_every_setting_with_its_default() -> None:
    proc = run("serve", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for setting in config.SETTINGS:
        assert setting.flag in text, setting.name
        assert f"(default {setting.default_text}; env {setting.env})" in text, setting.name
    assert "(default 50051; env CONTEXTSHIFT_PORT)" in text
    assert "--config" in text and "CONTEXTSHIFT_CONFIG" in text


def test_help_texts_are_whole_sentences_with_every_command_described() -> None:
    top = run("--help")
    assert top.returncode == 0
    text = " ".join(top.stdout.split())
    assert cli.DESCRIPTION in text and "Exit codes: 0 done; 1" in text
    parser = cli.build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, cli.argparse._SubParsersAction)]
    assert set(commands.choices) >= {"serve", "preview", "audit", "count", "bench-profiles"}
    for name, sub in commands.choices.items():
        # Listed in the top-level help with a summary, and described in its own.
        (listed,) = [a for a in commands._choices_actions if a.dest == name]
        assert listed.help and " ".join(listed.help.split()[:3]) in text, name
        own = run(name, "--help")
        assert own.returncode == 0 and sub.description, name
        own_text = " ".join(own.stdout.split())
        assert " ".join(sub.description.split()) in own_text, name
        # Every argument says what it is, and every option with a value its default.
        for action in sub._actions:
            assert action.help, (name, action.dest)
            takes_value = action.option_strings and action.nargs != 0 and action.dest != "help"
            if takes_value:
                assert "default" in action.help or "required" in action.help, (name, action.dest)
    audit = " ".join(run("audit", "--help").stdout.split())
    assert "CHAT_ID the chat whose last audit to show" in audit


def test_a_file_with_a_repeated_key_is_refused(tmp_path: Path) -> None:
    conversation = tmp_path / "chat.json"
    conversation.write_text('[{"role": "user", "role": "assistant", "content": "x"}]')
    proc = run("preview", str(conversation), "--budget", "300")
    assert proc.returncode == 2
    assert "duplicate key 'role' in a JSON object" in proc.stderr


def test_preview_takes_the_tool_definitions(tmp_path: Path) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"name": "get_order", "input_schema": {"type": "object"}}]))
    proc = run("preview", str(EXAMPLE), "--budget", "300", "--tools", str(tools), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tools_tokens"] > 0
    tools.write_text('[{"input_schema": {}}]')
    proc = run("preview", str(EXAMPLE), "--budget", "300", "--tools", str(tools))
    assert proc.returncode == 2 and "error: tools[0].name: missing" in proc.stderr


def test_bench_profiles_runs_on_the_shipped_corpus_and_on_stdin() -> None:
    proc = run("bench-profiles", "--profiles", "heuristic", "o200k_base")
    assert proc.returncode == 0, proc.stderr
    assert "heuristic" in proc.stdout and "o200k_base" in proc.stdout and "total drift" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "contextshift", "bench-profiles", "-", "--profiles", "cl100k_base", "--json"],
        input=EXAMPLE.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["documents"] == 1 and report["messages"] == 13
    assert [t["profile"] for t in report["throughput"]] == ["cl100k_base"]


def test_text_that_looks_like_markup_is_shown_as_is(tmp_path: Path) -> None:
    conversation = tmp_path / "markup.json"
    conversation.write_text(json.dumps([{"id": "u", "role": "user", "content": "see [/oops] and [bold]x"}]))
    proc = run("preview", str(conversation), "--budget", "100")
    assert proc.returncode == 0, proc.stderr
    assert "see [/oops] and [bold]x" in proc.stdout

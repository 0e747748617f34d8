"""The CLI as a user runs it: a real process on the shipped example."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "support-chat.json"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "contextshift", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_preview_prints_every_block_with_its_decision() -> None:
    proc = run("preview", str(EXAMPLE), "--budget", "300")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[1]: line.split() for line in proc.stdout.splitlines()[2:15]}
    assert rows["sys"][3:6] == ["34", "kept", "PROTECTED_SYSTEM"]
    assert rows["lore-returns"][4:6] == ["kept", "MANDATORY"]
    assert rows["u1"][4:6] == ["EXCLUDED", "BUDGET_OLDEST_FIRST"]
    assert rows["t1"][4:6] == ["EXCLUDED", "TOOL_GROUP"]  # went with its call a1
    assert rows["t2"][4:6] == ["EXCLUDED", "TOOL_GROUP"]  # the parallel call's result, further on
    assert rows["t-stale"][4:6] == ["EXCLUDED", "ORPHAN_TOOL_RESULT"]
    assert rows["u3"][4:6] == ["kept", "PINNED"]  # the current input
    assert (
        "7 kept, 6 excluded, 0 truncated; prompt 224 of 300 tokens, profile heuristic (approximate)"
        in proc.stdout
    )


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


def test_anthropic_body_system_string_becomes_a_block(tmp_path: Path) -> None:
    body = tmp_path / "anthropic.json"
    body.write_text(json.dumps({"system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]}))
    proc = run("preview", str(body), "--budget", "100", "--json")
    assert [d["reason"] for d in json.loads(proc.stdout)["kept"]] == ["PROTECTED_SYSTEM", "PINNED"]


def test_count_prints_per_block_counts() -> None:
    proc = run("count", "--text", "abcde")
    assert proc.returncode == 0
    assert "total 2 tokens, profile heuristic" in proc.stdout


def test_a_file_with_a_repeated_key_is_refused(tmp_path: Path) -> None:
    conversation = tmp_path / "chat.json"
    conversation.write_text('[{"role": "user", "role": "assistant", "content": "x"}]')
    proc = run("preview", str(conversation), "--budget", "300")
    assert proc.returncode == 1
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

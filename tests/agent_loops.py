"""Agent loops in the JSON shapes callers send: a system prompt, the user's task, tool calls with
their results, the agent's answer and the user's next question (or, mid-loop, the last result).

`agent_loop(shape, steps, ...)` builds one; `SHAPES` names the three shapes:
- `openai-chat`: Chat Completions messages (`tool_calls`, role `tool` results);
- `responses`: Responses items (`function_call` / `function_call_output`, `message` items);
- `anthropic`: Messages (`tool_use` parts in assistant turns, `tool_result` parts in user turns).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Block = dict[str, Any]
SHAPES = ("openai-chat", "responses", "anthropic")
TASK = "Find why the nightly export to /srv/export/daily.csv fails since 2024-05-02 and fix it."
ANSWER = "The export now skips rows without an id; the fix is in export/writer.py (commit 3f9c2ab)."
QUESTION = "Thanks. Does the weekly export have the same problem?"


@dataclass(frozen=True)
class Step:
    """One tool call and its result."""

    tool: str
    arguments: dict[str, Any]
    output: str


def _text(shape: str, role: str, text: str) -> Any:
    if shape == "openai-chat":
        return text
    kind = {"responses": {"user": "input_text", "assistant": "output_text"}}.get(shape, {}).get(role, "text")
    return [{"type": kind, "text": text}]


def _turn(shape: str, block_id: str, role: str, text: str) -> Block:
    block: Block = {"id": block_id, "role": role, "content": _text(shape, role, text)}
    if shape == "responses":
        block["type"] = "message"
    return block


def _call(shape: str, n: int, step: Step) -> Block:
    call_id = f"call_{n}"
    if shape == "openai-chat":
        function = {"name": step.tool, "arguments": json.dumps(step.arguments)}
        return {
            "id": f"a{n}",
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": function}],
        }
    if shape == "responses":
        arguments = json.dumps(step.arguments)
        return {
            "id": f"a{n}",
            "type": "function_call",
            "call_id": call_id,
            "name": step.tool,
            "arguments": arguments,
        }
    use = {"type": "tool_use", "id": call_id, "name": step.tool, "input": step.arguments}
    return {"id": f"a{n}", "role": "assistant", "content": [{"type": "text", "text": "Checking."}, use]}


def _result(shape: str, n: int, step: Step) -> Block:
    call_id = f"call_{n}"
    if shape == "openai-chat":
        return {"id": f"r{n}", "role": "tool", "tool_call_id": call_id, "content": step.output}
    if shape == "responses":
        return {"id": f"r{n}", "type": "function_call_output", "call_id": call_id, "output": step.output}
    result = {"type": "tool_result", "tool_use_id": call_id, "content": step.output}
    return {"id": f"r{n}", "role": "user", "content": [result]}


def agent_loop(
    shape: str,
    steps: Sequence[Step],
    *,
    task: str = TASK,
    answer: str | None = ANSWER,
    question: str | None = QUESTION,
) -> list[Block]:
    """`[system, task, (call, result) per step, answer, question]` in `shape`; without `answer`
    and `question` the loop is mid-run (its last block a tool result)."""
    blocks = [
        {"id": "sys", "role": "system", "content": "You are a coding agent. Use the tools."},
        _turn(shape, "task", "user", task),
    ]
    for n, step in enumerate(steps):
        blocks += [_call(shape, n, step), _result(shape, n, step)]
    if answer is not None:
        blocks.append(_turn(shape, "answer", "assistant", answer))
    if question is not None:
        blocks.append(_turn(shape, "question", "user", question))
    return blocks


def log_steps(count: int, lines: int = 40) -> list[Step]:
    """`count` steps whose results are log excerpts of `lines` lines (about 20 tokens a line)."""
    steps = []
    for n in range(count):
        rows = "\n".join(
            f"2024-05-{2 + n % 27:02d}T03:{k % 60:02d}:11Z export[{4100 + k}]: wrote row {n * 1000 + k} "
            f"to /srv/export/part-{n:03d}.csv ({k * 37 % 997} bytes)"
            for k in range(lines)
        )
        steps.append(Step("read_log" if n % 2 else "grep", {"path": f"/var/log/export.{n}.log"}, rows))
    return steps

"""Agent-loop presets: the option `preset` sets several options in one word, after FIM One's
five layers of context defence for ReAct and DAG agents. Options given beside a preset win; a
preset's options that the chosen strategy does not take (`hint`, `compact_above_tokens` outside
`llm-compact`) are left out, with a warning in the result saying so (under `truncate`,
`dag_planner` does nothing at all); its caps apply to every strategy.

- `react`: a ReAct loop's history; `hint` react_iteration, every block capped at 50,000 characters.
- `dag_planner`: the enriched planner input is summarized with `hint` planner_input once the
  prompt passes 16,000 tokens (`compact_above_tokens`); below that nothing shifts (unless the
  budget itself is exceeded).
- `dag_step`: a step's dependency results (tool results) capped at 50,000 characters, `hint`
  step_dependency.
- `dag_analyzer`: each step result (tool result) capped at 10,000 characters.
- `dag_replan`: each step result (tool result) capped at 500 characters.

A "step result" or "dependency result" is a tool result: a block that answers a tool call (role
`tool`, a `function_call_output` item, a `tool_result` part); the cap is `tool_result_max_chars`,
which cuts those blocks only (docs/semantics.md §3).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PRESETS: Mapping[str, Mapping[str, Any]] = {
    "react": {"hint": "react_iteration", "max_block_chars": 50_000},
    "dag_planner": {"hint": "planner_input", "compact_above_tokens": 16_000},
    "dag_step": {"hint": "step_dependency", "tool_result_max_chars": 50_000},
    "dag_analyzer": {"tool_result_max_chars": 10_000},
    "dag_replan": {"tool_result_max_chars": 500},
}

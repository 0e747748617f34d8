"""A sample contextshift plugin.

- Strategy `drop-greetings`: leaves out short greetings and thanks ("hi", "thanks!") that carry
  nothing for the model, whatever the budget, then lets the host truncate if still over.
- Interceptor `redact-secrets`: replaces tokens that look like secrets (`sk-…`, `SECRET-…`) in the
  final messages by `[redacted]`.
"""

from __future__ import annotations

import re
from typing import Any

from contextshift import InterceptorContext, OptionSpec, ShiftView, StrategyPlan

GREETINGS = frozenset({"hi", "hello", "hey", "thanks", "thank you", "ok", "okay", "bye"})
SECRET = re.compile(r"\b(?:sk-[A-Za-z0-9]{8,}|SECRET-[A-Za-z0-9]+)\b")


def drop_greetings(view: ShiftView) -> StrategyPlan:
    longest = view.options["max_greeting_chars"]
    exclude = [
        block.id
        for block in view.blocks
        if block.role in {"user", "assistant"}
        and not block.protected
        and len(view.text(block.index)) <= longest
        and view.text(block.index).strip(" !.").lower() in GREETINGS
    ]
    return StrategyPlan(exclude=exclude)


drop_greetings.description = "leave out short greetings and thanks, then truncate"  # type: ignore[attr-defined]
drop_greetings.options = (  # type: ignore[attr-defined]
    OptionSpec("max_greeting_chars", "int", 20, "longer messages are never greetings", minimum=1),
)


def _redact(value: Any) -> Any:
    if isinstance(value, str):
        return SECRET.sub("[redacted]", value)
    if isinstance(value, list):
        return [_redact(v) for v in value]
    if isinstance(value, dict):
        return {k: _redact(v) for k, v in value.items()}
    return value


def redact_secrets(messages: list[dict[str, Any]], context: InterceptorContext) -> list[dict[str, Any]]:
    for message in messages:
        for key, value in message.items():
            message[key] = _redact(value)
    return messages

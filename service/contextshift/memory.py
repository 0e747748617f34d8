"""Conversation memory for library users: a chat's messages kept in the caller's own shape (OpenAI
Chat Completions, Anthropic Messages, Responses items, ... as `shift_context` reads them), and
the ones to send given back ready for `shift_context`.

- `WindowMemory(max_messages)`: every system message, and the last `max_messages` other
  messages. A window never starts inside a tool-call group: members of a group that began before
  the window are left out with it (a tool result without its call is not a valid request).
- `SummaryMemory(summarizer, threshold)`: once there are more than `threshold` non-system
  messages, all but the latest `keep_recent` (whole tool-call groups) become one system message
  `{"role": "system", "content": "[Conversation summary] …"}`, placed before the first message
  kept; an earlier summary is folded into the next one. The summarizer is the local extractive
  one (`ExtractiveSummarizer`) or an LLM (`LlmSummarizer`, an OpenAI-compatible endpoint, which
  falls back to the local one when the endpoint fails, so adding a message never fails on it).

Messages are checked when added (`InvalidBlocks` naming `message.<field>`); the dicts given are
the dicts returned. A memory is safe to share between threads.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from contextshift import engine
from contextshift.diagnostics import CompactionUsage
from contextshift.errors import FieldViolation, InvalidBlocks
from contextshift.options import Secret
from contextshift.strategies.summarize import MIN_SUMMARY_TOKENS
from contextshift.summarizer import extractive, llm

log = logging.getLogger("contextshift.memory")

Message = Mapping[str, Any]
# Messages are only read for their roles, texts and tool links: no char cap.
_NO_CAP = 2**62


class BaseMemory(ABC):
    """A conversation's memory: messages in, the messages to send out."""

    @abstractmethod
    def add_message(self, message: Message) -> None:
        """Adds one message (any shape `shift_context` reads); `InvalidBlocks` when malformed."""

    def add_messages(self, messages: Iterable[Message]) -> None:
        for message in messages:
            self.add_message(message)

    @abstractmethod
    def get_messages(self) -> list[Message]:
        """The messages to send, oldest first."""

    @abstractmethod
    def clear(self) -> None:
        """Forgets everything."""


def _checked(message: Message) -> Message:
    if not isinstance(message, Mapping):
        raise InvalidBlocks([("message", f"must be a mapping, got {type(message).__name__}")])
    try:
        engine.Conversation([message], _NO_CAP)
    except InvalidBlocks as e:
        raise InvalidBlocks(
            [FieldViolation(v.field.replace("blocks[0]", "message", 1), v.description) for v in e.violations]
        ) from None
    return message


class _Layout:
    """Roles, texts and tool-call groups of a list of messages."""

    def __init__(self, messages: Sequence[Message]) -> None:
        self.conversation = engine.Conversation(messages, _NO_CAP)
        layout = self.conversation.layout([], protect_current_input=False)
        self.roles = layout.roles
        self.groups = layout.groups

    def others(self) -> list[int]:
        """The indices of the non-system messages."""
        return [i for i, role in enumerate(self.roles) if role != "system"]

    def whole_tail(self, others: Sequence[int], count: int) -> list[int]:
        """The last `count` of `others`, less the members of groups that began before them."""
        tail = others[max(0, len(others) - count) :] if count else []
        if not tail:
            return []
        before = {self.groups[i] for i in range(tail[0])}
        return [i for i in tail if self.groups[i] not in before]

    def turns(self, indices: Sequence[int]) -> list[extractive.Turn]:
        texts = self.conversation.texts(list(indices))
        return [extractive.Turn(self.roles[i], text) for i, text in zip(indices, texts, strict=True)]


class WindowMemory(BaseMemory):
    """Every system message, and the last `max_messages` other messages (whole tool groups)."""

    def __init__(self, max_messages: int) -> None:
        if max_messages < 1:
            raise ValueError(f"max_messages must be >= 1, got {max_messages}")
        self.max_messages = max_messages
        self._lock = threading.Lock()
        self._messages: list[Message] = []

    def add_message(self, message: Message) -> None:
        checked = _checked(message)
        with self._lock:
            self._messages.append(checked)

    def get_messages(self) -> list[Message]:
        with self._lock:
            messages = list(self._messages)
        if not messages:
            return []
        layout = _Layout(messages)
        others = layout.others()
        window = set(layout.whole_tail(others, self.max_messages))
        return [m for i, m in enumerate(messages) if layout.roles[i] == "system" or i in window]

    def clear(self) -> None:
        with self._lock:
            self._messages.clear()


class Summarizer(Protocol):
    def summarize(self, turns: Sequence[extractive.Turn], query: str) -> str:
        """A summary of `turns` (oldest first) starting `[Conversation summary]`, for the next
        answer to `query` (the latest message kept)."""
        ...


class ExtractiveSummarizer:
    """The local, deterministic extractive summary (as the `summarize` strategy makes it), at most
    `max_tokens` tokens as `profile` counts a system message."""

    def __init__(self, max_tokens: int = 512, profile: str = "heuristic") -> None:
        if max_tokens < MIN_SUMMARY_TOKENS:
            raise ValueError(f"max_tokens must be >= {MIN_SUMMARY_TOKENS}, got {max_tokens}")
        self.max_tokens = max_tokens
        self.profile = profile

    def tokens(self, text: str) -> int:
        return engine.count_items([{"role": "system", "content": text}], self.profile)[0]

    def summarize(self, turns: Sequence[extractive.Turn], query: str) -> str:
        room = extractive.Room(
            self.max_tokens, self.tokens, lambda texts: engine.count_items(texts, self.profile)
        )
        made = extractive.summarize(turns, room)
        return extractive.HEADER if made is None else made.text


class LlmSummarizer:
    """A summary by an LLM behind an OpenAI-compatible endpoint (the prompt of `hint`, facts it
    leaves out appended), at most `max_tokens` tokens as `profile` counts it. When the endpoint
    fails the local extractive summary is used instead: `last_failure` says why, and `usage`
    totals what the endpoint reported spending."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str = "",
        timeout_ms: int = llm.DEFAULT_TIMEOUT_MS,
        hint: str = llm.DEFAULT_HINT,
        max_tokens: int = 512,
        profile: str = "heuristic",
    ) -> None:
        if (problem := llm.url_problem(base_url)) is not None:
            raise ValueError(f"base_url {problem}")
        if hint not in llm.HINTS:
            raise ValueError(f"hint must be one of {', '.join(llm.HINTS)}, got {hint!r}")
        self.endpoint = llm.Endpoint(base_url, model, Secret(api_key), timeout_ms)
        self.hint = hint
        self.fallback = ExtractiveSummarizer(max_tokens, profile)
        self.last_failure: str | None = None
        self.usage = CompactionUsage(model, 0, 0)

    def __repr__(self) -> str:
        return f"LlmSummarizer({self.endpoint!r}, hint={self.hint!r})"

    def summarize(self, turns: Sequence[extractive.Turn], query: str) -> str:
        limit = self.fallback.max_tokens
        try:
            made = llm.summarize(turns, self.endpoint, self.hint, self.fallback.tokens, limit)
        except llm.CompactionFailed as failed:
            self.last_failure = failed.cause
            self._spent(failed.usage)
            fields = {"model": self.endpoint.model, "cause": failed.cause}
            log.warning("llm summary failed; used the extractive summary", extra={"fields": fields})
            return self.fallback.summarize(turns, query)
        self.last_failure = None
        self._spent(made.usage)
        return made.text

    def _spent(self, usage: CompactionUsage | None) -> None:
        if usage is not None:
            self.usage = CompactionUsage(
                self.usage.model,
                (self.usage.prompt_tokens or 0) + (usage.prompt_tokens or 0),
                (self.usage.completion_tokens or 0) + (usage.completion_tokens or 0),
            )


class SummaryMemory(BaseMemory):
    """Past `threshold` non-system messages, all but the latest `keep_recent` become one summary
    system message (see the module doc)."""

    def __init__(self, summarizer: Summarizer, threshold: int = 20, keep_recent: int = 4) -> None:
        if keep_recent < 0 or threshold <= keep_recent:
            raise ValueError(f"need 0 <= keep_recent < threshold, got {keep_recent} and {threshold}")
        self.summarizer = summarizer
        self.threshold = threshold
        self.keep_recent = keep_recent
        self._lock = threading.Lock()
        self._messages: list[Message] = []
        self._summary: str | None = None

    @property
    def summary(self) -> str | None:
        """The current summary text, if any."""
        return self._summary

    def add_message(self, message: Message) -> None:
        checked = _checked(message)
        with self._lock:
            self._messages.append(checked)
            if len(self._messages) <= self.threshold:  # fewer messages than a fold needs others
                return
            layout = _Layout(self._messages)
            others = layout.others()
            if len(others) > self.threshold:
                self._fold(layout, others)

    def _fold(self, layout: _Layout, others: list[int]) -> None:
        """Replaces the older non-system messages (and the earlier summary) by one summary."""
        recent = set(layout.whole_tail(others, self.keep_recent))
        older = [i for i in others if i not in recent]
        turns = layout.turns(older)
        if self._summary is not None:
            turns.insert(0, extractive.Turn("system", self._summary))
        query = layout.turns([max(recent)])[0].text if recent else ""
        self._summary = self.summarizer.summarize(turns, query)
        gone = set(older)
        self._messages = [m for i, m in enumerate(self._messages) if i not in gone]

    def get_messages(self) -> list[Message]:
        with self._lock:
            messages = list(self._messages)
            summary = self._summary
        if summary is None:
            return messages
        roles = _Layout(messages).roles if messages else []
        at = next((i for i, role in enumerate(roles) if role != "system"), len(messages))
        return [*messages[:at], {"role": "system", "content": summary}, *messages[at:]]

    def clear(self) -> None:
        with self._lock:
            self._messages.clear()
            self._summary = None

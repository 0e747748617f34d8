"""contextshift.memory: WindowMemory and SummaryMemory over messages in the caller's shapes, with
the local extractive summarizer and the LLM one (against the fake endpoint on 127.0.0.1)."""

from __future__ import annotations

from typing import Any

import pytest
from fake_llm import GOOD_ANSWER, FakeLlm, closed_port_url

import contextshift
from contextshift import memory
from contextshift.summarizer import extractive, llm


def openai_turns(count: int) -> list[dict[str, Any]]:
    return [
        {"role": "user" if n % 2 == 0 else "assistant", "content": f"Turn {n}: ticket OPS-{100 + n} is open."}
        for n in range(count)
    ]


def tool_exchange(n: int) -> list[dict[str, Any]]:
    """An assistant call and its result (OpenAI shape)."""
    call = {"id": f"c{n}", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{n}", "content": f"result {n}: /var/data/{n}.csv"},
    ]


def test_window_memory_keeps_system_messages_and_the_last_n_others() -> None:
    window = memory.WindowMemory(3)
    system = {"role": "system", "content": "Be brief."}
    window.add_message(system)
    turns = openai_turns(6)
    window.add_messages(turns)
    got = window.get_messages()
    assert got == [system, *turns[-3:]]
    assert got[1] is turns[3]  # the caller's own dicts
    window.clear()
    assert window.get_messages() == []


def test_window_memory_never_starts_inside_a_tool_group() -> None:
    window = memory.WindowMemory(2)
    messages = [*openai_turns(2), *tool_exchange(1), {"role": "user", "content": "and now?"}]
    window.add_messages(messages)
    # The last 2 would be the tool result and the user turn: the result's call is outside the window.
    assert window.get_messages() == [messages[-1]]
    window = memory.WindowMemory(3)
    window.add_messages(messages)
    assert window.get_messages() == messages[-3:]


def test_window_memory_reads_every_shape() -> None:
    anthropic = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]},
        {"role": "assistant", "content": "It is sunny."},
    ]
    responses = [
        {"type": "function_call", "call_id": "r1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "r1", "output": "ok"},
    ]
    window = memory.WindowMemory(3)
    window.add_messages([*anthropic, *responses])
    assert window.get_messages() == [anthropic[-1], *responses]


def test_a_malformed_message_is_refused_naming_the_field() -> None:
    window = memory.WindowMemory(2)
    with pytest.raises(contextshift.InvalidBlocks) as caught:
        window.add_message({"role": "robot", "content": "hi"})
    assert [v.field for v in caught.value.violations] == ["message.role"]
    with pytest.raises(contextshift.InvalidBlocks):
        window.add_message("hi")  # type: ignore[arg-type]
    assert window.get_messages() == []
    with pytest.raises(ValueError, match="max_messages"):
        memory.WindowMemory(0)


def test_summary_memory_folds_older_messages_past_the_threshold() -> None:
    summarizer = memory.ExtractiveSummarizer(max_tokens=200)
    mem = memory.SummaryMemory(summarizer, threshold=6, keep_recent=2)
    system = {"role": "system", "content": "You track tickets."}
    mem.add_message(system)
    turns = openai_turns(6)
    mem.add_messages(turns)
    assert mem.get_messages() == [system, *turns] and mem.summary is None  # at the threshold
    extra = {"role": "user", "content": "What about OPS-105?"}
    mem.add_message(extra)  # 7 > 6: all but the latest 2 are summarized
    got = mem.get_messages()
    assert got[0] is system and got[2:] == [turns[-1], extra]
    assert got[1]["role"] == "system" and got[1]["content"] == mem.summary
    assert mem.summary is not None and mem.summary.startswith("[Conversation summary]")
    for n in range(5):
        assert f"OPS-{100 + n}" in mem.summary  # facts survive
    assert summarizer.tokens(mem.summary) <= 200
    # Ready for shift_context: the summary is a protected system message.
    result = contextshift.shift_context(got, budget=10_000)
    assert [d.reason for d in result.kept][:2] == ["PROTECTED_SYSTEM", "PROTECTED_SYSTEM"]


def test_summary_memory_folds_its_earlier_summary_into_the_next() -> None:
    mem = memory.SummaryMemory(memory.ExtractiveSummarizer(), threshold=4, keep_recent=1)
    mem.add_messages(openai_turns(5))
    first = mem.summary
    assert first is not None
    mem.add_messages(openai_turns(10)[5:])  # the 9th message (5 > 4) folds turns 4 to 7 in
    assert mem.summary is not None and mem.summary != first
    assert mem.summary.count("[Conversation summary]") == 1
    assert "OPS-100" in mem.summary and "OPS-107" in mem.summary and "OPS-108" not in mem.summary
    messages = mem.get_messages()
    assert [m["content"][:6] for m in messages[1:]] == ["Turn 8", "Turn 9"]
    mem.clear()
    assert mem.get_messages() == [] and mem.summary is None


def test_summary_memory_keeps_tool_groups_whole() -> None:
    mem = memory.SummaryMemory(memory.ExtractiveSummarizer(), threshold=3, keep_recent=1)
    messages = [*openai_turns(2), *tool_exchange(1)]
    mem.add_messages(messages)  # 4 > 3: the latest 1 is the tool result, whose call came before
    got = mem.get_messages()
    assert [m["role"] for m in got] == ["system"]  # the whole exchange went into the summary
    assert mem.summary is not None and "/var/data/1.csv" in mem.summary


def test_summary_memory_with_the_llm(fake_llm: FakeLlm) -> None:
    summarizer = memory.LlmSummarizer(fake_llm.url, "m2", api_key="sk-mem", hint="step_dependency")
    mem = memory.SummaryMemory(summarizer, threshold=4, keep_recent=2)
    mem.add_messages(openai_turns(5))
    [asked] = fake_llm.requests
    assert asked.body["model"] == "m2" and asked.system_prompt == llm.PROMPTS["step_dependency"]
    assert asked.headers["authorization"] == "Bearer sk-mem"
    assert "user: Turn 0" in asked.user_message and "Turn 3" not in asked.user_message
    assert mem.summary is not None and mem.summary.startswith(f"[Conversation summary]\n{GOOD_ANSWER}")
    assert "OPS-100" in mem.summary  # the facts line
    assert summarizer.last_failure is None
    assert summarizer.usage == contextshift.CompactionUsage("m2", 321, 45)
    assert "sk-mem" not in repr(summarizer)


def test_a_failing_llm_falls_back_to_the_extractive_summary(fake_llm: FakeLlm) -> None:
    fake_llm.mode = "error"
    summarizer = memory.LlmSummarizer(fake_llm.url, "m2")
    mem = memory.SummaryMemory(summarizer, threshold=4, keep_recent=2)
    mem.add_messages(openai_turns(5))
    local = memory.ExtractiveSummarizer().summarize(
        [extractive.Turn(m["role"], m["content"]) for m in openai_turns(3)], "Turn 4: ticket OPS-104 is open."
    )
    assert mem.summary == local
    assert summarizer.last_failure == "the endpoint answered HTTP 500"
    refused = memory.LlmSummarizer(closed_port_url(), "m2")
    assert refused.summarize([extractive.Turn("user", "hi there 2024-05-01")], "").startswith(
        "[Conversation summary]"
    )
    assert refused.last_failure is not None and refused.last_failure.startswith("could not connect")


def test_summarizers_check_their_settings() -> None:
    with pytest.raises(ValueError, match="base_url"):
        memory.LlmSummarizer("file:///etc/passwd", "m")
    with pytest.raises(ValueError, match="hint"):
        memory.LlmSummarizer("http://127.0.0.1:9/v1", "m", hint="poetry")
    with pytest.raises(ValueError, match="max_tokens"):
        memory.ExtractiveSummarizer(max_tokens=5)
    with pytest.raises(ValueError, match="keep_recent"):
        memory.SummaryMemory(memory.ExtractiveSummarizer(), threshold=2, keep_recent=2)

"""Tokenizer profiles: listing, the model registry and resolution, per-profile framing and image
costs on worked examples, the count cache, and calibration of approximate profiles."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tokenizers  # type: ignore[import-untyped]
from test_profiles_exact import DEEPSEEK_JSON, QWEN_JSON, openai_encoding

import contextshift
from contextshift import calibration, profiles

BUILTINS = [
    "heuristic",
    "anthropic",
    "o200k_base",
    "cl100k_base",
    "qwen",
    "deepseek_v3",
    "mistral_tekken",
    "llama3",
]


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": text, **extra}


# --- listing ---------------------------------------------------------------------------------


def test_every_profile_is_listed_with_what_a_caller_needs() -> None:
    listed = {p.name: p for p in profiles.list_profiles()}
    assert list(listed) == BUILTINS
    for p in listed.values():
        assert p.exactness in {"exact", "text-exact", "approximate"}
        assert p.approximate == (p.exactness == "approximate")
        assert p.source and p.licence and p.image_rule and p.overhead_source
        assert list(p.message_overhead) == ["system", "user", "assistant", "tool"]
    assert listed["o200k_base"].vocab_size == 200_019
    assert (listed["o200k_base"].name_overhead, listed["o200k_base"].prompt_overhead) == (1, 3)
    assert listed["heuristic"].message_overhead == dict.fromkeys(["system", "user", "assistant", "tool"], 4)
    assert "Llama 3 Community License" in listed["llama3"].licence
    assert "not bundled" in listed["llama3"].source


# --- registry and resolution -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "profile", "context", "max_output"),
    [
        ("gpt-4o", "o200k_base", 128_000, 16_384),
        ("gpt-4o-mini-2024-07-18", "o200k_base", 128_000, 16_384),
        ("GPT-4.1-nano", "o200k_base", 1_047_576, 32_768),
        ("openai/gpt-5", "o200k_base", 400_000, 128_000),
        ("o1-mini", "o200k_base", 128_000, 65_536),  # the longer prefix wins over "o1*"
        ("o1", "o200k_base", 200_000, 100_000),
        ("gpt-4", "cl100k_base", 8_192, 8_192),
        ("gpt-3.5-turbo-0125", "cl100k_base", 16_385, 4_096),
        ("claude-sonnet-4-5-20250929", "anthropic", 200_000, 64_000),
        ("claude-2.1", "anthropic", 200_000, None),
        ("gemini-2.5-pro", "heuristic", 1_048_576, 65_536),
        ("qwen3-32b", "qwen", 32_768, None),
        ("Qwen/Qwen2.5-72B-Instruct", "qwen", 32_768, 8_192),
        ("mistral-small-2503", "mistral_tekken", 131_072, None),
        ("deepseek-chat", "deepseek_v3", 128_000, 8_192),
    ],
)
def test_models_resolve_through_the_registry(
    model: str, profile: str, context: int, max_output: int | None
) -> None:
    resolved = profiles.resolve(model)
    assert (resolved.profile, resolved.model, resolved.context_window, resolved.max_output) == (
        profile,
        model,
        context,
        max_output,
    )
    assert resolved.approximate == (profile in {"heuristic", "anthropic"})
    assert resolved.warnings == []


def test_every_registry_entry_names_a_profile_and_a_source() -> None:
    names = {p.name for p in profiles.list_profiles()}
    for entry in profiles.list_models():
        assert entry.profile in names, entry
        assert entry.source and entry.context > 0, entry
        assert entry.max_output is None or 0 < entry.max_output <= entry.context, entry


def test_unknown_names() -> None:
    with pytest.raises(contextshift.InvalidOptions) as err:
        profiles.resolve("gpt-99")
    assert [v.field for v in err.value.violations] == ["profile"]
    # A model alone is a request to count for that model: unknown means heuristic, said openly.
    unknown = profiles.resolve_request(model="my-finetune")
    assert (unknown.profile, unknown.approximate, unknown.model) == ("heuristic", True, "my-finetune")
    assert unknown.warnings == [
        "model 'my-finetune' is not in the model registry; counting with heuristic (approximate)"
    ]
    assert contextshift.count_tokens(["abcd"], model="my-finetune") == [1]
    # A profile wins over a model; the model keeps its registry figures.
    both = profiles.resolve_request("cl100k_base", "gpt-4o")
    assert (both.profile, both.model, both.context_window) == ("cl100k_base", "gpt-4o", 128_000)
    assert profiles.resolve_request().profile == "heuristic"
    with pytest.raises(contextshift.InvalidOptions):
        profiles.resolve("hf:/no/such/tokenizer.json")


def test_llama3_without_its_file_falls_back_for_models_and_fails_by_name() -> None:
    script = (
        "import contextshift\n"
        "from contextshift import profiles\n"
        "r = profiles.resolve('llama-3.3-70b-instruct')\n"
        "print(r.profile, r.approximate, r.context_window)\n"
        "print(r.warnings[0])\n"
        "try:\n"
        "    profiles.resolve('llama3')\n"
        "except contextshift.InvalidOptions as e:\n"
        "    print(e.violations[0].field)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CONTEXTSHIFT_LLAMA3_TOKENIZER"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    resolved, warning, field = out.stdout.splitlines()
    assert resolved == "heuristic True 131072"
    assert "CONTEXTSHIFT_LLAMA3_TOKENIZER" in warning and "not bundled" in warning
    assert field == "profile"


# --- framing and images: worked examples -------------------------------------------------------


def cookbook_num_tokens(messages: list[dict[str, str]], encoding: tiktoken.Encoding) -> int:
    """OpenAI cookbook, "How to count tokens with tiktoken", num_tokens_from_messages (gpt-4o)."""
    tokens_per_message, tokens_per_name = 3, 1
    num_tokens = 0
    for message in messages:
        num_tokens += tokens_per_message
        for key, value in message.items():
            num_tokens += len(encoding.encode(value))
            if key == "name":
                num_tokens += tokens_per_name
    return num_tokens + 3  # every reply is primed with <|start|>assistant<|message|>


COOKBOOK_MESSAGES = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain English.",
    },
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Things working well together will increase revenue.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client deliverable.",
    },
]


@pytest.mark.parametrize("profile", ["o200k_base", "cl100k_base"])
def test_openai_framing_is_the_cookbook_rule(profile: str) -> None:
    expected = cookbook_num_tokens(COOKBOOK_MESSAGES, openai_encoding(profile))
    result = contextshift.shift_context(COOKBOOK_MESSAGES, budget=10_000, profile=profile)
    assert result.prompt_tokens == expected
    assert sum(contextshift.count_tokens(COOKBOOK_MESSAGES, profile)) + 3 == expected


# OpenAI cookbook, "How to count tokens with tiktoken", section 7 "Counting tokens for chat
# completions with tool calls" (github.com/openai/openai-cookbook,
# examples/How_to_count_tokens_with_tiktoken.ipynb): these tools and messages, and the prompt tokens
# the OpenAI API reported for them.
COOKBOOK_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given location",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {
                        "type": "string",
                        "description": "The city and state, e.g. San Francisco, CA",
                    },
                    "unit": {
                        "type": "string",
                        "description": "The unit of temperature to return",
                        "enum": ["celsius", "fahrenheit"],
                    },
                },
                "required": ["location"],
            },
        },
    }
]
COOKBOOK_TOOL_MESSAGES = [
    {
        "role": "system",
        "content": "You are a helpful assistant that can answer to questions about the weather.",
    },
    {"role": "user", "content": "What's the weather like in San Francisco?"},
]


def cookbook_num_tokens_for_tools(
    functions: list[dict[str, Any]], encoding: tiktoken.Encoding, func_init: int
) -> int:
    """The cookbook's num_tokens_for_tools without the messages (func_init 7 for gpt-4o and
    gpt-4o-mini, 10 for gpt-3.5-turbo and gpt-4; the other constants are the same for both)."""
    prop_init, prop_key, enum_init, enum_item, func_end = 3, 3, -3, 3, 12
    count = 0
    for f in functions:
        count += func_init
        function = f["function"]
        description = function["description"]
        description = description[:-1] if description.endswith(".") else description
        count += len(encoding.encode(function["name"] + ":" + description))
        properties = function["parameters"]["properties"]
        if properties:
            count += prop_init
            for key, schema in properties.items():
                count += prop_key
                if "enum" in schema:
                    count += enum_init
                    for item in schema["enum"]:
                        count += enum_item + len(encoding.encode(item))
                p_desc = schema["description"]
                p_desc = p_desc[:-1] if p_desc.endswith(".") else p_desc
                count += len(encoding.encode(f"{key}:{schema['type']}:{p_desc}"))
    return count + func_end if functions else count


@pytest.mark.parametrize(
    ("profile", "func_init", "api_prompt_tokens"), [("o200k_base", 7, 101), ("cl100k_base", 10, 105)]
)
def test_openai_tools_reproduce_the_cookbook(profile: str, func_init: int, api_prompt_tokens: int) -> None:
    encoding = openai_encoding(profile)  # tiktoken's own tokenizer
    expected_tools = cookbook_num_tokens_for_tools(COOKBOOK_TOOLS, encoding, func_init)
    assert cookbook_num_tokens(COOKBOOK_TOOL_MESSAGES, encoding) + expected_tools == api_prompt_tokens
    for tools in (COOKBOOK_TOOLS, json.dumps(COOKBOOK_TOOLS)):
        result = contextshift.shift_context(COOKBOOK_TOOL_MESSAGES, budget=1000, profile=profile, tools=tools)
        assert result.tools_tokens == expected_tools
        assert result.prompt_tokens + result.tools_tokens == api_prompt_tokens


def test_tool_shapes_of_every_provider_count_alike() -> None:
    """The same function as OpenAI Chat, OpenAI Responses and Anthropic tools: the same function
    count under OpenAI's rule; a built-in tool counts as its JSON text."""
    function = COOKBOOK_TOOLS[0]["function"]
    responses = [{"type": "function", **function}]
    anthropic = [
        {
            "name": function["name"],
            "description": function["description"],
            "input_schema": function["parameters"],
        }
    ]

    def count(tools: list[dict[str, Any]]) -> int:
        shift = contextshift.shift_context(
            COOKBOOK_TOOL_MESSAGES, budget=1000, profile="o200k_base", tools=tools
        )
        return shift.tools_tokens

    assert count(COOKBOOK_TOOLS) == count(responses) == count(anthropic)
    web_search = [{"type": "web_search"}]
    encoding = openai_encoding("o200k_base")
    assert count(web_search) == len(encoding.encode('{"type": "web_search"}'))
    assert count(COOKBOOK_TOOLS + web_search) == count(COOKBOOK_TOOLS) + count(web_search)


def test_tools_under_the_other_rules() -> None:
    as_text = json.dumps(COOKBOOK_TOOLS[0], ensure_ascii=False)
    heuristic_text = contextshift.count_tokens([as_text])[0]
    shift = lambda profile: contextshift.shift_context(  # noqa: E731
        COOKBOOK_TOOL_MESSAGES, budget=2000, profile=profile, tools=COOKBOOK_TOOLS
    )
    # The heuristic (and every template-based profile): the definition's JSON text; its block
    # arithmetic is unchanged.
    assert shift("heuristic").tools_tokens == heuristic_text
    assert shift("heuristic").prompt_tokens == sum(contextshift.count_tokens(COOKBOOK_TOOL_MESSAGES))
    # Anthropic: its tool-use system prompt (346, tool_choice auto) once, plus the JSON text.
    assert shift("anthropic").tools_tokens == 346 + heuristic_text


def test_tool_calls_carry_openai_framing_only() -> None:
    call = {
        "role": "assistant",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{}"}}],
    }
    encoding = openai_encoding("o200k_base")
    text = len(encoding.encode("get")) + len(encoding.encode("{}"))
    assert contextshift.count_tokens([call], "o200k_base") == [4 + 3 + text]  # message, call framing
    assert contextshift.count_tokens([call]) == [4 + 1 + 1]  # heuristic: as before


def test_tools_come_off_the_budget_first() -> None:
    full = contextshift.shift_context(COOKBOOK_TOOL_MESSAGES, budget=1000, profile="o200k_base")
    with pytest.raises(contextshift.TokenBudgetExceeded) as err:
        contextshift.shift_context(
            COOKBOOK_TOOL_MESSAGES, budget=100, profile="o200k_base", tools=COOKBOOK_TOOLS
        )
    assert (err.value.protected_tokens, err.value.tools_tokens, err.value.budget) == (
        full.prompt_tokens,
        68,
        100,
    )
    assert "tool definitions 68" in str(err.value)
    blocks = [{"role": "user", "content": "old " * 40}, *COOKBOOK_TOOL_MESSAGES]
    result = contextshift.shift_context(blocks, budget=110, profile="o200k_base", tools=COOKBOOK_TOOLS)
    assert [d.reason for d in result.excluded] == ["BUDGET_OLDEST_FIRST"]
    assert result.prompt_tokens + result.tools_tokens <= result.budget == 110


@pytest.mark.parametrize(
    ("tools", "field"),
    [
        ([{"type": "function", "function": {"description": "no name"}}], "tools[0].function.name"),
        ([{"name": "f", "input_schema": {"properties": {"x": 3}}}], "tools[0].input_schema.properties.x"),
        ([COOKBOOK_TOOLS[0], "search"], "tools[1]"),
        ('[{"name": "f", "name": "g"}]', "tools[0].name"),
        ("[{]", "tools"),
        ({"name": "f"}, "tools"),
    ],
)
def test_bad_tools_are_named(tools: Any, field: str) -> None:
    with pytest.raises(contextshift.InvalidTools) as err:
        contextshift.shift_context(COOKBOOK_TOOL_MESSAGES, budget=1000, tools=tools)
    assert [v.field for v in err.value.violations] == [field]


def special_aware(path: Path) -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(path))


def test_qwen_framing_is_its_chat_template() -> None:
    tok = special_aware(QWEN_JSON)
    n = lambda s: len(tok.encode(s, add_special_tokens=False).ids)  # noqa: E731
    text = "Hello there, how are you?"
    assert contextshift.count_tokens([user(text)], "qwen") == [n(f"<|im_start|>user\n{text}<|im_end|>\n")]
    # A tool result's content meets a newline on both sides; one that ends in punctuation merges
    # with the closing newline ("?\n" is one token), so 9 is the count for text ending in a word
    # and one over otherwise: the framing never under-counts.
    for content, slack in [("it is 21 degrees in Paris", 0), (text, 1)]:
        tool = {"role": "tool", "tool_call_id": "c", "content": content}
        rendered = f"<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n"
        assert contextshift.count_tokens([tool], "qwen") == [n(rendered) + slack]
    assert profiles.resolve("qwen").profile == "qwen"
    info = next(p for p in profiles.list_profiles() if p.name == "qwen")
    assert info.prompt_overhead == n("<|im_start|>assistant\n")


def deepseek_marker(name: str) -> str:
    """A DeepSeek control token, `<|User|>` spelled with full-width bars and `▁` for spaces."""
    return "<\uff5c" + name.replace(" ", "\u2581") + "\uff5c>"


def test_deepseek_framing_is_its_chat_template() -> None:
    tok = special_aware(DEEPSEEK_JSON)
    n = lambda s: len(tok.encode(s, add_special_tokens=False).ids)  # noqa: E731
    bos, eos, usr, asst = (
        deepseek_marker(m) for m in ("begin of sentence", "end of sentence", "User", "Assistant")
    )
    outputs_begin, output_begin, output_end, outputs_end = (
        deepseek_marker(f"tool {m}") for m in ("outputs begin", "output begin", "output end", "outputs end")
    )
    text = "Hello there, how are you?"
    count = lambda block: contextshift.count_tokens([block], "deepseek_v3")[0]  # noqa: E731
    assert count({"role": "system", "content": text}) == n(text)
    assert count(user(text)) == n(f"{usr}{text}")
    assert count({"role": "assistant", "content": text}) == n(f"{asst}{text}{eos}")
    outputs = f"{outputs_begin}{output_begin}{text}{output_end}{outputs_end}"
    assert count({"role": "tool", "tool_call_id": "c", "content": text}) == n(outputs)
    info = next(p for p in profiles.list_profiles() if p.name == "deepseek_v3")
    assert info.prompt_overhead == n(f"{bos}{asst}")


def image_block(width: int, height: int, detail: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}
    if detail:
        part["image_url"]["detail"] = detail
    return {"role": "user", "content": [part | {"width": width, "height": height}]}


@pytest.mark.parametrize(
    ("profile", "width", "height", "detail", "image_tokens"),
    [
        ("o200k_base", 1024, 1024, "high", 765),  # OpenAI: 4 tiles
        ("o200k_base", 2048, 4096, "high", 1105),  # OpenAI: 768x1536, 6 tiles
        ("o200k_base", 4096, 8192, "low", 85),  # OpenAI: low is flat
        ("anthropic", 1000, 1000, None, 1334),  # Anthropic: 1000*1000/750
        ("anthropic", 200, 200, None, 54),
        ("heuristic", 4096, 8192, "high", 765),  # flat
    ],
)
def test_image_costs_per_provider(
    profile: str, width: int, height: int, detail: str | None, image_tokens: int
) -> None:
    framing = 4  # every one of these profiles frames a user message with 4 tokens
    assert contextshift.count_tokens([image_block(width, height, detail)], profile) == [
        framing + image_tokens
    ]


def test_participant_names_count_only_where_the_format_renders_them() -> None:
    named = user("hi", name="alice")
    assert contextshift.count_tokens([named], "heuristic") == contextshift.count_tokens(
        [user("hi")], "heuristic"
    )
    o200k = contextshift.count_tokens([named, user("hi"), "alice"], "o200k_base")
    assert o200k[0] == o200k[1] + 1 + o200k[2]


# --- the count cache ---------------------------------------------------------------------------


@pytest.fixture
def fresh_cache() -> Iterator[None]:
    before = profiles.cache_stats().capacity_bytes
    profiles.clear_cache()
    yield
    profiles.configure_cache(before)


@pytest.mark.usefixtures("fresh_cache")
def test_count_cache_is_shared_by_shift_and_count_tokens() -> None:
    history = [user(f"message {i}: {'lorem ipsum ' * (i % 9)}") for i in range(200)]
    counts = contextshift.count_tokens(history, "o200k_base")
    cold = profiles.cache_stats()
    assert (cold.hits, cold.misses) == (0, 200)
    result = contextshift.shift_context(history, budget=10**6, profile="o200k_base")
    warm = profiles.cache_stats()
    assert warm.misses == 200, "the shift recounted nothing"
    assert warm.hits >= 400  # count + recount
    assert [d.tokens for d in result.kept] == counts
    assert 0 < warm.hit_ratio < 1
    # Only what is new is counted: one more message is one miss.
    contextshift.count_tokens([*history, user("a new question")], "o200k_base")
    assert profiles.cache_stats().misses == 201


@pytest.mark.usefixtures("fresh_cache")
def test_count_cache_bound_and_off_switch() -> None:
    profiles.configure_cache(16 * 64 * 4)  # four entries per shard
    contextshift.count_tokens([f"text {i}" for i in range(1000)], "cl100k_base")
    assert profiles.cache_stats().entries <= 64
    profiles.configure_cache(0)
    contextshift.count_tokens(["x", "x"], "cl100k_base")
    assert profiles.cache_stats().entries == 0
    with pytest.raises(contextshift.InvalidOptions):
        profiles.configure_cache(-1)


def test_heuristic_does_not_use_the_cache() -> None:
    before = profiles.cache_stats()
    contextshift.count_tokens(["some text"] * 10, "heuristic")
    after = profiles.cache_stats()
    assert (after.hits, after.misses) == (before.hits, before.misses)


@pytest.mark.usefixtures("fresh_cache")
def test_large_batches_count_in_parallel_and_agree_with_single_counts() -> None:
    profiles.configure_cache(0)  # every count below is computed, none remembered
    texts = [f"{i} " + "the quick brown fox " * (i % 50) for i in range(3000)]
    assert contextshift.count_tokens(texts, "o200k_base") == [
        contextshift.count_tokens([t], "o200k_base")[0] for t in texts
    ]


# --- calibration -------------------------------------------------------------------------------


def test_calibrator_smooths_bounds_and_clamps() -> None:
    c = calibration.Calibrator(alpha=0.5)
    assert c.factor("m") == 1.0
    assert c.record("m", 100, 120) == calibration.Calibration("m", 1.1, 1)  # 1.0 + 0.5 * (1.2 - 1.0)
    c.record("m", 100, 120)
    assert c.factor("m") == pytest.approx(1.15)
    for _ in range(50):
        c.record("m", 100, 10_000)  # each observation is clamped to 2.0 before averaging
    assert c.factor("m") == pytest.approx(2.0)
    for _ in range(50):
        c.record("m", 1000, 1)
    assert c.factor("m") == pytest.approx(0.5)
    assert c.record("m", 0, 10) is None and c.record("", 10, 10) is None and c.record("m", 10, -1) is None
    c.reset("m")
    assert c.get("m") is None


def test_calibrator_keeps_a_bounded_number_of_models() -> None:
    c = calibration.Calibrator(max_models=3)
    for m in "abcd":
        c.record(m, 100, 110)
    assert [cal.model for cal in c.snapshot()] == ["b", "c", "d"]


@pytest.mark.parametrize("factor", [0.5, 0.77, 1.0, 1.3, 2.0])
@pytest.mark.parametrize("budget", [0, 1, 7, 1000, 12_345])
def test_raw_budget_is_the_largest_raw_count_that_fits(factor: float, budget: int) -> None:
    raw = calibration.raw_budget(budget, factor)
    assert calibration.calibrated(raw, factor) <= budget
    assert calibration.calibrated(raw + 1, factor) > budget


@pytest.fixture
def calibrated_model() -> Iterator[str]:
    model = "claude-sonnet-4-5"
    calibration.DEFAULT.reset(model)
    for _ in range(40):
        calibration.record(model, estimated=1000, reported=1250)
    yield model
    calibration.DEFAULT.reset(model)


def test_shift_applies_calibration_to_approximate_profiles(calibrated_model: str) -> None:
    factor = calibration.DEFAULT.factor(calibrated_model)
    assert factor == pytest.approx(1.25, abs=0.01)
    blocks = [user("x" * 400, id=f"u{i}") for i in range(10)]  # 4 + 100 tokens each
    result = contextshift.shift_context(blocks, budget=600, model=calibrated_model)
    assert (result.profile, result.model, result.calibration_factor) == (
        "anthropic",
        calibrated_model,
        factor,
    )
    assert result.calibrated_prompt_tokens == math.ceil(result.prompt_tokens * factor - 1e-9) <= 600
    assert len(result.kept) == 4  # raw 416 -> calibrated 520 fits; 5 blocks (650) would not
    uncalibrated = contextshift.shift_context(blocks, budget=600, profile="anthropic")
    assert len(uncalibrated.kept) == 5 and uncalibrated.calibration_factor == 1.0
    with pytest.raises(contextshift.TokenBudgetExceeded) as err:
        contextshift.shift_context(blocks[:1], budget=100, model=calibrated_model)
    assert (err.value.protected_tokens, err.value.budget) == (math.ceil(104 * factor - 1e-9), 100)


def test_exact_profiles_are_never_calibrated() -> None:
    calibration.record("gpt-4o", estimated=100, reported=200)
    try:
        result = contextshift.shift_context([user("hello")], budget=1000, model="gpt-4o")
        assert (result.calibration_factor, result.calibrated_prompt_tokens) == (1.0, result.prompt_tokens)
    finally:
        calibration.DEFAULT.reset("gpt-4o")

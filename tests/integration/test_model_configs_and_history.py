"""Model configurations and stored chat history against the real server.

Budget order end to end (docs/design.md §5): the request, the stored model configuration (set through
the API or loaded from the `model_config_file`), LLM_CONTEXT_SIZE / LLM_MAX_OUTPUT_TOKENS, the
model registry, 128000 / 64000; main and fast roles; the floor warning. Stored history:
AppendBlocks, ShiftContext with `use_stored_history` (the same plan as sending everything, counts
reused, a duplicate current input dropped, errors named in the request's terms)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

import contextshift
from contextshift._proto.contextshift.v1 import block_pb2
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.cache_stable import PreviousPrompt

from .conftest import ServerProcess, serving, start_server
from .test_grpc_service import AS_JSON, TYPED, stub, violations

MODEL_FILE = """
[models."house-model"]
role = "main"
context_size = 50000
max_output_tokens = 10000
system_reserve = 1000
profile = "o200k_base"

[models."tiny-fast"]
role = "fast"
context_size = 6000
max_output_tokens = 5000
"""


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with the budget environment variables and a model configuration file."""
    tmp = tmp_path_factory.mktemp("configured")
    (tmp / "models.toml").write_text(MODEL_FILE)
    environment = {"LLM_CONTEXT_SIZE": "32000", "LLM_MAX_OUTPUT_TOKENS": "8000"}
    with serving(tmp, "--model-config-file", str(tmp / "models.toml"), env=environment) as running:
        yield running


@pytest.fixture(scope="module")
def channel(configured: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(configured.address) as chan:
        yield chan


def preview(channel: grpc.Channel, **fields: Any) -> pb.ContextPlan:
    plan: pb.ContextPlan = (
        stub(channel).PreviewContext(pb.PreviewContextRequest(blocks=TYPED, **fields), timeout=10).plan
    )
    return plan


def figures(plan: pb.ContextPlan) -> tuple[str, str, int, int, int]:
    return (plan.model, plan.profile, plan.context_limit, plan.response_reserve, plan.budget)


# --- model configurations -------------------------------------------------------------------------


def test_budget_order_request_config_environment_registry_defaults(
    channel: grpc.Channel, server: ServerProcess
) -> None:
    # The request wins over everything.
    given = preview(
        channel, model="house-model", context_limit=20_000, response_reserve=2000, system_reserve=500
    )
    assert figures(given) == ("house-model", "o200k_base", 20_000, 2000, 17_500)
    # Then the stored configuration (from the file): window, reserves and profile.
    assert figures(preview(channel, model="house-model")) == (
        "house-model",
        "o200k_base",
        50_000,
        10_000,
        39_000,
    )
    # Then LLM_CONTEXT_SIZE / LLM_MAX_OUTPUT_TOKENS, before the registry (gpt-4o: 128000 / 16384).
    assert figures(preview(channel, model="gpt-4o")) == ("gpt-4o", "o200k_base", 32_000, 8000, 24_000)
    # A configuration set through the API; a figure it leaves unset falls through to the next source.
    set_config(channel, pb.ModelConfig(model="gpt-4o", context_size=64_000))
    try:
        assert figures(preview(channel, model="gpt-4o")) == ("gpt-4o", "o200k_base", 64_000, 8000, 56_000)
    finally:
        assert (
            stub(channel).DeleteModelConfig(pb.DeleteModelConfigRequest(model="gpt-4o"), timeout=10).deleted
        )
    assert preview(channel, model="gpt-4o").context_limit == 32_000
    # Without the environment (the shared server): the registry, then the built-in defaults.
    with grpc.insecure_channel(server.address) as bare:
        assert figures(preview(bare, model="gpt-4o")) == ("gpt-4o", "o200k_base", 128_000, 16_384, 111_616)
        assert figures(preview(bare, model="no-such-model")) == (
            "no-such-model",
            "heuristic",
            128_000,
            64_000,
            64_000,
        )


def test_a_request_may_name_the_role_instead_of_the_model(channel: grpc.Channel) -> None:
    main = preview(channel, model_role=pb.MODEL_ROLE_MAIN)
    assert figures(main) == ("house-model", "o200k_base", 50_000, 10_000, 39_000)
    # The fast model's budget is its own: 6000 - 5000 is under the floor of min(4000, 6000 // 2).
    fast = preview(channel, model_role=pb.MODEL_ROLE_FAST)
    assert figures(fast) == ("tiny-fast", "heuristic", 6000, 5000, 3000)
    assert any(
        w.startswith("budget floor applied: 1000 < min(4000, context_limit // 2) = 3000")
        for w in fast.warnings
    )
    # A shift by role is audited under the model it resolved to.
    chat_id = f"role-{uuid.uuid4()}"
    reply = stub(channel).ShiftContext(
        pb.ShiftContextRequest(blocks=TYPED, chat_id=chat_id, model_role=pb.MODEL_ROLE_FAST), timeout=10
    )
    assert reply.plan.model == "tiny-fast"
    audit = stub(channel).GetContextAudit(pb.GetContextAuditRequest(chat_id=chat_id), timeout=10).audit
    assert audit.model == "tiny-fast"


def set_config(channel: grpc.Channel, config: pb.ModelConfig) -> pb.ModelConfig:
    stored: pb.ModelConfig = (
        stub(channel).SetModelConfig(pb.SetModelConfigRequest(config=config), timeout=10).config
    )
    return stored


def test_model_config_rpcs(channel: grpc.Channel) -> None:
    name = f"model-{uuid.uuid4().hex[:8]}"
    stored = set_config(channel, pb.ModelConfig(model=name, max_output_tokens=0, profile="gpt-4o"))
    assert stored.model == name and stored.HasField("update_time") and stored.HasField("max_output_tokens")
    assert not stored.HasField("context_size")
    got = stub(channel).GetModelConfig(pb.GetModelConfigRequest(model=name), timeout=10).config
    assert got == stored
    listed = stub(channel).ListModelConfigs(pb.ListModelConfigsRequest(), timeout=10).configs
    assert [c.model for c in listed] == sorted(c.model for c in listed) and stored in listed
    # A role moves: setting the fast role here takes it from tiny-fast, for every request.
    set_config(channel, pb.ModelConfig(model=name, role=pb.MODEL_ROLE_FAST, context_size=10_000))
    try:
        by_role = (
            stub(channel).GetModelConfig(pb.GetModelConfigRequest(role=pb.MODEL_ROLE_FAST), timeout=10).config
        )
        assert by_role.model == name and by_role.context_size == 10_000
        assert (
            not stub(channel)
            .GetModelConfig(pb.GetModelConfigRequest(model="tiny-fast"), timeout=10)
            .config.role
        )
        assert preview(channel, model_role=pb.MODEL_ROLE_FAST).model == name
    finally:
        set_config(
            channel,
            pb.ModelConfig(
                model="tiny-fast", role=pb.MODEL_ROLE_FAST, context_size=6000, max_output_tokens=5000
            ),
        )
    assert stub(channel).DeleteModelConfig(pb.DeleteModelConfigRequest(model=name), timeout=10).deleted
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).GetModelConfig(pb.GetModelConfigRequest(model=name), timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_configured_profile_counts_for_count_tokens_too(channel: grpc.Channel) -> None:
    response = stub(channel).CountTokens(
        pb.CountTokensRequest(items=[pb.CountItem(text="hello")], model="house-model"), timeout=10
    )
    assert (response.profile, response.approximate, list(response.counts)) == ("o200k_base", False, [1])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[models."m"]\ncolour = 1\n', "unknown keys colour"),
        ('[models."m"]\ncontext_size = "big"\n', "must be integers"),
        ('[models."m"]\nrole = "huge"\n', 'role must be "main" or "fast"'),
        ('[models."m"]\ncontext_size = 0\n', 'models."m".context_size: must be between 1'),
        ('[models."m"]\nprofile = "nope"\n', 'models."m".profile: unknown profile or model'),
        ('[models."a"]\nrole = "fast"\n[models."b"]\nrole = "fast"\n', "more than one model has role fast"),
        ("[model]\n", "expected only [models"),
        ("models = [", "models.toml"),
    ],
)
def test_a_bad_model_config_file_stops_the_start(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "models.toml").write_text(text)
    running = start_server(tmp_path, "--model-config-file", str(tmp_path / "models.toml"), wait=False)
    assert running.proc.wait(30) == 2
    (line,) = [line for line in running.log_lines() if line["msg"] == "cannot open the store"]
    assert message in line["error"]


# --- stored history -------------------------------------------------------------------------------


def test_a_shift_with_stored_history_is_the_shift_of_the_whole_conversation(channel: grpc.Channel) -> None:
    chat_id = f"history-{uuid.uuid4()}"
    # History in two appends, typed and as JSON; the counts come back per block.
    typed = stub(channel).AppendBlocks(pb.AppendBlocksRequest(chat_id=chat_id, blocks=TYPED[:3]), timeout=10)
    assert typed.block_count == 3 and typed.profile == "heuristic"
    assert list(typed.tokens) == contextshift.count_tokens(AS_JSON[:3])
    appended = stub(channel).AppendBlocks(
        pb.AppendBlocksRequest(chat_id=chat_id, blocks_json=json.dumps(AS_JSON[3:7])), timeout=10
    )
    assert appended.block_count == 7 and list(appended.tokens) == contextshift.count_tokens(AS_JSON[3:7])
    # The turn sends only its new block.
    reply = stub(channel).ShiftContext(
        pb.ShiftContextRequest(
            blocks_json=json.dumps(AS_JSON[7:]),
            chat_id=chat_id,
            use_stored_history=True,
            context_limit=1200,
            response_reserve=200,
        ),
        timeout=10,
    )
    # A chat's shift is cache-stable (its first: an empty previous prompt).
    library = contextshift.shift_context(
        AS_JSON, budget=contextshift.Budget(1200, 200), previous=PreviousPrompt()
    )
    assert [(d.id, d.tokens, d.reason) for d in reply.plan.kept] == [
        (d.id, d.tokens, d.reason) for d in library.kept
    ]
    assert [(d.id, d.reason) for d in reply.plan.excluded] == [(d.id, d.reason) for d in library.excluded]
    assert reply.plan.compaction == pb.CompactionNote(
        was_compacted=True, original_count=len(AS_JSON), compacted_count=len(library.kept)
    )
    # The stored blocks go out byte for byte as they were appended (typed ones as their JSON).
    messages = json.loads(reply.plan.messages.messages_json)
    assert [m["id"] for m in messages] == [d.id for d in library.kept]
    # The audit lists the whole conversation.
    audit = stub(channel).GetContextAudit(pb.GetContextAuditRequest(chat_id=chat_id), timeout=10).audit
    assert [b.id for b in audit.blocks] == [b["id"] for b in AS_JSON]


def test_the_current_input_sent_again_after_its_append_is_dropped(channel: grpc.Channel) -> None:
    chat_id = f"dup-{uuid.uuid4()}"
    turn = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    stub(channel).AppendBlocks(
        pb.AppendBlocksRequest(chat_id=chat_id, blocks_json=json.dumps(turn)), timeout=10
    )
    plan = (
        stub(channel)
        .PreviewContext(
            pb.PreviewContextRequest(
                blocks_json=json.dumps(turn[1:]), chat_id=chat_id, use_stored_history=True
            ),
            timeout=10,
        )
        .plan
    )
    assert [d.id for d in plan.kept] == ["#0", "#1"] and plan.compaction.original_count == 2
    assert any("repeats the stored history's last user block" in w for w in plan.warnings)
    # Not the same block: both stay (ids count the stored blocks: the new one is #2).
    other = (
        stub(channel)
        .PreviewContext(
            pb.PreviewContextRequest(
                blocks_json=json.dumps([{"role": "user", "content": "And 3 + 3?"}]),
                chat_id=chat_id,
                use_stored_history=True,
            ),
            timeout=10,
        )
        .plan
    )
    assert [d.id for d in other.kept] == ["#0", "#1", "#2"]


def test_stored_counts_serve_the_profile_they_were_made_with(channel: grpc.Channel) -> None:
    chat_id = f"counts-{uuid.uuid4()}"
    appended = stub(channel).AppendBlocks(
        pb.AppendBlocksRequest(chat_id=chat_id, blocks_json=json.dumps(AS_JSON[:7]), model="gpt-4o"),
        timeout=10,
    )
    assert appended.profile == "o200k_base"
    assert list(appended.tokens) == contextshift.count_tokens(AS_JSON[:7], "o200k_base")
    for model, profile in (("gpt-4o", "o200k_base"), ("claude-sonnet-4-5", "anthropic")):
        plan = (
            stub(channel)
            .PreviewContext(
                pb.PreviewContextRequest(
                    blocks_json=json.dumps(AS_JSON[7:]), chat_id=chat_id, use_stored_history=True, model=model
                ),
                timeout=10,
            )
            .plan
        )
        library = contextshift.shift_context(
            AS_JSON, budget=contextshift.Budget(plan.context_limit, plan.response_reserve), profile=profile
        )
        assert [(d.id, d.tokens) for d in plan.kept] == [(d.id, d.tokens) for d in library.kept]
        assert plan.prompt_tokens == library.prompt_tokens


def test_history_errors_name_what_is_wrong(channel: grpc.Channel) -> None:
    chat_id = f"errors-{uuid.uuid4()}"
    stub(channel).AppendBlocks(
        pb.AppendBlocksRequest(chat_id=chat_id, blocks_json=json.dumps(AS_JSON[:2])), timeout=10
    )
    cases: list[tuple[str, Any, set[str]]] = [
        # A block id the history holds already, named by its index in the request.
        (
            "AppendBlocks",
            pb.AppendBlocksRequest(
                chat_id=chat_id, blocks_json=json.dumps([{"id": "x", "role": "user"}, AS_JSON[0]])
            ),
            {"blocks[1].id"},
        ),
        (
            "AppendBlocks",
            pb.AppendBlocksRequest(chat_id=chat_id, blocks=[TYPED[2], block_pb2.Block(id="u9")]),
            {"blocks[1].role"},
        ),
        ("AppendBlocks", pb.AppendBlocksRequest(chat_id=chat_id, blocks_json="[1]"), {"blocks[0]"}),
        ("AppendBlocks", pb.AppendBlocksRequest(chat_id=chat_id, blocks_json="{"), {"blocks_json"}),
        ("AppendBlocks", pb.AppendBlocksRequest(chat_id=chat_id, blocks_json="[]"), {"blocks_json"}),
        (
            "ShiftContext",
            pb.ShiftContextRequest(
                chat_id=chat_id,
                use_stored_history=True,
                blocks_json=json.dumps([{"role": "robot"}, AS_JSON[1]]),
            ),
            {"blocks[0].role", "blocks[1].id"},
        ),
        (
            "ShiftContext",
            pb.ShiftContextRequest(chat_id=chat_id, use_stored_history=True, blocks=[TYPED[1]]),
            {"blocks[0].id"},
        ),
        # Text that is no JSON array gets the error it gets without history.
        (
            "ShiftContext",
            pb.ShiftContextRequest(chat_id=chat_id, use_stored_history=True, blocks_json='[{"role"'),
            {"blocks_json"},
        ),
        (
            "ShiftContext",
            pb.ShiftContextRequest(chat_id=chat_id, use_stored_history=True, blocks_json="{}"),
            {"blocks_json"},
        ),
    ]
    for rpc, request, fields in cases:
        with pytest.raises(grpc.RpcError) as caught:
            getattr(stub(channel), rpc)(request, timeout=10)
        assert set(violations(caught.value)) == fields, (rpc, request)
    # Nothing of the refused appends was stored.
    assert (
        stub(channel)
        .AppendBlocks(pb.AppendBlocksRequest(chat_id=chat_id, blocks=[TYPED[2]]), timeout=10)
        .block_count
        == 3
    )

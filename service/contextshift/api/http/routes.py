"""The routes of the HTTP/JSON surface onto the RPCs of ContextShiftService: what the app serves,
what the OpenAPI document lists, and what docs/api.md documents."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Operation:
    """A route onto one RPC of ContextShiftService."""

    http_method: str
    path: str
    rpc: str
    summary: str
    # The request field the path's `{id}` sets, if any.
    path_field: str | None = None
    # Whether the request message comes in the body (else it is empty but for `path_field` and
    # `query`).
    body: bool = True
    # The request fields the query string sets (`?page_size=10`, by the .proto's name or the JSON
    # mapping's), each at most once; any other query parameter is refused.
    query: tuple[str, ...] = ()


OPERATIONS = [
    Operation(
        "POST",
        "/api/v2/context-preview",
        "PreviewContext",
        "Runs every stage of a shift and writes nothing (PreviewContext).",
    ),
    Operation(
        "POST",
        "/api/v2/context-shift",
        "ShiftContext",
        "Fits the blocks into the budget; returns the plan and the final provider messages (ShiftContext).",
    ),
    Operation(
        "GET",
        "/api/v2/chats/{id}/context-audit",
        "GetContextAudit",
        "The last audit of a chat of the caller's tenant (GetContextAudit).",
        path_field="chat_id",
        body=False,
    ),
    Operation(
        "GET",
        "/api/v2/chats",
        "ListChats",
        "A page of the caller's tenant's chats with an audit, newest first, each with its last audit "
        "in brief (ListChats).",
        body=False,
        query=("page_size", "page_token"),
    ),
    Operation(
        "DELETE",
        "/api/v2/chats/{id}",
        "DeleteChat",
        "Deletes a chat of the caller's tenant and its audit (DeleteChat).",
        path_field="chat_id",
        body=False,
    ),
    Operation(
        "POST",
        "/api/v2/generations/{id}/finish",
        "FinishGeneration",
        "Reports how a generation ended and the provider's prompt tokens (FinishGeneration).",
        path_field="generation_id",
    ),
    Operation(
        "POST", "/api/v2/count-tokens", "CountTokens", "Counts tokens of texts or blocks (CountTokens)."
    ),
    Operation(
        "GET",
        "/api/v2/tokenizer-profiles",
        "ListTokenizerProfiles",
        "Every tokenizer profile of this server (ListTokenizerProfiles).",
        body=False,
    ),
    Operation(
        "POST",
        "/api/v2/chats/{id}/blocks",
        "AppendBlocks",
        "Stores blocks at the end of a chat's history, for use_stored_history (AppendBlocks).",
        path_field="chat_id",
    ),
    Operation(
        "GET",
        "/api/v2/model-configs",
        "ListModelConfigs",
        "Every stored model configuration of the caller's tenant (ListModelConfigs).",
        body=False,
    ),
    Operation(
        "GET",
        "/api/v2/model-configs/{id}",
        "GetModelConfig",
        "The stored configuration of a model (GetModelConfig).",
        path_field="model",
        body=False,
    ),
    Operation(
        "PUT",
        "/api/v2/model-configs",
        "SetModelConfig",
        "Creates or replaces the stored configuration of a model (SetModelConfig).",
    ),
    Operation(
        "DELETE",
        "/api/v2/model-configs/{id}",
        "DeleteModelConfig",
        "Deletes the stored configuration of a model (DeleteModelConfig).",
        path_field="model",
        body=False,
    ),
    Operation(
        "GET",
        "/api/v2/strategies",
        "ListStrategies",
        "Every strategy of this server with its options, and the common options (ListStrategies).",
        body=False,
    ),
    Operation(
        "POST",
        "/api/v2/profile-benchmarks",
        "BenchmarkProfiles",
        "Measures tokenizer profiles on the caller's documents: throughput and approximation error "
        "(BenchmarkProfiles; at most 1 MiB, about 10 seconds).",
    ),
]

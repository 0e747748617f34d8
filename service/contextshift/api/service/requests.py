"""What a request asks for, resolved as the library takes it: the model and its profile (from the
request, the model's stored configuration, the registry), the context window, the options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format, struct_pb2
from google.rpc import code_pb2

from contextshift._proto.contextshift.v1 import context_service_pb2
from contextshift.api.service.rpc_status import RequestError
from contextshift.api.service.store_view import StoreView
from contextshift.audit.store import ModelConfig, Role
from contextshift.budget import Budget, Window, resolve_window
from contextshift.errors import ErrorReason, InvalidOptions
from contextshift.options import COMMON
from contextshift.profiles import Resolution, resolve_request
from contextshift.strategies import StrategyInfo

ShiftRequest = context_service_pb2.ShiftContextRequest | context_service_pb2.PreviewContextRequest


# Why a request may not set a library-only option.
_LIBRARY_ONLY = (
    "not accepted in a request: the server's settings choose its compaction endpoint (a URL from a "
    "request would let any caller make the server connect anywhere)"
)


def options_of(struct: struct_pb2.Struct, strategy: StrategyInfo) -> dict[str, Any]:
    """The options as the library takes them: a Struct carries every number as a double, so an
    integer option's whole number becomes an int (anything else is left for validation to
    reject). Library-only options (an endpoint's URL, key, timeout) are refused."""
    options = json_format.MessageToDict(struct)
    refused = [
        (f"options.{spec.name}", _LIBRARY_ONLY)
        for spec in strategy.options
        if spec.library_only and spec.name in options
    ]
    if refused:
        raise InvalidOptions(refused)
    integers = {spec.name for spec in (*COMMON, *strategy.options) if spec.kind == "int"}
    for key in integers & options.keys():
        value = options[key]
        if isinstance(value, float) and value.is_integer():
            options[key] = int(value)
    return options


def window(
    request: ShiftRequest, resolution: Resolution, defaults: Budget, config: ModelConfig | None
) -> Window:
    """The request's window (`budget.resolve_window`): what it gives, then the model's stored
    configuration, the server's `defaults` (its settings, LLM_CONTEXT_SIZE / LLM_MAX_OUTPUT_TOKENS),
    the model registry, the built-in defaults."""
    given = Budget(
        *(
            getattr(request, name) if request.HasField(name) else None
            for name in ("context_limit", "response_reserve", "system_reserve")
        )
    )
    stored = (
        Budget(config.context_size, config.max_output_tokens, config.system_reserve) if config else Budget()
    )
    registry = Budget(resolution.context_window, resolution.max_output)
    return resolve_window(given, stored, defaults, registry)


@dataclass(frozen=True)
class Model:
    """The model a request means and how it counts: its stored configuration (by name, or by
    role), and the profile resolved from the request's profile, the configuration's, or the
    registry's."""

    config: ModelConfig | None
    resolution: Resolution


def resolve_model(profile: str, model: str, role: Role, store: StoreView) -> Model:
    """`profile`, `model` and `role` of a request, as checked (empty: not given)."""
    config = store.model_config(model, role)
    if role is not Role.NONE and config is None:
        raise RequestError(
            code_pb2.FAILED_PRECONDITION,
            f"model_role: no model configuration has role {role.value!r} (SetModelConfig or model_config_file)",
            reason=ErrorReason.MODEL_ROLE_NOT_CONFIGURED,
            metadata={"role": role.value},
        )
    # The profile wins, a model alone picks its registry profile (and window, max output), an
    # unknown model counts with heuristic and says so; empty strings mean not given.
    named = model or (config.model if config else "")
    resolution = resolve_request(profile or (config.profile if config else "") or None, named or None)
    return Model(config, resolution)

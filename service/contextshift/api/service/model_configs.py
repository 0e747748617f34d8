"""Model configurations: checked, converted to and from the proto, loaded from the TOML file named
by `model_config_file`, and looked up for a request (docs/design.md §5).

The file has one table per model:

    [models."gpt-4o"]
    role = "main"                 # or "fast"; optional
    context_size = 128000         # optional, each of these
    max_output_tokens = 16384
    system_reserve = 0
    profile = "o200k_base"

It is loaded into the default tenant "", whose configurations are the server-wide ones: a request
of any tenant falls back to them when its own tenant has none for the model or role.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api import rules
from contextshift.api.config_tables import table_problem
from contextshift.api.service.ids import timestamp
from contextshift.api.service.rpc_status import invalid
from contextshift.audit.store import ModelConfig, Role, Store
from contextshift.errors import FieldViolation, InvalidInput
from contextshift.profiles import resolve

SERVER_WIDE_TENANT = ""

# A request's ModelRole, and a stored configuration's.
ROLES = {
    pb.MODEL_ROLE_UNSPECIFIED: Role.NONE,
    pb.MODEL_ROLE_MAIN: Role.MAIN,
    pb.MODEL_ROLE_FAST: Role.FAST,
}
_ROLE_VALUES = {role: value for value, role in ROLES.items()}
# The figures and their ranges (the same rules as the API's, `rules.RULES`).
_FIGURES = {
    name: rule
    for name, rule in rules.RULES[pb.ModelConfig.DESCRIPTOR.full_name].items()
    if rule.minimum is not None
}
_FILE_KEYS = {"role", "profile", *_FIGURES}


class ModelConfigFileError(ValueError):
    """The model configuration file cannot be read or holds a bad configuration."""


def role_of(value: pb.ModelRole.ValueType, field: str) -> Role:
    if value not in ROLES:
        raise invalid(field, f"unknown value {value}")
    return ROLES[value]


def check(config: ModelConfig, prefix: str) -> list[FieldViolation]:
    """What is wrong with a configuration; fields are named `<prefix>.<field>`."""
    found = rules.id_violations(f"{prefix}.model", config.model)
    for name, rule in _FIGURES.items():
        value = getattr(config, name)
        problem = None if value is None else rules.range_problem(rule, value)
        if problem:
            found.append(FieldViolation(f"{prefix}.{name}", problem))
    if config.profile:
        try:
            resolve(config.profile)
        except InvalidInput as e:
            found.extend(FieldViolation(f"{prefix}.profile", v.description) for v in e.violations)
    return found


def from_proto(message: pb.ModelConfig) -> ModelConfig:
    return ModelConfig(
        model=message.model,
        role=role_of(message.role, "config.role"),
        context_size=message.context_size if message.HasField("context_size") else None,
        max_output_tokens=message.max_output_tokens if message.HasField("max_output_tokens") else None,
        system_reserve=message.system_reserve if message.HasField("system_reserve") else None,
        profile=message.profile,
    )


def to_proto(config: ModelConfig) -> pb.ModelConfig:
    return pb.ModelConfig(
        model=config.model,
        role=_ROLE_VALUES[config.role],
        context_size=config.context_size,
        max_output_tokens=config.max_output_tokens,
        system_reserve=config.system_reserve,
        profile=config.profile,
        update_time=timestamp(config.updated_ms),
    )


def lookup(store: Store, tenant: str, model: str, role: Role) -> ModelConfig | None:
    """The configuration a request of `tenant` naming `model` (or `role`) uses: the tenant's own,
    else the server-wide one. Blocks: run it on a thread."""
    if not model and role is Role.NONE:
        return None
    for owner in dict.fromkeys((tenant, SERVER_WIDE_TENANT)):
        found = store.get_model_config(owner, model, role)
        if found is not None:
            return found
    return None


def load_file(path: Path) -> list[ModelConfig]:
    """The configurations in a model configuration file (see the module docstring)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ModelConfigFileError(f"{path}: {e}") from None
    unknown = sorted(set(data) - {"models"})
    models = data.get("models", {})
    if unknown or not isinstance(models, dict):
        raise ModelConfigFileError(
            f'{path}: expected only [models."<name>"] tables, got {", ".join(unknown) or "models"}'
        )
    configs = [_from_table(path, name, table) for name, table in models.items()]
    roles = [c.role for c in configs if c.role is not Role.NONE]
    repeated = sorted({r.value for r in roles if roles.count(r) > 1})
    if repeated:
        raise ModelConfigFileError(f"{path}: more than one model has role {', '.join(repeated)}")
    return configs


def _from_table(path: Path, name: str, table: Any) -> ModelConfig:
    where = f'{path}: models."{name}"'
    problem = table_problem(table, _FILE_KEYS)
    if problem:
        raise ModelConfigFileError(f"{where}: {problem}")
    role, profile = table.get("role", ""), table.get("profile", "")
    if role not in {r.value for r in Role} or not isinstance(profile, str):
        raise ModelConfigFileError(f'{where}: role must be "main" or "fast", profile a string')
    if any(isinstance(table.get(k), bool) or not isinstance(table.get(k, 0), int) for k in _FIGURES):
        raise ModelConfigFileError(f"{where}: {', '.join(_FIGURES)} must be integers")
    config = ModelConfig(
        name,
        Role(role),
        table.get("context_size"),
        table.get("max_output_tokens"),
        table.get("system_reserve"),
        profile,
    )
    problems = check(config, f'models."{name}"')
    if problems:
        raise ModelConfigFileError(f"{path}: " + "; ".join(f"{v.field}: {v.description}" for v in problems))
    return config

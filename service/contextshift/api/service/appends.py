"""AppendBlocks over the store: blocks stored at the end of a chat's history, checked with it and
counted under the request's profile (`history.appended`), for shifts with `use_stored_history`."""

from __future__ import annotations

from collections.abc import Sequence

from contextshift import history, profiles
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api.service.blocks import block_dict, typed_field
from contextshift.api.service.model_configs import role_of
from contextshift.api.service.requests import resolve_model
from contextshift.api.service.rpc_status import invalid
from contextshift.api.service.store_view import TenantStore
from contextshift.history import HistoryBlock


def _stable_counts(profile: str) -> bool:
    """Whether block counts under `profile` may be stored: not for profiles read from a file that
    can change under the same name (`hf:<path>`, and `llama3` from its environment variable)."""
    return not profile.startswith(profiles.HF_PREFIX) and profile != "llama3"


def append(request: pb.AppendBlocksRequest, view: TenantStore) -> pb.AppendBlocksResponse:
    """Appends a checked request's blocks to its chat's history. Blocks: run it on a thread."""
    role = role_of(request.model_role, "model_role")
    profile = resolve_model(request.profile, request.model, role, view).resolution.profile
    typed = [block_dict(b, f"blocks[{i}]") for i, b in enumerate(request.blocks)]
    new = history.typed_texts(typed) if typed else history.request_texts(request.blocks_json.encode())
    if not new:
        raise invalid("blocks_json", "nothing to append: an empty array")
    rename = typed_field if typed else None
    counted: list[HistoryBlock] = []

    def prepare(stored: Sequence[HistoryBlock]) -> Sequence[HistoryBlock]:
        counted[:] = history.appended(stored, new, profile, rename)
        if _stable_counts(profile):
            return counted
        return [HistoryBlock(block.json) for block in counted]

    total = view.store.append_blocks(view.tenant, request.chat_id, profile, prepare)
    return pb.AppendBlocksResponse(
        block_count=total, tokens=[b.tokens or 0 for b in counted], profile=profile
    )

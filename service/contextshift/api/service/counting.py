"""CountTokens and BenchmarkProfiles over the library."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from google.rpc import code_pb2

from contextshift import profile_bench
from contextshift._proto.contextshift.v1 import context_service_pb2
from contextshift.api import rules
from contextshift.api.service.blocks import block_dict, renamed, typed_field
from contextshift.api.service.requests import resolve_model
from contextshift.api.service.rpc_status import RequestError, invalid
from contextshift.api.service.store_view import NO_STORE, StoreView
from contextshift.audit.store import Role
from contextshift.errors import InvalidInput
from contextshift.profiles import count_tokens


def count(
    request: context_service_pb2.CountTokensRequest, store: StoreView = NO_STORE
) -> context_service_pb2.CountTokensResponse:
    resolution = resolve_model(request.profile, request.model, Role.NONE, store).resolution
    items: list[str | dict[str, Any]] = []
    for i, item in enumerate(request.items):
        which = item.WhichOneof("item")
        if which == "text":
            items.append(item.text)
        elif which == "block":
            items.append(block_dict(item.block, f"items[{i}].block"))
        else:
            raise invalid(
                f"items[{i}]", rules.ONEOF_REQUIRED[context_service_pb2.CountItem.DESCRIPTOR.full_name][1]
            )
    try:
        counts = count_tokens(items, resolution.profile, model=resolution.model)
    except InvalidInput as e:
        raise renamed(e, lambda field: typed_field(field, ".block")) from e
    return context_service_pb2.CountTokensResponse(
        counts=counts,
        total=sum(counts),
        profile=resolution.profile,
        approximate=resolution.approximate,
        warnings=resolution.warnings,
    )


def benchmark_profiles(
    request: context_service_pb2.BenchmarkProfilesRequest,
) -> context_service_pb2.BenchmarkProfilesResponse:
    """Run BenchmarkProfiles: the corpus (or the sample one), bounded by `profile_bench`'s limits;
    an oversized corpus is RESOURCE_EXHAUSTED."""
    try:
        data = (
            profile_bench.corpus((f"documents[{i}]", d.encode()) for i, d in enumerate(request.documents))
            if request.documents
            else profile_bench.sample_corpus()
        )
    except profile_bench.CorpusTooLarge as e:
        raise RequestError(code_pb2.RESOURCE_EXHAUSTED, str(e)) from e
    report = profile_bench.run(data, list(request.profiles) or None)
    return context_service_pb2.BenchmarkProfilesResponse(
        documents=report.documents,
        messages=report.messages,
        bytes=report.bytes,
        throughput=[context_service_pb2.ProfileThroughput(**asdict(t)) for t in report.throughput],
        accuracy=[context_service_pb2.ProfileAccuracy(**asdict(a)) for a in report.accuracy],
        skipped=report.skipped,
    )

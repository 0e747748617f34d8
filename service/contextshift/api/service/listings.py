"""ListTokenizerProfiles and ListStrategies: what this server offers."""

from __future__ import annotations

from google.protobuf import json_format, struct_pb2

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.options import COMMON, OptionSpec
from contextshift.profiles import ProfileInfo, list_profiles
from contextshift.strategies import list_strategies

_EXACTNESS = {
    "exact": pb.EXACTNESS_EXACT,
    "text-exact": pb.EXACTNESS_TEXT_EXACT,
    "approximate": pb.EXACTNESS_APPROXIMATE,
}


def profile_message(info: ProfileInfo) -> pb.TokenizerProfile:
    return pb.TokenizerProfile(
        name=info.name,
        approximate=info.approximate,
        exactness=_EXACTNESS[info.exactness],  # a new kind of exactness must be added to the proto
        source=info.source,
        vocab_size=info.vocab_size,
        message_overhead=info.message_overhead,
        name_overhead=info.name_overhead,
        prompt_overhead=info.prompt_overhead,
        image_rule=info.image_rule,
        overhead_source=info.overhead_source,
        licence=info.licence,
        reasoning_rule=info.reasoning_rule,
        reasoning_source=info.reasoning_source,
    )


def profiles() -> pb.ListTokenizerProfilesResponse:
    return pb.ListTokenizerProfilesResponse(profiles=[profile_message(p) for p in list_profiles()])


def _option_message(spec: OptionSpec) -> pb.StrategyOption:
    default = struct_pb2.Value()
    json_format.ParseDict(spec.default, default)
    return pb.StrategyOption(
        name=spec.name, type=spec.kind, default_value=default, description=spec.description
    )


def strategies() -> pb.ListStrategiesResponse:
    return pb.ListStrategiesResponse(
        strategies=[
            pb.Strategy(
                name=s.name,
                description=s.description,
                options=[_option_message(o) for o in s.options if not o.library_only],
                builtin=s.builtin,
            )
            for s in list_strategies()
        ],
        common_options=[_option_message(o) for o in COMMON],
    )

"""Schemathesis hooks for the OpenAPI run (tests/integration/test_openapi_conformance.py): the
named strings the document marks with a `format` of its own are drawn from what this server knows,
as a client picks them from ListTokenizerProfiles and ListStrategies (and a page token as a
listing gives one)."""

from __future__ import annotations

import schemathesis
from hypothesis import strategies as st

from contextshift import profiles
from contextshift.api.service.chats import page_token
from contextshift.strategies import list_strategies

# Every profile that loads without a file of the caller's (llama3 reads one from the environment),
# and every model the registry names exactly; "" is "not given".
NAMES = sorted(
    {p.name for p in profiles.list_profiles() if p.name != "llama3"}
    | {m.match for m in profiles.list_models() if not m.match.endswith("*")}
)
schemathesis.openapi.format("contextshift-profile", st.sampled_from(["", *NAMES]))
schemathesis.openapi.format("contextshift-profile-name", st.sampled_from(NAMES))
schemathesis.openapi.format(
    "contextshift-strategy", st.sampled_from(["", *(s.name for s in list_strategies())])
)
# A page token is one a listing gave: none (the first page), or where a page starts.
schemathesis.openapi.format(
    "contextshift-page-token", st.sampled_from(["", page_token((1_700_000_000_000, "chat-1"))])
)

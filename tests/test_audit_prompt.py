"""A chat's last prompt read back from its stored audit by the core (`audit_payload.previous_prompt`,
`engine.read_previous_prompt`), against the protobuf library's reading of the same audit: the blocks
kept in order with their tokens (the summary left out), those left out with their reasons, and the
empty prompt when nothing was left out. A payload that cannot be read is StoreDamaged."""

from __future__ import annotations

import lz4.frame
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_store import generation

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api.service.audit_payload import previous_prompt
from contextshift.audit.store import StoreDamaged, StoredAudit
from contextshift.cache_stable import PreviousPrompt


def stored(audit: pb.ContextAudit) -> StoredAudit:
    return StoredAudit(lz4.frame.compress(audit.SerializeToString()), generation("g1"))


def read_by_protobuf(audit: pb.ContextAudit) -> PreviousPrompt:
    """What the audit records, read with the protobuf library (the reading before the core's)."""
    if all(b.kept for b in audit.blocks):
        return PreviousPrompt()
    summary = audit.plan.summary.id if audit.plan.HasField("summary") else None
    return PreviousPrompt(
        kept=[(b.id, b.tokens) for b in audit.blocks if b.kept and b.id != summary],
        excluded=[(b.id, b.reason) for b in audit.blocks if not b.kept],
    )


blocks = st.lists(
    st.builds(
        pb.AuditBlock,
        id=st.text(max_size=12),
        tokens=st.integers(0, 2**40),
        reason=st.sampled_from(["KEPT", "PROTECTED", "BUDGET_OLDEST_FIRST", "SUMMARIZED", "ORPHAN"]),
        kept=st.booleans(),
    ),
    max_size=40,
)


@given(blocks, st.one_of(st.none(), st.text(max_size=12)))
def test_the_core_reads_what_the_protobuf_library_reads(
    decisions: list[pb.AuditBlock], summary: str | None
) -> None:
    audit = pb.ContextAudit(generation_id="g1", chat_id="c1", blocks=decisions)
    audit.timings.shift_ms = 1.5
    if summary is not None:
        audit.plan.summary.id = summary
        audit.plan.summary.text = "[Conversation summary] ..."
    assert previous_prompt(stored(audit)) == read_by_protobuf(audit)


def test_a_cut_prompt_with_a_summary() -> None:
    audit = pb.ContextAudit(
        blocks=[
            pb.AuditBlock(id="m0", tokens=40, reason="SUMMARIZED"),
            pb.AuditBlock(id="summary", tokens=12, reason="KEPT", kept=True),
            pb.AuditBlock(id="sys", tokens=5, reason="PROTECTED", kept=True),
            pb.AuditBlock(id="m1", tokens=9, reason="KEPT", kept=True),
        ]
    )
    audit.plan.summary.id = "summary"
    assert previous_prompt(stored(audit)) == PreviousPrompt(
        kept=[("sys", 5), ("m1", 9)], excluded=[("m0", "SUMMARIZED")]
    )


def test_an_audit_that_cannot_be_read_is_store_damaged() -> None:
    encoded = pb.ContextAudit(blocks=[pb.AuditBlock(id="m0", tokens=4, reason="KEPT")]).SerializeToString()
    for payload in (lz4.frame.compress(encoded[:-3]), b"not lz4"):
        with pytest.raises(StoreDamaged, match="the audit of chat 'c1' cannot be read"):
            previous_prompt(StoredAudit(payload, generation("g1")))

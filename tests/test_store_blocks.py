"""A chat's audits store what changed (migration 4): the messages of an audit are the chat's stored
blocks, each once, in segments (the blocks one write added); a next turn writes one segment of its
new blocks and deletes the segments no longer needed, in the transaction that drops their last
reference; reading an audit rebuilds its messages byte for byte. On SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import cast

import lz4.frame
import pytest
from test_store import BACKENDS, generation, store_url

from contextshift import engine
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.audit import open_store, sql
from contextshift.audit.migrations import LATEST, MIGRATIONS
from contextshift.audit.sql import SqlStore
from contextshift.audit.store import (
    UNCHECKED,
    AuditChanged,
    AuditKey,
    GenerationIdInUse,
    ShiftRecord,
    Store,
    StoreDamaged,
    audit_key,
)

pytestmark = pytest.mark.parametrize("backend", BACKENDS)


@pytest.fixture
def store(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    opened = open_store(store_url(backend, tmp_path, request))
    opened.migrate()
    request.addfinalizer(opened.close)
    return opened


def messages(*ids: str) -> bytes:
    """Messages of these ids, each with text of its own that compresses little (hex digits)."""

    def text(block_id: str) -> str:
        return "".join(hashlib.sha256(f"{block_id}{k}".encode()).hexdigest() for k in range(4))

    return json.dumps([{"id": i, "role": "user", "content": text(i)} for i in ids]).encode()


def write(
    store: Store,
    generation_id: str,
    text: bytes,
    made_on: AuditKey | None,
    stored: engine.StoredBlocks,
    *,
    checked: bool = True,
    chat_id: str = "c1",
) -> tuple[ShiftRecord, engine.StoredBlocks]:
    """An audit whose messages are `text`, made against the chat's audit `made_on` holding `stored`."""
    refs, new, gone, held = engine.store_messages(text, stored if checked else engine.StoredBlocks())
    record = ShiftRecord(
        "",
        generation(generation_id, chat_id),
        b"payload",
        made_on if checked else UNCHECKED,
        1,
        0,
        refs,
        new,
        gone,
    )
    assert store.record_shifts([record]) == [None]
    return record, held


def segment_rows(store: Store, chat_id: str = "c1") -> set[bytes]:
    return set(cast(SqlStore, store)._run(lambda tx: sql.stored_hashes(tx, "", chat_id), write=False))


def rebuilt(store: Store, chat_id: str = "c1") -> bytes:
    stored = store.audit("", chat_id, with_blocks=True)
    assert stored is not None and stored.message_refs is not None
    return engine.rebuild_messages(stored.message_refs, stored.segments)


def test_a_next_turn_stores_only_its_new_blocks_and_drops_the_unreferenced(store: Store) -> None:
    history = [f"m{n}" for n in range(12)]
    first, held = write(store, "g1", messages(*history), None, engine.StoredBlocks())
    assert (len(first.new_segments), len(held)) == (1, 12) and rebuilt(store) == messages(*history)
    # The oldest left out, one added: a segment of the new block alone.
    history = [*history[1:], "n1"]
    second, held = write(store, "g2", messages(*history), audit_key(first.generation), held)
    assert (len(second.new_segments), second.gone_segments, len(held)) == (1, [], 13)
    assert rebuilt(store) == messages(*history)
    # The same prompt again writes no block at all.
    third, held = write(store, "g3", messages(*history), audit_key(second.generation), held)
    assert (third.new_segments, third.gone_segments) == ([], [])
    # The next addition takes the small segment in; once most of the first segment is left out,
    # what it still holds is written again too.
    history = [*history[7:], "n2"]
    fourth, held = write(store, "g4", messages(*history), audit_key(third.generation), held)
    assert (len(fourth.new_segments), len(fourth.gone_segments), len(held)) == (1, 2, len(history))
    assert segment_rows(store) == set(held.segment_hashes())
    assert rebuilt(store) == messages(*history) and store.problems() == []


def test_an_unchecked_write_finds_the_segments_it_no_longer_needs(store: Store) -> None:
    write(store, "g1", messages("a", "b"), None, engine.StoredBlocks())
    _, held = write(store, "g2", messages("b", "c"), None, engine.StoredBlocks(), checked=False)
    assert segment_rows(store) == set(held.segment_hashes()) and rebuilt(store) == messages("b", "c")
    assert store.problems() == []


def test_a_changed_audit_leaves_the_segments_as_they_were(store: Store) -> None:
    _, held = write(store, "g1", messages("a", "b"), None, engine.StoredBlocks())
    refs, new, gone, _ = engine.store_messages(messages("x"), engine.StoredBlocks())
    stale = ShiftRecord("", generation("g2"), b"payload", ("other", 1), 1, 0, refs, new, gone)
    (outcome,) = store.record_shifts([stale])
    assert isinstance(outcome, AuditChanged)
    assert segment_rows(store) == set(held.segment_hashes()) and rebuilt(store) == messages("a", "b")


def test_a_generation_id_of_another_chat_writes_no_segment(store: Store) -> None:
    write(store, "g1", messages("a"), None, engine.StoredBlocks(), chat_id="other")
    refs, new, gone, _ = engine.store_messages(messages("b"), engine.StoredBlocks())
    record = ShiftRecord("", generation("g1", "c1"), b"payload", None, 1, 0, refs, new, gone)
    (outcome,) = store.record_shifts([record])
    assert isinstance(outcome, GenerationIdInUse)
    assert segment_rows(store) == set() and store.audit("", "c1") is None


def test_deleting_a_chat_deletes_its_segments(store: Store) -> None:
    write(store, "g1", messages("a", "b"), None, engine.StoredBlocks())
    write(store, "g2", messages("a", "b"), None, engine.StoredBlocks(), chat_id="c2")
    assert store.delete_chat("", "c1")
    assert segment_rows(store) == set() and rebuilt(store, "c2") == messages("a", "b")


def test_a_missing_or_damaged_segment_is_reported_never_served_as_another(store: Store) -> None:
    write(store, "g1", messages("a", "b"), None, engine.StoredBlocks())
    some = sorted(segment_rows(store))[0]

    def damage(tx: sql.Tx) -> None:
        tx.run("UPDATE audit_segments SET data = ? WHERE segment_hash = ?", (b"not zstd", some))

    cast(SqlStore, store)._run(damage, write=True)
    with pytest.raises(StoreDamaged):
        rebuilt(store)
    assert [p for p in store.problems() if "c1" in p]

    def drop(tx: sql.Tx) -> None:
        tx.run("DELETE FROM audit_segments WHERE segment_hash = ?", (some,))

    cast(SqlStore, store)._run(drop, write=True)
    with pytest.raises(StoreDamaged, match="not stored"):
        rebuilt(store)


def test_a_store_at_version_3_moves_its_audits_messages_to_blocks_in_place(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = store_url(backend, tmp_path, request)
    previous = open_store(url)
    with monkeypatch.context() as patched:
        patched.setattr(sql, "MIGRATIONS", MIGRATIONS[:3])
        patched.setattr(sql, "LATEST", 3)
        assert previous.migrate() == 3
    # Audits as version 3 stored them: the whole ContextAudit, its messages in it, LZ4.
    audits = {}
    for n, format_ in enumerate([pb.OUTPUT_FORMAT_INPUT, pb.OUTPUT_FORMAT_OPENAI_CHAT]):
        audit = pb.ContextAudit(generation_id=f"g{n}", chat_id=f"c{n}")
        audit.plan.messages.format = format_
        audit.plan.messages.messages_json = messages(f"m{n}", "shared", "é").decode()
        audits[f"c{n}"] = audit
    omitted = pb.ContextAudit(generation_id="g9", chat_id="c9", messages_omitted=True)

    def v3(tx: sql.Tx) -> None:
        for chat_id, audit in [*audits.items(), ("c9", omitted)]:
            tx.run(
                "INSERT INTO generations (tenant, generation_id, chat_id, model, prompt_tokens, approximate, "
                "created_ms, status) VALUES ('', ?, ?, 'm', 1, ?, 1, 'PENDING')",
                (audit.generation_id, chat_id, False),
            )
            tx.run(
                "INSERT INTO audits (tenant, chat_id, generation_id, payload, created_ms) VALUES ('', ?, ?, ?, 1)",
                (chat_id, audit.generation_id, lz4.frame.compress(audit.SerializeToString())),
            )

    cast(SqlStore, previous)._run(v3, write=True)
    previous.close()

    store = open_store(url)
    request.addfinalizer(store.close)
    assert store.migrate() == LATEST and store.problems() == []
    for chat_id, audit in audits.items():
        stored = store.audit("", chat_id, with_blocks=True)
        assert stored is not None and stored.message_refs is not None
        kept = pb.ContextAudit.FromString(lz4.frame.decompress(stored.payload))
        assert (
            kept.plan.messages.messages_json == "" and kept.plan.messages.format == audit.plan.messages.format
        )
        assert engine.rebuild_messages(stored.message_refs, stored.segments).decode() == (
            audit.plan.messages.messages_json
        )
    untouched = store.audit("", "c9")
    assert untouched is not None and untouched.message_refs is None
    assert lz4.frame.decompress(untouched.payload) == omitted.SerializeToString()

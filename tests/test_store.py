"""The store protocol, the same suite against both backends: SQLite (a file in a temporary folder)
and PostgreSQL (a database of its own in the session's throwaway cluster, see postgres_cluster.py).
Audit lifecycle and status transitions, calibration, tenants, chat history and counts, model
configurations, migrations from several processes, concurrency, and the errors that say the store
cannot serve."""

from __future__ import annotations

import functools
import multiprocessing
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from postgres_cluster import Cluster, running_cluster

from contextshift.audit import default_url, open_store
from contextshift.audit.migrations import LATEST
from contextshift.audit.sqlite import SqliteStore
from contextshift.audit.store import (
    UNCHECKED,
    AlreadyFinished,
    AuditChanged,
    AuditKey,
    Finished,
    Generation,
    GenerationIdInUse,
    GenerationReport,
    ModelConfig,
    NotFound,
    Role,
    ShiftRecord,
    StaleGeneration,
    Status,
    Store,
    StoreConfigError,
    StoredAudit,
    StoreUnavailable,
    WouldWait,
    audit_key,
    now_ms,
)
from contextshift.calibration import ALPHA, Calibration
from contextshift.history import HistoryBlock

BACKENDS = ["sqlite", "postgresql"]


def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    cluster: Cluster = request.getfixturevalue("postgres")
    return cluster.new_database()


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return store_url(request.param, tmp_path, request)


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    opened = open_store(url)
    opened.migrate()
    yield opened
    assert opened.problems() == []
    opened.close()


def generation(
    generation_id: str, chat_id: str = "c1", model: str = "m", approximate: bool = True
) -> Generation:
    return Generation(generation_id, chat_id, model, 100, approximate, now_ms())


def finish(store: Store, generation_id: str, status: Status = Status.COMPLETED, **fields: Any) -> Any:
    return store.finish("", GenerationReport(generation_id, status, **fields), ALPHA)


def threads(n: int, target: Callable[[int], None]) -> None:
    """Runs `target(0..n-1)` on n threads at once; re-raises the first failure."""
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def run(i: int) -> None:
        start.wait()
        try:
            target(i)
        except BaseException as e:
            errors.append(e)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    if errors:
        raise errors[0]


# --- the audit lifecycle ------------------------------------------------------------------------


def test_audit_lifecycle_and_status_transitions(store: Store) -> None:
    assert store.audit("", "c1") is None
    store.record_shift("", generation("g1"), b"audit-1")
    stored = store.audit("", "c1")
    assert stored is not None and stored.payload == b"audit-1"
    assert (stored.generation.generation_id, stored.generation.status) == ("g1", Status.PENDING)

    done = finish(store, "g1", Status.FAILED, error_code="RATE_LIMITED")
    assert (done.generation.status, done.generation.error_code) == (Status.FAILED, "RATE_LIMITED")
    assert done.generation.finished_ms is not None
    # The same status again: accepted, nothing changes (the first error code stays).
    again = finish(store, "g1", Status.FAILED, error_code="TIMEOUT")
    assert again.generation == done.generation
    # Another status: refused, nothing changes.
    with pytest.raises(AlreadyFinished) as caught:
        finish(store, "g1", Status.COMPLETED)
    assert caught.value.status is Status.FAILED
    stored = store.audit("", "c1")
    assert stored is not None and stored.generation == done.generation


def test_a_chats_audit_is_read_at_once_only_where_the_read_cannot_wait(store: Store) -> None:
    """`audit_at_once` (the event loop's read of a cold chat): SQLite reads what `audit` reads;
    PostgreSQL, whose every read is a round trip, never reads at once."""
    store.record_shift("", generation("g1"), b"audit-1")
    if store.dialect == "postgresql":
        with pytest.raises(WouldWait):
            store.audit_at_once("", "c1")
        return
    assert store.audit_at_once("", "c1") == store.audit("", "c1")
    assert store.audit_at_once("", "none") is None


def test_sqlite_does_not_wait_to_read_at_once_while_its_file_is_busy(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    writer = SqliteStore(path)
    writer.migrate()
    writer.record_shift("", generation("g1"), b"audit-1")
    writer.close()  # its connections would keep the holder below from locking the file
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")  # no other connection may read the file
    reader = SqliteStore(path)
    try:
        started = time.monotonic()
        with pytest.raises(WouldWait):
            reader.audit_at_once("", "c1")
        assert time.monotonic() - started < 1  # its busy timeout is 5 s: it did not wait
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    stored = reader.audit_at_once("", "c1")
    assert stored is not None and stored.payload == b"audit-1"
    reader.close()


def test_a_newer_shift_replaces_the_audit_and_the_old_generation_is_stale(store: Store) -> None:
    store.record_shift("", generation("g1"), b"audit-1")
    store.record_shift("", generation("g2"), b"audit-2")
    stored = store.audit("", "c1")
    assert stored is not None and (stored.payload, stored.generation.generation_id) == (b"audit-2", "g2")
    with pytest.raises(StaleGeneration) as caught:
        finish(store, "g1", reported_prompt_tokens=150)
    assert caught.value.current == "g2"
    assert store.calibration("", "m") is None  # a stale report changes nothing at all
    assert finish(store, "g2").generation.status is Status.COMPLETED


def test_generation_ids_restart_in_their_chat_and_are_refused_in_another(store: Store) -> None:
    store.record_shift("", generation("g1"), b"audit-1")
    finish(store, "g1", reported_prompt_tokens=120)
    store.record_shift("", generation("g1"), b"audit-1b")  # a retried call starts over
    stored = store.audit("", "c1")
    assert stored is not None and stored.payload == b"audit-1b"
    assert (stored.generation.status, stored.generation.reported_prompt_tokens) == (Status.PENDING, None)
    with pytest.raises(GenerationIdInUse):
        store.record_shift("", generation("g1", chat_id="c2"), b"other")
    with pytest.raises(GenerationIdInUse):
        store.record_shift("", generation("g1", chat_id=""), None)
    assert store.audit("", "c2") is None


def test_finish_checks_the_chat_and_knows_chatless_generations(store: Store) -> None:
    store.record_shift("", generation("g1"), b"audit")
    with pytest.raises(NotFound):
        finish(store, "g1", chat_id="another-chat")
    with pytest.raises(NotFound):
        finish(store, "no-such-generation")
    store.record_shift("", generation("solo", chat_id=""), None)  # calibration only, no audit
    assert finish(store, "solo", reported_prompt_tokens=200).calibration_recorded


def test_calibration_takes_each_report_once(store: Store) -> None:
    store.record_shift("", generation("g1"), b"audit")
    status_only = finish(store, "g1")
    assert not status_only.calibration_recorded and status_only.calibration is None
    first = finish(store, "g1", reported_prompt_tokens=150)  # the same status, now with a count
    assert first.calibration_recorded and first.calibration == Calibration("m", pytest.approx(1.1), 1)
    retried = finish(store, "g1", reported_prompt_tokens=150)
    assert not retried.calibration_recorded and retried.calibration == first.calibration
    store.record_shift("", generation("g2", chat_id="c2"), b"audit")
    second = finish(store, "g2", reported_prompt_tokens=400)  # ratio 4.0, clamped to 2.0
    assert second.calibration == Calibration("m", pytest.approx(1.1 + ALPHA * (2.0 - 1.1)), 2)
    assert store.calibration("", "m") == second.calibration
    # Exact counts are the model's own; no model, no key.
    store.record_shift("", generation("exact", chat_id="c3", approximate=False), b"audit")
    assert not finish(store, "exact", reported_prompt_tokens=500).calibration_recorded
    store.record_shift("", generation("bare", chat_id="c4", model=""), b"audit")
    bare = finish(store, "bare", reported_prompt_tokens=500)
    assert not bare.calibration_recorded and bare.calibration is None


def test_concurrent_reports_are_counted_once_per_generation_and_none_is_lost(store: Store) -> None:
    for i in range(8):
        store.record_shift("", generation(f"g{i}", chat_id=f"c{i}"), b"audit")
    recorded: list[bool] = []
    # Each generation reported twice at once: one report taken per generation, all of them kept.
    threads(
        16,
        lambda i: recorded.append(
            finish(store, f"g{i % 8}", reported_prompt_tokens=150).calibration_recorded
        ),
    )
    assert sorted(recorded) == [False] * 8 + [True] * 8
    calibration = store.calibration("", "m")
    assert calibration is not None and calibration.samples == 8


# --- group commit -------------------------------------------------------------------------------


def made_on(g: Generation) -> AuditKey:
    return audit_key(g)


def group_transactions(store: Store) -> list[int]:
    """The transactions `record_shifts` runs from now on: how many records went into each try."""
    counted: list[int] = []
    run = store._run_group  # type: ignore[attr-defined]

    def counting(work: functools.partial[Any]) -> Any:
        counted.append(len(work.args[0]))
        return run(work)

    store._run_group = counting  # type: ignore[attr-defined]
    return counted


def test_a_group_of_records_is_stored_in_one_transaction(store: Store) -> None:
    records = [ShiftRecord("", generation(f"g{i}", chat_id=f"c{i}"), f"audit-{i}".encode()) for i in range(5)]
    records.append(ShiftRecord("", generation("chatless", chat_id=""), None))
    transactions = group_transactions(store)
    assert store.record_shifts(records) == [None] * 6
    assert transactions == [6]
    for i in range(5):
        stored = store.audit("", f"c{i}")
        assert stored is not None and stored.payload == f"audit-{i}".encode()
    assert finish(store, "chatless", reported_prompt_tokens=150).calibration_recorded


def test_a_record_is_stored_only_while_its_chat_has_the_audit_it_was_made_on(store: Store) -> None:
    first = generation("g1")
    assert store.record_shifts([ShiftRecord("", first, b"audit-1", None)]) == [None]  # none, as made on
    # Made on none, but the chat has an audit now: nothing stored, and the audit it has handed back.
    (changed,) = store.record_shifts([ShiftRecord("", generation("late"), b"late", None)])
    assert isinstance(changed, AuditChanged) and changed.current is not None
    assert (changed.current.payload, made_on(changed.current.generation)) == (b"audit-1", made_on(first))
    with pytest.raises(NotFound):
        finish(store, "late")  # not even its generation
    second = generation("g2")
    assert store.record_shifts([ShiftRecord("", second, b"audit-2", made_on(first))]) == [None]
    (changed,) = store.record_shifts([ShiftRecord("", generation("g3"), b"audit-3", made_on(first))])
    assert isinstance(changed, AuditChanged) and changed.current is not None
    assert changed.current.payload == b"audit-2"
    # A generation id the chat used again is another audit (its time says so).
    again = replace(second, created_ms=second.created_ms + 1)
    store.record_shift("", again, b"audit-2-again")
    (changed,) = store.record_shifts([ShiftRecord("", generation("g4"), b"audit-4", made_on(second))])
    assert isinstance(changed, AuditChanged)
    # Finished is still the same audit; deleted is none.
    finish(store, "g2")
    assert store.record_shifts([ShiftRecord("", generation("g5"), b"audit-5", made_on(again))]) == [None]
    store.delete_chat("", "c1")
    (changed,) = store.record_shifts([ShiftRecord("", generation("g6"), b"audit-6", made_on(again))])
    assert isinstance(changed, AuditChanged) and changed.current is None
    # Unchecked: the last write wins.
    assert store.record_shifts([ShiftRecord("", generation("g7"), b"audit-7", UNCHECKED)]) == [None]
    stored = store.audit("", "c1")
    assert stored is not None and stored.payload == b"audit-7"


def test_records_of_one_chat_in_a_group_follow_each_other(store: Store) -> None:
    base, first, second, third = (generation(f"g{i}") for i in range(4))
    store.record_shift("", base, b"audit-0")
    outcomes = store.record_shifts(
        [
            ShiftRecord("", first, b"audit-1", made_on(base)),
            ShiftRecord("", second, b"audit-2", made_on(base)),  # made on the audit the first replaced
            ShiftRecord("", third, b"audit-3", made_on(first)),
        ]
    )
    assert outcomes[0] is None and outcomes[2] is None
    changed = outcomes[1]
    assert isinstance(changed, AuditChanged) and changed.current == StoredAudit(b"audit-1", first)
    stored = store.audit("", "c1")
    assert stored is not None and stored.payload == b"audit-3"
    with pytest.raises(NotFound):
        finish(store, "g2")


def test_a_record_that_cannot_be_stored_leaves_its_group_stored(store: Store) -> None:
    store.record_shift("", generation("taken", chat_id="other"), b"audit")
    outcomes = store.record_shifts(
        [
            ShiftRecord("", generation("ok-1", chat_id="a"), b"audit-a"),
            ShiftRecord("", generation("taken", chat_id="b"), b"audit-b"),
            ShiftRecord("", generation("ok-2", chat_id="c"), b"audit-c"),
        ]
    )
    assert outcomes[0] is None and isinstance(outcomes[1], GenerationIdInUse) and outcomes[2] is None
    assert store.audit("", "b") is None
    assert [store.audit("", chat) is not None for chat in "ac"] == [True, True]


def test_concurrent_writers_never_both_replace_one_audit(store: Store, url: str) -> None:
    """Writers in threads over two store objects (two processes' connections): each shifts chats
    against the audit it last saw, as a worker does. Of the records made on one audit, at most one
    is stored: no update is lost, whoever commits first."""
    stores = [open_store(url), open_store(url)]
    stored: list[ShiftRecord] = []
    changed = 0
    lock = threading.Lock()

    def writer(n: int) -> None:
        nonlocal changed
        store = stores[n % 2]
        seen: dict[str, AuditKey | None] = {}
        for op in range(30):
            chat_id = f"c{(n + op) % 3}"
            g = generation(f"w{n}-{op}", chat_id=chat_id)
            group = [ShiftRecord("", g, g.generation_id.encode(), seen.get(chat_id))]
            (outcome,) = store.record_shifts(group)
            with lock:
                if outcome is None:
                    stored.append(group[0])
                    seen[chat_id] = made_on(g)
                else:
                    assert isinstance(outcome, AuditChanged), outcome
                    changed += 1
                    current = outcome.current
                    seen[chat_id] = made_on(current.generation) if current else None

    try:
        threads(8, writer)
        assert changed > 0, "no write ever found its chat changed: the test exercised nothing"
        for chat_id in ("c0", "c1", "c2"):
            records = {r.made_on: r for r in stored if r.generation.chat_id == chat_id}
            assert len(records) == sum(r.generation.chat_id == chat_id for r in stored)  # one per audit
            # So the chat's audits follow each other from none to the one it has, every one stored.
            at: AuditKey | None = None
            for _ in records:
                at = made_on(records[at].generation)
            current = stores[0].audit("", chat_id)
            assert current is not None and made_on(current.generation) == at
    finally:
        for opened in stores:
            opened.close()


# --- tenants ------------------------------------------------------------------------------------


def test_tenants_never_see_each_other(store: Store) -> None:
    for tenant, payload in (("a", b"audit-a"), ("b", b"audit-b")):
        store.record_shift(tenant, generation("g1"), payload)  # the same chat and generation ids
        store.append_blocks(
            tenant, "c1", "heuristic", lambda _, t=tenant: [HistoryBlock(f'{{"id": "{t}"}}', 1)]
        )
        store.set_model_config(
            tenant, ModelConfig("m", Role.MAIN, context_size=1000 if tenant == "a" else 2000)
        )
    assert store.audit("", "c1") is None and store.history("", "c1", "heuristic") == []
    a, b = store.audit("a", "c1"), store.audit("b", "c1")
    assert a is not None and b is not None and (a.payload, b.payload) == (b"audit-a", b"audit-b")

    finish_a = store.finish("a", GenerationReport("g1", Status.FAILED, reported_prompt_tokens=150), ALPHA)
    assert finish_a.calibration_recorded
    b = store.audit("b", "c1")
    assert b is not None and b.generation.status is Status.PENDING
    assert store.calibration("b", "m") is None and store.calibration("a", "m") is not None
    config_a, config_b = store.get_model_config("a", role=Role.MAIN), store.get_model_config("b", "m")
    assert config_a is not None and config_b is not None
    assert (config_a.context_size, config_b.context_size) == (1000, 2000)
    assert store.model_configs("") == []

    assert store.delete_chat("a", "c1")
    assert store.audit("a", "c1") is None and store.history("a", "c1", "heuristic") == []
    assert store.audit("b", "c1") is not None
    assert store.history("b", "c1", "heuristic") == [HistoryBlock('{"id": "b"}', 1)]
    with pytest.raises(NotFound):
        store.finish("a", GenerationReport("g1", Status.FAILED), ALPHA)
    assert store.delete_model_config("a", "m") and store.get_model_config("b", "m") is not None


# --- chats and their history --------------------------------------------------------------------


def test_delete_chat_removes_audit_generations_history_and_counts(store: Store) -> None:
    store.record_shift("", generation("g1"), b"audit-1")
    store.record_shift("", generation("g2"), b"audit-2")
    store.append_blocks("", "c1", "heuristic", lambda _: [HistoryBlock("{}", 5), HistoryBlock("[]", 6)])
    store.record_shift("", generation("kept", chat_id="c2"), b"other chat")
    assert store.delete_chat("", "c1")
    assert store.audit("", "c1") is None and store.history("", "c1", "heuristic") == []
    for generation_id in ("g1", "g2"):
        with pytest.raises(NotFound):
            finish(store, generation_id)
    assert not store.delete_chat("", "c1")  # nothing left: not an error
    assert store.audit("", "c2") is not None


def test_history_keeps_order_and_counts_per_profile(store: Store) -> None:
    seen: list[list[HistoryBlock]] = []

    def append(*blocks: HistoryBlock) -> Callable[[Any], list[HistoryBlock]]:
        def prepare(stored: Any) -> list[HistoryBlock]:
            seen.append(list(stored))
            return list(blocks)

        return prepare

    assert store.append_blocks("", "c1", "heuristic", append(HistoryBlock('{"n": 0}', 10))) == 1
    assert (
        store.append_blocks(
            "", "c1", "heuristic", append(HistoryBlock('{"n": 1}', 11), HistoryBlock('{"n": 2}'))
        )
        == 3
    )
    assert store.append_blocks("", "c1", "o200k_base", append(HistoryBlock('{"n": 3}', 13))) == 4
    assert seen[1] == [HistoryBlock('{"n": 0}', 10)]  # the stored history, with counts for the profile
    assert store.history("", "c1", "heuristic") == [
        HistoryBlock('{"n": 0}', 10),
        HistoryBlock('{"n": 1}', 11),
        HistoryBlock('{"n": 2}'),
        HistoryBlock('{"n": 3}'),
    ]
    assert [b.tokens for b in store.history("", "c1", "o200k_base")] == [None, None, None, 13]

    def refuse(stored: Any) -> list[HistoryBlock]:
        raise ValueError("bad block")

    with pytest.raises(ValueError, match="bad block"):
        store.append_blocks("", "c1", "heuristic", refuse)
    assert len(store.history("", "c1", "heuristic")) == 4  # nothing of a refused append


def test_concurrent_appends_to_one_new_chat_queue(store: Store) -> None:
    threads(
        8,
        lambda i: store.append_blocks("", "fresh", "heuristic", lambda _: [HistoryBlock(f'{{"n": {i}}}', i)]),
    )
    blocks = store.history("", "fresh", "heuristic")
    assert sorted(b.tokens or 0 for b in blocks) == list(range(8))


# --- model configurations -----------------------------------------------------------------------


def test_model_configs_and_their_roles(store: Store) -> None:
    first = store.set_model_config("", ModelConfig("big", Role.MAIN, 200_000, 32_000, 4000, "o200k_base"))
    assert first.updated_ms > 0 and store.get_model_config("", "big") == first
    store.set_model_config("", ModelConfig("small", Role.FAST, 16_000))
    # Taking a role takes it from the configuration that held it.
    store.set_model_config("", ModelConfig("bigger", Role.MAIN, 1_000_000))
    main = store.get_model_config("", role=Role.MAIN)
    assert main is not None and main.model == "bigger"
    assert [(c.model, c.role) for c in store.model_configs("")] == [
        ("big", Role.NONE),
        ("bigger", Role.MAIN),
        ("small", Role.FAST),
    ]
    # Replacing a configuration replaces all of it.
    store.set_model_config("", ModelConfig("small"))
    assert store.get_model_config("", role=Role.FAST) is None
    assert store.delete_model_config("", "small") and not store.delete_model_config("", "small")
    assert store.get_model_config("", "small") is None


def test_prune_keeps_every_chats_current_generation(store: Store) -> None:
    store.record_shift("", generation("old"), b"audit-1")
    store.record_shift("", generation("current"), b"audit-2")
    store.record_shift("", generation("solo", chat_id=""), None)
    assert store.prune_generations(now_ms() + 1) == 2
    assert finish(store, "current").generation.status is Status.COMPLETED
    with pytest.raises(NotFound):
        finish(store, "old")


# --- schema -------------------------------------------------------------------------------------


def _migrate(url: str) -> int:
    store = open_store(url)
    try:
        return store.migrate()
    finally:
        store.close()


def test_migrations_run_once_from_processes_starting_together(url: str) -> None:
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        assert pool.map(_migrate, [url] * 4) == [LATEST] * 4
    store = open_store(url)
    try:
        versions = store._run(lambda tx: tx.rows("SELECT version FROM contextshift_schema"), write=False)  # type: ignore[attr-defined]
        assert [v for (v,) in versions] == list(range(1, LATEST + 1))
        assert store.problems() == []
    finally:
        store.close()


def test_a_schema_newer_than_this_code_is_refused(store: Store) -> None:
    store._run(  # type: ignore[attr-defined]
        lambda tx: tx.run("INSERT INTO contextshift_schema VALUES (?, 'from the future', 0)", (LATEST + 1,)),
        write=True,
    )
    with pytest.raises(StoreConfigError, match="newer than this contextshift"):
        store.migrate()


# --- PostgreSQL races, made to happen ------------------------------------------------------------
# A transaction of the test's own holds a row one store call needs, so that call stops at a known
# point; a second call then runs against it. pg_stat_activity says when a call waits for a lock.


class Background:
    """A call on a thread of its own; its outcome is what it returned or raised."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._outcome: list[Any] = []
        self._thread = threading.Thread(target=self._run, args=(call,))
        self._thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self._outcome.append(call())
        except Exception as e:
            self._outcome.append(e)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def outcome(self) -> Any:
        self._thread.join(60)
        assert self._outcome, "the call never returned"
        return self._outcome[0]


def lock_waiters(watcher: psycopg.Connection[Any]) -> int:
    """Sessions of the watcher's database waiting for a lock (the watcher is in autocommit, so
    each query reads fresh statistics)."""
    ((count,),) = watcher.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchall()
    return int(count)


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


@pytest.fixture
def pg(postgres: Cluster) -> Iterator[tuple[Store, str]]:
    """A migrated PostgreSQL store of its own, and its URL."""
    url = postgres.new_database()
    opened = open_store(url)
    opened.migrate()
    yield opened, url
    opened.close()


def test_postgresql_a_newer_shift_never_commits_inside_a_finish_of_the_generation_it_replaces(
    pg: tuple[Store, str],
) -> None:
    store, url = pg
    store.record_shift("", generation("seed", chat_id="other"), b"seed")
    finish(store, "seed", reported_prompt_tokens=150)  # the model's calibration row exists
    before = store.calibration("", "m")
    store.record_shift("", generation("g1"), b"audit-1")
    with psycopg.connect(url, autocommit=True) as watcher, psycopg.connect(url) as holder:
        # A finish locks the calibration row after it found its generation current: it stops there.
        holder.execute("SELECT 1 FROM calibrations WHERE tenant = '' AND model = 'm' FOR UPDATE")
        finishing = Background(lambda: finish(store, "g1", reported_prompt_tokens=300))
        until(lambda: lock_waiters(watcher) >= 1, "the finish waits for the calibration row")
        shifting = Background(lambda: store.record_shift("", generation("g2"), b"audit-2"))
        until(lambda: shifting.done() or lock_waiters(watcher) >= 2, "the shift commits or waits")
        shifted_first = shifting.done()
        holder.rollback()
        finished, shifted = finishing.outcome(), shifting.outcome()
    assert shifted is None
    if shifted_first:
        # The shift committed first: the finish must then see g1 as stale and change nothing.
        assert isinstance(finished, StaleGeneration), "a replaced generation was finished"
        assert store.calibration("", "m") == before
    else:  # the shift waited: the finish came first, and was right to take the report
        assert isinstance(finished, Finished) and finished.calibration_recorded
    stored = store.audit("", "c1")
    assert stored is not None and (stored.payload, stored.generation.status) == (b"audit-2", Status.PENDING)
    assert store.problems() == []


def test_postgresql_a_delete_never_commits_inside_an_append_to_its_chat(pg: tuple[Store, str]) -> None:
    store, url = pg
    store.append_blocks(
        "", "c1", "heuristic", lambda _: [HistoryBlock('{"n": 0}', 1), HistoryBlock('{"n": 1}', 1)]
    )
    with psycopg.connect(url, autocommit=True) as watcher, psycopg.connect(url) as holder:
        # An uncommitted row at the position the append writes next: the append, having read the
        # history, waits there.
        holder.execute(
            "INSERT INTO chat_blocks (tenant, chat_id, position, block_json) VALUES ('', 'c1', 2, '{}')"
        )
        appending = Background(
            lambda: store.append_blocks("", "c1", "heuristic", lambda _: [HistoryBlock('{"n": 2}', 1)])
        )
        until(lambda: lock_waiters(watcher) >= 1, "the append waits at position 2")
        deleting = Background(lambda: store.delete_chat("", "c1"))
        until(lambda: deleting.done() or lock_waiters(watcher) >= 2, "the delete commits or waits")
        holder.rollback()
        assert appending.outcome() == 3 and deleting.outcome() is True
    # The delete went after the append, whole: no tail left at positions past a deleted head.
    assert store.problems() == []
    assert store.history("", "c1", "heuristic") == []


@pytest.mark.postgres
def test_postgresql_plans_each_join_for_its_tables_as_they_are(postgres: Cluster) -> None:
    # A plan PostgreSQL keeps for a prepared statement is made for the tables as they were: a join
    # of a chat's audit to its generation planned while a new store was nearly empty read every
    # generation, slower with each call (benchmarks/audit_path.py). Joins are planned each time;
    # statements on one table, which go by their key, are prepared as psycopg does by default.
    store = open_store(postgres.new_database(), pool_size=1)
    store.migrate()
    try:
        for turn in range(12):
            for chat in ("a", "b"):
                store.record_shift("", generation(f"{chat}{turn}", chat_id=chat), f"audit-{turn}".encode())
                assert store.audit("", chat) is not None
        prepared = store._run(lambda tx: tx.rows("SELECT statement FROM pg_prepared_statements"), write=False)  # type: ignore[attr-defined]
        assert prepared, "statements on one table are prepared"
        assert [s for (s,) in prepared if "JOIN" in s] == []
    finally:
        store.close()


@pytest.mark.postgres
def test_postgresql_pooled_connections_outlive_a_restart_of_the_database() -> None:
    # A cluster of its own: restarting the session's would cut off the other tests' stores.
    with running_cluster() as cluster:
        store = open_store(cluster.new_database(), pool_size=4)
        try:
            store.migrate()
            store.record_shift("", generation("g1"), b"audit-1")
            # Four calls at once: the pool holds four connections, each of which the restart ends.
            together = threading.Barrier(4)
            threads(4, lambda _: store._run(lambda tx: together.wait(30), write=False))  # type: ignore[attr-defined]
            cluster.restart()
            for _ in range(8):  # more calls than the pool has connections: none of them fails
                stored = store.audit("", "c1")
                assert stored is not None and stored.payload == b"audit-1"
            assert finish(store, "g1").generation.status is Status.COMPLETED
        finally:
            store.close()


# --- URLs and failures --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://localhost/db", "unknown scheme 'mysql'"),
        ("sqlite:x.db", "unknown scheme 'sqlite'; use a file path, sqlite:///<path>"),
        ("sqlite:///", "name a database file"),
        ("sqlite:///:memory:", "name a database file"),
        ("sqlite:///x.db?journal=off", "unknown options journal"),
        ("sqlite:///x.db?synchronous=off", "synchronous must be one of normal, full"),
        ("sqlite:///x.db?busy_timeout_ms=soon", "busy_timeout_ms must be a number"),
        ("postgresql://localhost:abc/db", "port 'abc' is not a port number"),
        ("postgres://a:5432,b:70000/db", "port '70000' is not a port number"),
        ("postgresql://localhost/db?no_such_option=1", 'invalid URI query parameter: "no_such_option"'),
        ("postgresql://[::1/db", "IPv6 host address"),
    ],
)
def test_bad_store_urls(url: str, message: str) -> None:
    with pytest.raises(StoreConfigError, match=re.escape(message)):
        open_store(url)


def test_a_bare_path_is_a_sqlite_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for given, path in [
        ("relative.db", tmp_path / "relative.db"),
        (str(tmp_path / "absolute.db"), tmp_path / "absolute.db"),
        ("~/in-home.db?synchronous=full", tmp_path / "home" / "in-home.db"),
    ]:
        store = open_store(given)
        try:
            assert isinstance(store, SqliteStore)
            assert store.migrate() == LATEST and path.resolve() == store.path.resolve()
        finally:
            store.close()
        assert path.is_file(), given


def test_the_default_url_is_in_the_data_directory() -> None:
    assert (
        default_url({"XDG_DATA_HOME": "/x/data", "HOME": "/h"})
        == "sqlite:////x/data/contextshift/contextshift.db"
    )
    # The XDG spec: a relative XDG_DATA_HOME is ignored.
    for env in ({"HOME": "/h"}, {"XDG_DATA_HOME": "data", "HOME": "/h"}):
        assert default_url(env) == "sqlite:////h/.local/share/contextshift/contextshift.db"


@pytest.mark.parametrize(
    "url", ["postgresql://someone:hunter2@[::1/db", "postgresql://someone:hunter2%zz@localhost/db"]
)
def test_a_malformed_postgresql_url_is_refused_without_its_password(url: str) -> None:
    with pytest.raises(StoreConfigError) as caught:
        open_store(url)
    assert "hunter2" not in str(caught.value) and "***" in str(caught.value)


def test_unreachable_postgresql_is_unavailable_with_the_reason() -> None:
    with socket_closed_port() as port:
        store = open_store(f"postgresql://nobody:secret@127.0.0.1:{port}/db")
        with pytest.raises(StoreUnavailable, match="cannot connect to PostgreSQL") as caught:
            store.migrate()
    assert "secret" not in str(caught.value) and "***" in str(caught.value)


class socket_closed_port:
    """A port nothing listens on, for as long as the block runs."""

    def __enter__(self) -> int:
        import socket

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        return int(self._sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


def test_sqlite_locked_past_its_busy_timeout_is_unavailable_and_writes_nothing(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db", busy_timeout_ms=100)
    store.migrate()
    holder = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreUnavailable, match="locked"):
            store.record_shift("", generation("g1"), b"audit")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.audit("", "c1") is None
    store.record_shift("", generation("g1"), b"audit")  # and works once the lock is gone
    store.close()


@pytest.mark.parametrize(("synchronous", "level"), [("normal", 1), ("full", 2)])
def test_sqlite_connections_are_set_up_each_time(tmp_path: Path, synchronous: str, level: int) -> None:
    store = open_store(f"sqlite:///{tmp_path}/store.db?synchronous={synchronous}&busy_timeout_ms=1234")
    assert isinstance(store, SqliteStore)
    store.migrate()
    settings: list[tuple[Any, ...]] = []

    def read(_: int) -> None:  # each thread opens its own connection
        connection = store._connection()
        settings.append(
            tuple(
                connection.execute(f"PRAGMA {name}").fetchone()[0]
                for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
            )
        )

    threads(3, read)
    assert settings == [("wal", level, 1, 1234)] * 3
    store.close()


def test_a_forked_process_never_uses_its_parents_sqlite_connection(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")
    store.migrate()
    parent_connection = store._connection()
    context = multiprocessing.get_context("fork")
    answers = context.Queue()

    def child() -> None:  # inherits the store, and its parent's thread-local connection, by fork
        store.record_shift("", generation("from-child", chat_id="child"), b"child")
        answers.put(
            store._connection() is not parent_connection and store._local.connection[0] == os.getpid()
        )

    process = context.Process(target=child)
    process.start()
    assert answers.get(timeout=30) is True
    process.join(30)
    assert process.exitcode == 0
    assert store.audit("", "child") is not None
    assert store._connection() is parent_connection
    store.close()


def test_missing_postgresql_binaries_fail_with_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import postgres_cluster

    monkeypatch.setattr(postgres_cluster, "INSTALLED", tmp_path)
    with pytest.raises(pytest.fail.Exception, match="install the `postgresql` package"):
        postgres_cluster.binaries()

"""`AuditWrite`: who writes and who marks CANCELLED when a ShiftContext call is cancelled before,
during or after its engine thread writes the audit (the integration tests reach the first two with
a real server; the third is a window too narrow to hit on purpose)."""

from __future__ import annotations

from contextshift.api.service.audit_payload import AuditWrite


def test_not_cancelled_the_thread_writes_and_nobody_marks() -> None:
    write = AuditWrite()
    assert write.begin()
    assert not write.end()


def test_cancelled_before_the_write_nothing_is_written() -> None:
    write = AuditWrite()
    assert not write.cancel()
    assert not write.begin()


def test_cancelled_during_the_write_the_thread_marks_it() -> None:
    write = AuditWrite()
    assert write.begin()
    assert not write.cancel()  # the call leaves it to the thread
    assert write.end()


def test_cancelled_after_the_write_the_call_marks_it() -> None:
    write = AuditWrite()
    assert write.begin()
    assert not write.end()
    assert write.cancel()

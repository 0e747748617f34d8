"""`make test` checks the machine's tools first (tests/prerequisites.py) and names the one command
that installs what is missing."""

from __future__ import annotations

import prerequisites
import pytest


def test_missing_debian_packages_are_named_with_one_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    present = {"chromium": False, "postgresql": True, "haproxy": True, "wrk": True, "libsqlite3-dev": True}
    monkeypatch.setattr(
        prerequisites,
        "DEBIAN",
        {name: (why, lambda name=name: present[name]) for name, (why, _) in prerequisites.DEBIAN.items()},
    )
    lines = prerequisites.missing()
    assert [line for line in lines if "apt-get" in line] == [
        "missing: chromium (the preview page's browser test); as root: apt-get install -y chromium"
    ]


def test_an_old_go_is_named_with_the_version_wanted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prerequisites, "_go_version", lambda: (1, 19))
    wanted = ".".join(map(str, prerequisites._go_wanted()))
    assert any(f"Go {wanted} or newer (found 1.19" in line for line in prerequisites.missing())

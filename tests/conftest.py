"""Shared pytest setup: import paths for the test helpers, hypothesis profiles, the tiers' markers,
and the fake LLM endpoint.

Tiers: every test in tests/integration is marked `integration` (servers in their own processes,
Go, Chromium, HAProxy), and every test that needs PostgreSQL `postgres` (it uses the `postgres`
fixture, or is parametrized over the backends). `make test-fast` runs the rest.

Profiles (choose with HYPOTHESIS_PROFILE=<name>):
- ``default``: deterministic (derandomized), no deadline; what CI runs.
- ``thorough``: ten times the examples (``conversations.examples``), still deterministic; a soak.
- ``random``: fresh random examples each run (not derandomized), to hunt for new failures.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# tests/reference, tests/conversations.py and tests/postgres_cluster.py are imported as top-level
# modules.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from postgres_cluster import Cluster, running_cluster

from contextshift.audit.sqlite import SqliteStore

_COMMON = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)
settings.register_profile("default", _COMMON, derandomize=True, database=None)
settings.register_profile("thorough", _COMMON, derandomize=True, database=None)
settings.register_profile("random", _COMMON, derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    integration = Path(__file__).resolve().parent / "integration"
    for item in items:
        if integration in item.path.parents:
            item.add_marker(pytest.mark.integration)
        callspec = getattr(item, "callspec", None)
        uses = getattr(item, "fixturenames", ())
        if "postgres" in uses or (callspec is not None and "postgresql" in callspec.id.split("-")):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SqliteStore]:
    """A migrated SQLite store of its own."""
    opened = SqliteStore(tmp_path / "store.db")
    opened.migrate()
    yield opened
    opened.close()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Cluster]:
    """A PostgreSQL cluster of the test session's own (see tests/postgres_cluster.py)."""
    with running_cluster() as cluster:
        yield cluster


from fake_llm import FakeLlm  # noqa: E402  (on the path inserted above)


@pytest.fixture
def fake_llm() -> Iterator[FakeLlm]:
    """An OpenAI-compatible endpoint on 127.0.0.1 (tests/fake_llm.py), answering well until told
    otherwise."""
    fake = FakeLlm()
    yield fake
    fake.close()

"""docs/api.md documents the whole API (that it is current is tested with the generated code, in
test_grpc_proto.py)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_reference_documents_every_rpc_field_and_route() -> None:
    from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
    from contextshift.api.http.routes import OPERATIONS

    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    for method in pb.DESCRIPTOR.services_by_name["ContextShiftService"].methods:
        assert f"`{method.name}`" in api
    for field in pb.ContextPlan.DESCRIPTOR.fields:
        assert f"| `{field.name}` |" in api
    for op in OPERATIONS:
        assert f"| `{op.http_method}` | `{op.path}` |" in api


DESIGN = ROOT / "docs" / "design.md"


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


README = ROOT / "README.md"
README_MAX_LINES = 450


def _relative_links(page: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8"))


def test_every_relative_link_in_the_docs_resolves() -> None:
    """The README, CONTRIBUTING and docs/ link only to files in the repository (DESIGN was once
    linked outside)."""
    for page in [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in _relative_links(page):
            if target.startswith(("http://", "https://", "#", "mailto:")):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            assert path.exists(), f"{page.name}: {target}"
            assert ROOT in path.parents, f"{page.name}: {target} is outside the repository"


def test_the_readme_is_a_manual_of_at_most_450_lines() -> None:
    """The README is the manual; detail goes to a docs/ page it links, history to docs/benchmarks.md."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, over {README_MAX_LINES}"


def test_the_readme_links_every_docs_page_and_contributing() -> None:
    """Each page under docs/ and CONTRIBUTING.md is reachable from the README, by a link that resolves
    (what a page moved out of the README must stay)."""
    linked = {
        (ROOT / target.split("#", 1)[0]).resolve()
        for target in _relative_links(README)
        if not target.startswith(("http://", "https://", "#", "mailto:"))
    }
    pages = [ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = [str(page.relative_to(ROOT)) for page in pages if page.resolve() not in linked]
    assert not missing, f"not linked from README.md: {missing}"
    assert all(page.exists() for page in linked), sorted(str(p) for p in linked if not p.exists())


def test_the_design_lists_exactly_the_reason_codes_the_code_gives() -> None:
    """The design's table lists every reason a decision can give, and its sentence on truncations
    every way a cut says how: the vocabulary of `contextshift.reasons` (the core's own list, see
    test_reasons.py), nothing more, nothing less."""
    from contextshift import reasons

    section = _section(DESIGN.read_text(encoding="utf-8"), "## 6. The shift")
    listed = set(re.findall(r"^\| `([A-Z_]+)` \|", section, re.MULTILINE))
    hows_sentence = re.search(r"Truncations say how: (.*?)\.\s*$", section, re.DOTALL)
    assert hows_sentence is not None
    hows = set(re.findall(r"`([A-Z_]+)`", hows_sentence.group(1)))
    assert listed == reasons.KEPT | reasons.EXCLUDED
    assert hows == reasons.TRUNCATIONS


def test_the_design_names_the_stages_as_the_readme_does() -> None:
    design = re.findall(
        r"^\d\. \*\*(\w+)\*\*", _section(DESIGN.read_text(encoding="utf-8"), "## 6."), re.MULTILINE
    )
    readme = re.findall(r"^ \d (\w+) ─", (ROOT / "README.md").read_text(encoding="utf-8"), re.MULTILINE)
    assert design == readme == ["resolve", "cap", "pins", "plan", "repair", "recount"]


def test_the_design_lists_every_rpc_and_every_builtin_strategy() -> None:
    from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
    from contextshift.strategies import list_strategies

    text = DESIGN.read_text(encoding="utf-8")
    rpcs = set(re.findall(r"^\| `(\w+)` \|", _section(text, "## 9."), re.MULTILINE))
    assert rpcs == {m.name for m in pb.DESCRIPTOR.services_by_name["ContextShiftService"].methods}
    strategies = set(re.findall(r"^- `([\w-]+)`:", _section(text, "## 7."), re.MULTILINE))
    assert strategies == {s.name for s in list_strategies() if s.builtin}


def test_the_design_states_the_defaults_the_code_has() -> None:
    from contextshift import budget, cache_stable
    from contextshift.options import COMMON

    text = " ".join(DESIGN.read_text(encoding="utf-8").split())
    defaults = {o.name: o.default for o in COMMON}
    for figure in (
        budget.DEFAULT_CONTEXT_LIMIT,
        budget.DEFAULT_RESPONSE_RESERVE,
        defaults["max_block_chars"],
    ):
        assert f"{figure:,}" in text, figure
    assert f"min({budget.FLOOR_CAP}, context_limit // 2)" in text
    assert "a quarter of the limit" in text and budget.DEFAULT_RESERVE_SHARE == 4
    assert f"`pinned_cap` (default {defaults['pinned_cap']})" in text
    assert f"defaults to {cache_stable.TARGET_RATIO} rather than {defaults['target_ratio']}" in text

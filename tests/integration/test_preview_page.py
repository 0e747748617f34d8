"""The preview page in a real browser: Debian's Chromium (/usr/bin/chromium, installed by .ci/run),
driven by Playwright, against the real server. Screenshots go to test-artifacts/ at the repository
root (ignored by git)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

import contextshift

from .conftest import ServerProcess, serving

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "support-chat.json"
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), (
        "Chromium from Debian is needed: apt-get install -y chromium (.ci/run does)"
    )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser, server: ServerProcess) -> Iterator[Page]:
    # The page's Content-Security-Policy forbids eval, which Playwright's waits use.
    context = browser.new_context(viewport={"width": 1400, "height": 900}, bypass_csp=True)
    opened = context.new_page()
    requested: list[str] = []
    opened.on("request", lambda request: requested.append(request.url))
    response = opened.goto(server.http_url + "/")
    assert response is not None and "default-src 'self'" in response.headers["content-security-policy"]
    yield opened
    context.close()
    # Everything the page loads or calls comes from the server: no CDN, no other origin.
    assert requested and all(url.startswith(server.http_url + "/") for url in requested), requested


def rows(page: Page) -> dict[str, dict[str, Any]]:
    found: list[dict[str, Any]] = page.eval_on_selector_all(
        "#blocks tbody tr",
        """rows => rows.map(r => ({
            id: r.dataset.id, decision: r.dataset.decision, className: r.className,
            role: r.querySelector('.role').textContent, kind: r.querySelector('.kind').textContent,
            tokens: r.querySelector('.tokens').textContent, reason: r.querySelector('.reason').textContent,
            colour: getComputedStyle(r).backgroundColor}))""",
    )
    return {row["id"]: row for row in found}


def preview_the_example(page: Page) -> None:
    """The shipped example chosen as a file, previewed in a 300-token window with no reserve."""
    page.set_input_files("#file", str(EXAMPLE))
    page.wait_for_function("document.getElementById('conversation').value.length > 0")
    page.fill("#context-limit", "300")
    page.fill("#response-reserve", "0")
    page.click("#preview")
    page.wait_for_selector("#blocks tbody tr")


def test_the_shipped_example_shows_every_block_with_its_decision(page: Page) -> None:
    page.wait_for_function("document.getElementById('profile').options.length > 1")  # profiles listed
    preview_the_example(page)

    shown = rows(page)
    blocks = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    assert list(shown) == [block["id"] for block in blocks]  # every block, in order
    assert (shown["sys"]["decision"], shown["sys"]["reason"], shown["sys"]["tokens"]) == (
        "kept",
        "PROTECTED_SYSTEM",
        "34",
    )
    assert (shown["lore-returns"]["kind"], shown["lore-returns"]["reason"]) == ("lorebook", "MANDATORY")
    assert (shown["u1"]["decision"], shown["u1"]["reason"]) == ("excluded", "BUDGET_OLDEST_FIRST")
    assert shown["t1"]["reason"] == "TOOL_GROUP" and shown["t2"]["reason"] == "TOOL_GROUP"
    assert (shown["t-stale"]["role"], shown["t-stale"]["reason"]) == ("tool", "ORPHAN_TOOL_RESULT")
    assert (shown["u3"]["decision"], shown["u3"]["reason"]) == ("kept", "PINNED")
    # Rows are coloured by decision.
    assert shown["sys"]["colour"] != shown["u1"]["colour"]
    assert {row["colour"] for row in shown.values() if row["decision"] == "excluded"} == {
        shown["u1"]["colour"]
    }
    summary = page.text_content("#summary")
    assert (
        summary
        == "7 kept, 6 excluded, 0 truncated; prompt 224 of 300 tokens, profile heuristic (approximate)"
    )
    assert "224 / 300 tokens of the budget" in (page.text_content("#budget-numbers") or "")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "preview-page.png"), full_page=True)


@contextmanager
def under_its_policy(browser: Browser, url: str) -> Iterator[Page]:
    """The page at `url` with its Content-Security-Policy enforced: the other tests bypass it
    (Playwright's waits evaluate code, which it forbids), so here only waits that run no code in
    the page are used, and nothing may break the policy."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    opened = context.new_page()
    console: list[str] = []
    opened.on("console", lambda message: console.append(message.text))
    try:
        opened.goto(url + "/")
        yield opened
    finally:
        context.close()
    assert not [line for line in console if "Content Security Policy" in line], console


def test_the_page_works_under_its_own_content_security_policy(
    browser: Browser, server: ServerProcess
) -> None:
    with under_its_policy(browser, server.http_url) as opened:
        opened.wait_for_selector("#profile option[value='o200k_base']", state="attached")
        opened.set_input_files("#file", str(EXAMPLE))
        opened.fill("#context-limit", "300")
        opened.fill("#response-reserve", "0")
        opened.click("#preview")
        opened.wait_for_selector("#blocks tbody tr")
        assert opened.locator("#blocks tbody tr").count() == len(
            json.loads(EXAMPLE.read_text(encoding="utf-8"))
        )
        # The bar in proportion: 224 prompt tokens and 76 left of a 300-token window, none reserved.
        styles = [
            opened.get_attribute(f"#budget-bar .{part}", "style") or ""
            for part in ("prompt", "free", "reserve")
        ]
        widths = [float(style.removeprefix("width: ").removesuffix("%;")) for style in styles]
        assert widths == pytest.approx([100 * 224 / 300, 100 * 76 / 300, 0], abs=1e-3), styles


def test_a_pasted_anthropic_body_with_a_cut_block_and_an_exact_profile(page: Page) -> None:
    body = {
        "system": "Be brief.",  # a top-level system string: the first block
        "messages": [{"role": "user", "content": "word " * 11_000}, {"role": "user", "content": "and now?"}],
    }
    page.fill("#conversation", json.dumps(body))
    page.select_option("#profile", "o200k_base")
    page.click("#preview")
    page.wait_for_selector("#blocks tbody tr")
    shown = rows(page)
    assert list(shown) == ["#0", "#1", "#2"] and shown["#0"]["role"] == "system"
    summary = page.text_content("#summary") or ""
    assert "1 truncated" in summary and "profile o200k_base" in summary and "approximate" not in summary
    # The block over the 50,000 character cap is kept, cut, and says so.
    assert shown["#1"]["className"] == "kept truncated" and "(CHAR_CAP)" in shown["#1"]["reason"]
    notes = page.text_content("#notes") or ""
    assert "Truncations" in notes and "#1: " in notes and "tokens (CHAR_CAP)" in notes


def test_errors_are_shown_by_field_and_a_missing_audit_is_a_404(page: Page) -> None:
    page.fill("#conversation", json.dumps([{"role": "user", "content": "hi"}, {"role": "robot"}]))
    page.click("#preview")
    page.wait_for_selector("#message:not([hidden])")
    assert "blocks[1].role" in (page.text_content("#message") or "")

    page.fill("#chat-id", "page-chat-without-audit")
    page.click("#audit")
    page.wait_for_function("document.getElementById('message').textContent.includes('NOT_FOUND')")
    assert "has no audit" in (page.text_content("#message") or "")


def test_a_chats_last_audit_with_the_pasted_conversation(page: Page, server: ServerProcess) -> None:
    blocks = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    with contextshift.Client(server.address) as client:
        shifted = client.shift_context(
            blocks, budget=300, chat_id="page-chat", provider="openai", strategy="summarize"
        )
    page.fill("#conversation", json.dumps(blocks))
    page.fill("#chat-id", "page-chat")
    page.click("#audit")
    page.wait_for_selector("#blocks tbody tr")
    shown = rows(page)
    # Every block of the audit in the prompt's order, the summary where it was sent.
    assert list(shown) == [d.id for d, _ in sorted_audit(shifted, blocks)]
    assert shown["summary"]["reason"] == "SUMMARY" and shown["summary"]["decision"] == "kept"
    assert (shown["u1"]["decision"], shown["u1"]["reason"]) == ("excluded", "SUMMARIZED")
    assert shown["sys"]["role"] == "system"
    title = page.text_content("#title") or ""
    assert title == f"Last audit of chat page-chat (generation {shifted.generation_id})"
    summary = page.text_content("#summary") or ""
    assert "status pending: sent to the provider, its outcome not reported yet" in summary
    assert "GENERATION_STATUS" not in summary and "PROVIDER_ERROR_CODE" not in summary
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "preview-page-audit.png"), full_page=True)


def sorted_audit(shifted: Any, blocks: list[dict[str, Any]]) -> list[tuple[Any, bool]]:
    """The audit's order: the input blocks, the summary right before the kept current input."""
    decided = {d.id: (d, True) for d in shifted.kept} | {d.id: (d, False) for d in shifted.excluded}
    order = [decided[b["id"]] for b in blocks]
    summary = decided["summary"]
    current = next(i for i, (d, _) in enumerate(order) if d.id == shifted.kept[-1].id)
    return [*order[:current], summary, *order[current:]]


def audit_texts(page: Page) -> dict[str, tuple[str, str]]:
    found: list[list[str]] = page.eval_on_selector_all(
        "#blocks tbody tr",
        "rows => rows.map(r => [r.dataset.id, r.querySelector('.role').textContent, r.querySelector('.text').textContent])",
    )
    return {row_id: (role, text) for row_id, role, text in found}


def test_an_audit_alone_shows_the_messages_it_stored(page: Page, server: ServerProcess) -> None:
    """Nothing pasted: the kept blocks' role and text come from the audit's stored messages, and
    the excluded blocks say their text is not stored."""
    blocks = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    with contextshift.Client(server.address) as client:
        shifted = client.shift_context(blocks, budget=300, chat_id="page-chat-alone")
        client.finish_generation(
            shifted.generation_id,
            "failed",
            chat_id="page-chat-alone",
            provider_error={"http_status": 429, "type": "rate_limit_error"},
        )
    page.fill("#conversation", "")
    page.fill("#chat-id", "page-chat-alone")
    page.click("#audit")
    page.wait_for_selector("#blocks tbody tr")
    shown = audit_texts(page)
    by_id = {block["id"]: block for block in blocks}
    for decision in shifted.kept:
        role, text = shown[decision.id]
        assert role == by_id[decision.id]["role"], decision.id
        assert text and text.split()[0] in str(by_id[decision.id].get("content") or "["), decision.id
    for decision in shifted.excluded:
        assert shown[decision.id] == ("", "(text not stored: an audit keeps the text of the blocks it sent)")
    summary = page.text_content("#summary") or ""
    assert summary.endswith("status failed (rate limited)"), summary


def test_an_audit_of_a_server_storing_no_text_says_so(browser: Browser, tmp_path: Path) -> None:
    with serving(tmp_path, "--no-audit-messages") as running:
        with contextshift.Client(running.address) as client:
            client.shift_context(json.loads(EXAMPLE.read_text(encoding="utf-8")), budget=300, chat_id="bare")
        context = browser.new_context(viewport={"width": 1400, "height": 900}, bypass_csp=True)
        try:
            opened = context.new_page()
            opened.goto(running.http_url + "/")
            opened.fill("#chat-id", "bare")
            opened.click("#audit")
            opened.wait_for_selector("#blocks tbody tr")
            texts = {text for _, text in audit_texts(opened).values()}
            assert texts == {"(text not stored: an audit keeps the text of the blocks it sent)"}
            assert "stores no message text in audits (audit_messages = false)" in (
                opened.text_content("#notes") or ""
            )
        finally:
            context.close()


def test_the_header_does_not_say_nothing_is_stored(page: Page) -> None:
    header = " ".join((page.text_content("header") or "").split())
    assert "Nothing is stored" not in header
    assert "A preview writes nothing; a chat's last audit is read from the server's store." in header


def test_choosing_the_same_file_again_reads_it_again(page: Page, tmp_path: Path) -> None:
    chosen = tmp_path / "chat.json"
    chosen.write_text('[{"role": "user", "content": "first"}]')
    page.set_input_files("#file", str(chosen))
    page.wait_for_function("document.getElementById('conversation').value.includes('first')")
    chosen.write_text('[{"role": "user", "content": "second"}]')  # edited, chosen again
    page.set_input_files("#file", str(chosen))
    page.wait_for_function("document.getElementById('conversation').value.includes('second')")


def test_a_narrow_window_never_scrolls_sideways(browser: Browser, server: ServerProcess) -> None:
    context = browser.new_context(viewport={"width": 420, "height": 900}, bypass_csp=True)
    try:
        opened = context.new_page()
        opened.goto(server.http_url + "/")
        preview_the_example(opened)
        width = opened.evaluate("document.documentElement.scrollWidth")
        assert width <= 420, width
        # The table scrolls in its own box instead.
        box = opened.evaluate(
            "(() => { const b = document.querySelector('.table-scroll'); return [b.clientWidth, b.scrollWidth]; })()"
        )
        assert box[0] <= 420 and box[1] >= box[0], box
        ARTIFACTS.mkdir(exist_ok=True)
        opened.screenshot(path=str(ARTIFACTS / "preview-page-420px.png"), full_page=True)
    finally:
        context.close()


def chat_list(page: Page) -> list[list[str]]:
    """The recent chats' rows as shown: chat id, status, model, prompt tokens, kept / excluded, when."""
    rows = page.locator("#chat-list tbody tr")
    return [rows.nth(i).locator("td").all_text_contents() for i in range(rows.count())]


def test_recent_chats_newest_first_a_page_at_a_time_and_a_click_opens_the_audit(
    browser: Browser, tmp_path: Path
) -> None:
    """A server of its own with 23 chats: the list shows the newest 20 first, "More" the other 3,
    each row as ListChats has it; choosing a row shows that chat's last audit. Under the page's
    own Content-Security-Policy (no waits that run code in the page)."""
    blocks = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    with serving(tmp_path) as running, contextshift.Client(running.address) as client:
        generations = [
            client.shift_context(blocks, budget=300, chat_id=f"recent-{n:02d}", model="gpt-4o").generation_id
            for n in range(23)
        ]
        client.finish_generation(
            generations[21],
            "failed",
            chat_id="recent-21",
            provider_error={"http_status": 429, "type": "rate_limit_error"},
        )
        listed = client.list_chats(page_size=20)
        with under_its_policy(browser, running.http_url) as opened:
            opened.wait_for_selector("#chat-list tbody tr")
            shown = chat_list(opened)
            assert [row[0] for row in shown] == [f"recent-{n:02d}" for n in range(22, 2, -1)]
            for row, chat in zip(shown, listed.chats, strict=True):
                assert row[0] == chat.chat_id and row[2:5] == [
                    "gpt-4o",
                    str(chat.prompt_tokens),
                    f"{chat.kept_count} / {chat.excluded_count}",
                ]
                assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", row[5]), row
            assert shown[0][1] == "pending" and shown[1][1] == "failed (rate limited)"
            assert opened.locator("#chats-more").is_visible()

            opened.click("#chats-more")
            opened.wait_for_selector("#chat-list tbody tr:nth-child(23)")
            assert [row[0] for row in chat_list(opened)][20:] == ["recent-02", "recent-01", "recent-00"]
            assert opened.locator("#chats-more").is_hidden()

            opened.click("#chat-list tbody tr[data-chat='recent-05']")
            opened.wait_for_selector("#result:not([hidden]) #blocks tbody tr")
            title = opened.text_content("#title") or ""
            assert title == f"Last audit of chat recent-05 (generation {generations[5]})"
            assert opened.input_value("#chat-id") == "recent-05"
            audit = client.get_context_audit("recent-05")
            ids = opened.locator("#blocks tbody tr").evaluate_all("rows => rows.map(r => r.dataset.id)")
            assert ids == [b.id for b in audit.blocks]
            kept = sum(b.kept for b in audit.blocks)
            summary = opened.text_content("#summary") or ""
            assert summary.startswith(f"{kept} kept, {len(audit.blocks) - kept} excluded")
            ARTIFACTS.mkdir(exist_ok=True)
            opened.screenshot(path=str(ARTIFACTS / "preview-page-recent-chats.png"), full_page=True)

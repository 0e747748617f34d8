"""Summaries that read (contextshift.summarizer.extractive, the `summarize` strategy): hard-wrapped
lines joined before sentences are cut, list items and code whole, sentences chosen for their
facts and cut only at clause boundaries, a facts line only for what no sentence holds (newest
first, once each), the size following the budget, and the plan's facts figures counted over the
whole left-out text and the whole final prompt."""

from __future__ import annotations

from typing import Any

import contextshift
from contextshift.summarizer import extractive

PROFILE = "o200k_base"

# A man page's paragraph as `man` prints it: wrapped at 78 columns, indented.
WRAPPED = """\
       Falls Sie nicht --nocheck angeben, wird dpkg-deb DEBIAN/control lesen
       und es auswerten. Es prüft die Datei auf Syntax-Fehler und andere
       Probleme und zeigt den Namen des zu bauenden Binärpakets an.

       -x, --extract Archiv Verzeichnis
           Entpackt den Dateisystembaum aus einem Paketarchiv in das
           angegebene Verzeichnis (seit Dpkg 1.17.14).
"""

CHANGELOG = """\
openssh (1:9.2p1-2+deb12u3) bookworm-security; urgency=high

  * Apply upstream patches to fix CVE-2023-48795 (Terrapin attack) in the
    chacha20-poly1305 and etm MAC modes (closes: #1059001).
  * Add a regression test for the agent forwarding fix.

 -- Colin Watson <cjwatson@debian.org>  Tue, 19 Dec 2023 14:51:56 +0000
"""


def room(limit: int = 10_000) -> extractive.Room:
    return extractive.Room(
        limit,
        lambda text: contextshift.count_tokens([{"role": "system", "content": text}], PROFILE)[0],
        lambda texts: contextshift.count_tokens(list(texts), PROFILE),
    )


def summary_of(text: str, limit: int = 10_000, role: str = "assistant") -> extractive.SummaryText:
    made = extractive.summarize([extractive.Turn(role, text)], room(limit))
    assert made is not None
    return made


def test_hard_wrapped_lines_are_joined_before_sentences_are_cut() -> None:
    assert extractive.sentences(WRAPPED) == [
        "Falls Sie nicht --nocheck angeben, wird dpkg-deb DEBIAN/control lesen und es auswerten.",
        "Es prüft die Datei auf Syntax-Fehler und andere Probleme und zeigt den Namen des zu bauenden Binärpakets an.",
        # An item's tag and what it says, joined as one.
        "-x, --extract Archiv Verzeichnis: Entpackt den Dateisystembaum aus einem Paketarchiv in das angegebene Verzeichnis (seit Dpkg 1.17.14).",
    ]
    # The summary's sentences are whole: none ends where a line of the text ended.
    made = summary_of(WRAPPED)
    assert (
        "Falls Sie nicht --nocheck angeben, wird dpkg-deb DEBIAN/control lesen und es auswerten." in made.text
    )
    assert "lesen\n" not in made.text


def test_list_items_headings_and_signatures_stay_units_of_their_own() -> None:
    assert extractive.sentences(CHANGELOG) == [
        "openssh (1:9.2p1-2+deb12u3) bookworm-security; urgency=high",
        "* Apply upstream patches to fix CVE-2023-48795 (Terrapin attack) in the chacha20-poly1305 and etm MAC modes (closes: #1059001).",
        "* Add a regression test for the agent forwarding fix.",
        "-- Colin Watson <cjwatson@debian.org> Tue, 19 Dec 2023 14:51:56 +0000",
    ]
    # Lower case after a period is no new sentence (an abbreviation, a file name's dot).
    assert extractive.sentences("Use e.g. the flag. Then stop.") == ["Use e.g. the flag.", "Then stop."]


def test_a_roomy_summary_keeps_every_fact_and_says_what_they_belong_to() -> None:
    made = summary_of(CHANGELOG)
    assert made.facts_kept == made.facts_total == len(made.facts) > 0
    body, _, line = made.text.partition("\nFacts: ")
    # The version is in the sentence naming its package, the CVE in the one saying what it fixes.
    assert "openssh (1:9.2p1-2+deb12u3) bookworm-security" in body
    assert "fix CVE-2023-48795 (Terrapin attack)" in body
    # The facts line holds only what no sentence holds, each once.
    assert not any(fact in body for fact in line.split("; ") if line)
    assert len(set(line.split("; "))) == len(line.split("; ")) if line else True


def test_a_tight_summary_keeps_the_newest_facts_on_its_line_newest_first() -> None:
    text = "\n\n".join(
        f"  * Release 1.{n}.0 fixed CVE-2024-{1000 + n} (closes: #{900000 + n})." for n in range(40)
    )
    made = summary_of(text, limit=120)
    assert made.facts_kept < made.facts_total == 120
    body, _, line = made.text.partition("\nFacts: ")
    # The newest release's sentence, then the line, newest first: the last said leads.
    assert "Release 1.39.0 fixed CVE-2024-1039 (closes: #900039)." in body
    assert line.split("; ")[:4] == ["#900038", "CVE-2024-1038", "1.38.0", "#900037"]
    order = [made.facts.index(fact) for fact in line.split("; ")]
    assert order == sorted(order)


def test_a_long_sentence_is_cut_at_clause_boundaries_never_inside_a_fact() -> None:
    sentence = (
        "The export job, which runs every night on the old cluster and has never been fast, "
        "failed on Fri, 25 Feb 2022 23:30:49 +0100 while writing /srv/export/daily.csv, "
        "and nobody noticed until the weekly report came out empty on Monday morning."
    )
    made = summary_of(sentence, limit=50)  # no room for all of it
    cut = next(line for line in made.text.splitlines() if "/srv/export/daily.csv" in line)
    assert "failed on Fri, 25 Feb 2022 23:30:49 +0100 while writing /srv/export/daily.csv," in cut
    assert "…" in cut and "every night" not in cut


def test_the_summary_is_in_the_language_of_the_text() -> None:
    made = summary_of(WRAPPED, limit=80)
    body = made.text.partition("\nFacts: ")[0].partition("\n")[2]
    assert "Entpackt" in body or "auswerten" in body  # the German sentences, as written


def test_sentences_carry_facts_when_not_every_fact_fits() -> None:
    # Room for a part of the facts: the summary still says something, not a facts line only.
    text = CHANGELOG * 1 + "\n\n".join(
        f"  * Backport fix for CVE-2024-{2000 + n} from 9.{n}p1 (closes: #{1060000 + n})." for n in range(30)
    )
    made = summary_of(text, limit=150)
    lines = made.text.splitlines()
    assert any(line.startswith("assistant: ") for line in lines)
    assert made.facts_kept < made.facts_total


def shifted(blocks: list[dict[str, Any]], budget: int, **options: Any) -> contextshift.ShiftResult:
    return contextshift.shift_context(
        blocks, budget=budget, profile=PROFILE, strategy="summarize", options=options or None
    )


def facts_chat(turns: int, repeat_last: bool = False) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"id": "sys", "role": "system", "content": "Be brief."}]
    for n in range(turns):
        blocks.append({"id": f"u{n}", "role": "user", "content": "And the next one?"})
        text = f"Release 2.{n}.0 fixed CVE-2024-{3000 + n}; config lives in /etc/app/{n}.conf. " * 3
        blocks.append({"id": f"a{n}", "role": "assistant", "content": text})
    last = "As said, CVE-2024-3000 matters most." if repeat_last else "Which one matters most?"
    blocks.append({"id": "now", "role": "user", "content": last})
    return blocks


def test_facts_total_counts_every_fact_left_out_and_facts_kept_the_whole_prompt() -> None:
    blocks = facts_chat(30)
    result = shifted(blocks, 600, summary_max_tokens=64)
    summary = result.summary
    assert summary is not None
    left_out = [b["content"] for b in blocks if b["id"] in {d.id for d in result.excluded}]
    every = extractive.facts_newest_first([extractive.Turn("", t) for t in left_out])
    assert summary.facts_total == len(every) == 3 * len([t for t in left_out if "Release" in t])
    assert summary.facts_kept == sum(fact in summary.text for fact in every)
    # A left-out fact the current input repeats is in the prompt: kept, though the summary is full.
    again = shifted(facts_chat(30, repeat_last=True), 600, summary_max_tokens=64)
    assert again.summary is not None
    assert "CVE-2024-3000" not in again.summary.text
    assert again.summary.facts_kept == sum(f in again.summary.text for f in every) + 1


def test_the_default_size_follows_the_budget_and_summary_max_tokens_overrides_it() -> None:
    blocks = facts_chat(120)
    total = sum(contextshift.count_tokens(blocks, PROFILE))
    small, large = shifted(blocks, total // 10), shifted(blocks, total // 3)
    assert small.summary is not None and large.summary is not None
    assert small.summary.tokens <= 256 < large.summary.tokens <= total // 3 // 8
    fixed = shifted(blocks, total // 3, summary_max_tokens=100)
    assert fixed.summary is not None and fixed.summary.tokens <= 100
    # At most half of what was left out: a short cut gets a short summary.
    cut_little = shifted(blocks, total - 300)
    assert cut_little.summary is not None and cut_little.summary.tokens <= 300

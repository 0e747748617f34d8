"""The fact extractor (contextshift.summarizer.facts): whole facts, never pieces of one, never
fragments. Each named case is one a summary of real text got wrong (issue 19): the extractor
split or missed it, or made a fact of a fragment."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextshift.summarizer import facts


def extracted(text: str) -> list[str]:
    return facts.extract(text)


@pytest.mark.parametrize(
    ("text", "whole"),
    [
        # A CVE id was "CVE-2021" and "28041" (no CVE id of 105 survived).
        ("Fix CVE-2021-28041 in ssh-agent.", ["CVE-2021-28041"]),
        ("See GHSA-abcd-efgh-ijkm too.", ["GHSA-abcd-efgh-ijkm"]),
        # Flags were never facts.
        ("Pass --no-same-owner and -x to tar.", ["--no-same-owner", "-x"]),
        ("Use --type=bool or -o=Dir::Cache=/var/cache.", ["--type=bool", "-o=Dir::Cache=/var/cache"]),
        # Settings were mostly missed.
        ("Set GODEBUG=x509sha1=1 for old certificates.", ["GODEBUG=x509sha1=1"]),
        ('Build with CFLAGS="-O2 -g" now.', ['CFLAGS="-O2 -g"']),
        # A Debian version gave nothing, another lost its revision.
        ("openssh (1:9.2p1-2+deb12u5) bookworm-security", ["1:9.2p1-2+deb12u5"]),
        ("systemd 252.39-1~deb12u2 is out", ["252.39-1~deb12u2"]),
        (
            "Python 3.11.0rc1, 2.0.0-beta.1+build.5 and v1.2.3; 3.8+ only.",
            ["3.11.0rc1", "2.0.0-beta.1+build.5", "v1.2.3", "3.8+"],
        ),
        # A dotted name lost its first part; :: names.
        ("Set core.hooksPath first.", ["core.hooksPath"]),
        ("Read Dir::Etc::Parts and std::io::Read.", ["Dir::Etc::Parts", "std::io::Read"]),
        ("Call os.path.join() here.", ["os.path.join()"]),
        # An issue reference lost its prefix.
        (
            "Fixed in gh-issue-92173 and bpo-45256 (Closes: #1026423).",
            ["gh-issue-92173", "bpo-45256", "#1026423"],
        ),
        # Relative paths were missed.
        ("See doc/bash.1 and debian/patches/fix.diff.", ["doc/bash.1", "debian/patches/fix.diff"]),
        # A timestamp was three entries.
        (
            " -- Colin Watson <cjwatson@debian.org>  Fri, 25 Feb 2022 23:30:49 +0100",
            ["cjwatson@debian.org", "Fri, 25 Feb 2022 23:30:49 +0100"],
        ),
        (
            "Released 2024-05-02T03:11:22Z, May 1, 2024 and 1 May 2024.",
            ["2024-05-02T03:11:22Z", "May 1, 2024", "1 May 2024"],
        ),
        (
            "Seit dem 25. Februar 2022, desde el 3 de marzo de 2023, 2023年1月25日.",
            ["25. Februar 2022", "3 de marzo de 2023", "2023年1月25日"],
        ),
        ("Took 512 MiB, 30% and 10ms; cost $5 and 3f9c2ab1.", ["512 MiB", "30%", "10ms", "$5", "3f9c2ab1"]),
        ("https://example.com/a?b=c and ops@example.com", ["https://example.com/a?b=c", "ops@example.com"]),
    ],
)
def test_real_facts_are_found_whole(text: str, whole: list[str]) -> None:
    assert extracted(text) == whole


@pytest.mark.parametrize(
    "text",
    [
        # "/or" and "/data" were facts (from "and/or", "files/data").
        "Copy and/or move files/data to the other disk.",
        # Abbreviations are no dotted names or file names.
        "Use e.g. this, i.e. that, z.B. dies, d.h. das.",
        # A lone digit, a dash, hyphenated words.
        "It has 2 options - a well-known re-run.",
    ],
)
def test_fragments_are_no_facts(text: str) -> None:
    assert extracted(text) == []


def test_restructuredtext_double_backticks_are_one_code_span_each() -> None:
    # Between ``defs`` and ``kwdefs`` a single-backtick pattern saw the span "` `".
    text = "Fix the ``defs`` and ``kwdefs`` arguments to :c:func:`PyEval_EvalCodeEx`."
    assert extracted(text) == ["``defs``", "``kwdefs``", "`PyEval_EvalCodeEx`"]
    assert [facts.value(f) for f in extracted(text)] == ["defs", "kwdefs", "PyEval_EvalCodeEx"]
    # A reStructuredText link's closing "`__" opens no span.
    assert extracted("`Open Graph <https://ogp.me/>`__ to generate `x` ok") == [
        "`Open Graph <https://ogp.me/>`",
        "`x`",
    ]


def test_no_piece_of_a_fact_is_a_fact_of_its_own() -> None:
    text = "Upgrade to openssh 1:9.2p1-2+deb12u5 per CVE-2023-48795 with --no-same-owner at /usr/lib/x.so."
    found = extracted(text)
    for fact in found:
        assert not any(fact != other and fact in other for other in found)
    assert "9.2p1" not in found and "2023" not in found and "48795" not in found


SAMPLES = [
    "openssh (1:9.2p1-2+deb12u5) bookworm-security; urgency=medium",
    "Fix CVE-2021-28041 (Closes: #1026423); see gh-issue-92173 and core.hooksPath.",
    "Pass --no-same-owner, -x and GODEBUG=x509sha1=1 to doc/bash.1 at 23:30:49.",
    "Fri, 25 Feb 2022 23:30:49 +0100 and ``defs`` and `code` and $5 or 512 MiB.",
    "and/or files/data e.g. z.B. 2 options",
]


@settings(max_examples=400)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(SAMPLES),
            st.text(st.characters(codec="utf-8"), max_size=30),
            st.text(st.sampled_from("-:./=#`@~+ abcDEF0123456789,;()<>\n"), max_size=40),
        ),
        max_size=6,
    ).map(" ".join)
)
def test_every_fact_is_a_substring_of_its_text_and_facts_do_not_overlap(text: str) -> None:
    found = extracted(text)
    position = 0
    for fact in found:
        assert len(fact) > 1
        at = text.find(fact, position)
        assert at >= 0, f"{fact!r} is not in the text after position {position}"
        position = at + len(fact)  # in order of appearance, never overlapping

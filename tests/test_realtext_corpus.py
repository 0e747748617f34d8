"""The real-text benchmark's own parts (benchmarks/realtext): its fact definition, written apart
from the extractor it grades; the man page renderer; and the source records, which must refuse a
missing or changed file rather than measure other text."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a package there

from benchmarks.realtext import facts, sources, troff

CHANGELOG = """openssh (1:9.2p1-2+deb12u5) bookworm-security; urgency=medium

  * Fix CVE-2021-28041 in ssh-agent (Closes: #1026423); see gh-issue-92173.
  * Pass --no-same-owner and -x to tar; GODEBUG=x509sha1=1 for core.hooksPath,
    doc/bash.1, debian/patches/fix.diff and /usr/lib/openssh/agent-launch.
  * Versions 252.39-1~deb12u2, v1.2.3 and 3.11.0rc1; commit 3f9c2ab1.
  * The ``defs`` argument and `code`; 512 MiB, 30% and 10ms; and/or files/data.

 -- Colin Watson <cjwatson@debian.org>  Fri, 25 Feb 2022 23:30:49 +0100
"""


def kinds(text: str) -> dict[str, str]:
    return facts.distinct(text)


def test_every_kind_is_found_whole() -> None:
    found = kinds(CHANGELOG)
    assert found == {
        "1:9.2p1-2+deb12u5": "version",
        "urgency=medium": "setting",
        "CVE-2021-28041": "cve",
        "#1026423": "issue",
        "gh-issue-92173": "issue",
        "--no-same-owner": "flag",
        "-x": "flag",
        "GODEBUG=x509sha1=1": "setting",
        "core.hooksPath": "name",
        "doc/bash.1": "path",
        "debian/patches/fix.diff": "path",
        "/usr/lib/openssh/agent-launch": "path",
        "252.39-1~deb12u2": "version",
        "v1.2.3": "version",
        "3.11.0rc1": "version",
        "3f9c2ab1": "hash",
        "defs": "code",
        "code": "code",
        "512 MiB": "quantity",
        "30%": "quantity",
        "10ms": "quantity",
        "cjwatson@debian.org": "email",
        "Fri, 25 Feb 2022 23:30:49 +0100": "date",
    }


def test_words_that_are_no_facts() -> None:
    # Prose, slashes between words, a lone digit, abbreviations, a dash as punctuation.
    assert kinds("He and/or she read files/data, e.g. 2 pages - fine. Version 3 of it.") == {}


def test_more_kinds() -> None:
    text = (
        "See https://example.com/a?b=c, std::io::Read and Dir::Ignore-Files-Silently at 23:30 "
        "on 2024-05-02T03:11Z; May 1, 2024 and 1 May 2024; 1,000 items, 3.14 and GHSA-abcd-efgh-ijkm."
    )
    assert kinds(text) == {
        "https://example.com/a?b=c": "url",
        "std::io::Read": "name",
        "Dir::Ignore-Files-Silently": "name",
        "23:30": "date",
        "2024-05-02T03:11Z": "date",
        "May 1, 2024": "date",
        "1 May 2024": "date",
        "1,000": "number",
        "3.14": "number",
        "GHSA-abcd-efgh-ijkm": "cve",
    }


def test_a_date_wrapped_over_two_lines_is_one_fact_kept_when_re_spaced() -> None:
    found = kinds("released on Fri, 25 Feb\n       2022 23:30:49 +0100 by the team")
    assert found == {"Fri, 25 Feb 2022 23:30:49 +0100": "date"}
    assert facts.kept(found, "on Fri, 25 Feb 2022 23:30:49 +0100") == set(found)
    # And the other way: a fact of one line found in a prompt that wraps it.
    assert facts.kept({"25 Feb 2022"}, "on 25 Feb\n2022") == {"25 Feb 2022"}


def test_kept_needs_the_whole_value() -> None:
    assert facts.kept({"CVE-2021-28041", "--no-same-owner"}, "fixed CVE-2021 and --no-same") == set()


def test_the_renderer_fills_wraps_and_resolves_escapes() -> None:
    source = "\n".join(
        [
            '.de Vb \\" Begin verbatim text',
            ".ft CW",
            "..",
            ".if n \\{\\",
            ".    ds -- \\(*W-",
            "'br\\}",
            '.TH "DPKG-DEB" "1" "2023-05-11"',
            '.SH "BESCHREIBUNG"',
            "\\fBdpkg-deb\\fR packt und entpackt Debian-Archive und stellt Informationen \\(:uber sie",
            "bereit; siehe \\fB\\-\\-build\\fR (\\fI\\-b\\fR).",
            '.IP "\\fB\\-x\\fR, \\fB\\-\\-extract\\fR" 4',
            "Entpackt den Baum.",
            ".nf",
            "  dpkg-deb -x foo.deb dir",
            ".fi",
        ]
    )
    assert troff.render(source) == (
        "DPKG-DEB 1\n"
        "\n"
        "BESCHREIBUNG\n"
        "       dpkg-deb packt und entpackt Debian-Archive und stellt Informationen\n"
        "       über sie bereit; siehe --build (-b).\n"
        "\n"
        "       -x, --extract\n"
        "           Entpackt den Baum.\n"
        "             dpkg-deb -x foo.deb dir\n"
    )


def test_tables_are_rows_of_cells() -> None:
    source = ".SH X\n.TS\ntab (@);\nl lx.\n1@T{\nPrograms\nT}\n2@System calls\n.TE\n"
    assert troff.render(source) == "X\n\n       1  Programs\n       2  System calls\n"


def _recorded(tmp_path: Path, text: str, **fields: str) -> sources.Source:
    path = tmp_path / "changelog.gz"
    path.write_bytes(gzip.compress(text.encode()))
    part = text[text.index("b (2)") :]
    digest = hashlib.sha256(part.encode()).hexdigest()
    return sources.Source("test", "en", str(path), "a test", fields.get("sha256", digest), "b (2)", 10_000)


def test_a_source_reads_from_its_recorded_entry_whatever_came_before(tmp_path: Path) -> None:
    source = _recorded(tmp_path, "a (3) new entry\n\nb (2) old entry\n\nb (1) older\n")
    assert sources.read(source) == "b (2) old entry\n\nb (1) older\n"
    # A new upload adds an entry at the top: the part read is the same.
    Path(source.path).write_bytes(
        gzip.compress(b"a (4) newer\n\na (3) new entry\n\nb (2) old entry\n\nb (1) older\n")
    )
    assert sources.read(source) == "b (2) old entry\n\nb (1) older\n"


def test_a_missing_or_changed_source_stops_the_benchmark(tmp_path: Path) -> None:
    source = _recorded(tmp_path, "b (2) old entry\n")
    Path(source.path).write_bytes(gzip.compress(b"b (2) edited entry\n"))
    with pytest.raises(sources.CorpusError, match="changed"):
        sources.read(source)
    Path(source.path).write_bytes(gzip.compress(b"c (1) another package\n"))
    with pytest.raises(sources.CorpusError, match="no line starting"):
        sources.read(source)
    Path(source.path).unlink()
    with pytest.raises(sources.CorpusError, match="missing"):
        sources.read(source)


def test_the_benchmark_fails_below_its_recorded_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The quick run on this machine's files: it passes against its own figures and fails when the
    # recorded ones are higher (a regression), or when a source is gone.
    from benchmarks.realtext import bench

    figures = tmp_path / "figures.json"
    monkeypatch.setattr(bench, "FIGURES", figures)
    assert bench.main(quick=True, record=True) == 0
    recorded = json.loads(figures.read_text())["quick"]
    assert recorded["other_512_retention"] > 0.8 and recorded["loop_min_prompt_share"] >= 0.5
    assert bench.main(quick=True) == 0
    figures.write_text(
        json.dumps({"quick": {**recorded, "en_512_retention": recorded["en_512_retention"] + 0.01}})
    )
    assert bench.main(quick=True) == 1
    missing = dataclasses.replace(sources.BY_NAME["cpython-news"], path="/nonexistent/NEWS.gz")
    monkeypatch.setitem(sources.BY_NAME, "cpython-news", missing)
    monkeypatch.setattr(
        sources, "SOURCES", [missing if s.name == "cpython-news" else s for s in sources.SOURCES]
    )
    assert bench.main(quick=True) == 1

"""The real text the benchmark's chats are made of: files a fresh machine has once the Makefile and
`.ci/run` have installed what they install. Nothing is committed but these records: each names its
file (a Debian package's changelog or man page, a pinned wheel's metadata or SBOM, a crate's
changelog at the version Cargo.lock pins), the part of it used, and the SHA-256 of that part.

A file that is missing, or whose part no longer has the recorded hash, stops the benchmark with
an error naming it (`CorpusError`): measuring other text under the same name would compare a new
figure with an old one that no longer means the same thing.

Debian changelogs grow at the top with every upload; the part used starts at a recorded, older
entry, so a security update of the package does not change it. Re-record on purpose only:

    python -m benchmarks.realtext.sources   # the hashes of this machine's files, as records
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from benchmarks.realtext import troff


class CorpusError(Exception):
    """A source file is missing or is not the text that was recorded."""


@dataclass(frozen=True)
class Source:
    """A part of one file: from the first line starting with `start` (or from the top), `chars`
    characters rounded up to a line end; a man page is rendered first (benchmarks/realtext/troff.py)
    and `start` is looked up in the rendered text. `sha256` is of that part (of the troff source
    for a man page)."""

    name: str
    lang: str
    path: str  # with {purelib} (this interpreter's site-packages) or {crates} (cargo's sources)
    provider: str  # where the file comes from, for the error message
    sha256: str
    start: str = ""
    chars: int = 24_000

    @property
    def is_man(self) -> bool:
        return "/man/" in self.path


def _roots() -> dict[str, str]:
    cargo = os.environ.get("CARGO_HOME") or str(Path.home() / ".cargo")
    crates = sorted(glob.glob(os.path.join(cargo, "registry", "src", "*")))
    return {"purelib": sysconfig.get_paths()["purelib"], "crates": crates[0] if crates else "<no crates>"}


def resolved(source: Source) -> Path:
    """The source's file on this machine."""
    return Path(source.path.format(**_roots()))


def _read(path: Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8")


def _part(text: str, start: str, chars: int) -> str:
    """`chars` characters of `text` from the first line starting with `start`, to a line end."""
    at = 0
    if start and not text.startswith(start):
        at = text.find("\n" + start) + 1
        if at == 0:
            raise ValueError(start)
    end = text.find("\n", at + chars)
    return text[at : len(text) if end < 0 else end + 1]


def read(source: Source) -> str:
    """The source's text; `CorpusError` when its file is missing or changed."""
    path = resolved(source)
    if not path.is_file():
        raise CorpusError(f"{source.name}: {path} is missing (from {source.provider})")
    raw = _read(path)
    text = troff.render(raw) if source.is_man else raw
    try:
        part = _part(text, source.start, source.chars)
    except ValueError:
        raise CorpusError(f"{source.name}: {path} has no line starting {source.start!r}") from None
    digest = hashlib.sha256((raw if source.is_man else part).encode()).hexdigest()
    if digest != source.sha256:
        raise CorpusError(
            f"{source.name}: {path} changed (sha256 {digest}, recorded {source.sha256}; "
            f"from {source.provider}): re-record deliberately, with new reference figures"
        )
    return part


WHOLE = 1 << 40  # `chars` of a source read whole (JSON)
_DOC = "/usr/share/doc"
_MAN = "/usr/share/man"
SOURCES = [
    # English: Debian changelogs (CVE ids, Debian versions, bug numbers, dates, paths).
    Source(
        "openssh-changelog",
        "en",
        f"{_DOC}/openssh-client/changelog.Debian.gz",
        "Debian openssh-client",
        "99fc61359819d01f7a957df6c41d754926f10d92e7bb329f8a54b2197c6b6353",
        "openssh (1:9.2p1-2+deb12u5)",
    ),
    Source(
        "systemd-changelog",
        "en",
        f"{_DOC}/systemd/changelog.Debian.gz",
        "Debian systemd",
        "dceb4e3b3b35b413ab86c647e0ca0f7f99ce6052284da848765a5927f38c326b",
        "systemd (252.38-1~deb12u1)",
    ),
    Source(
        "glibc-changelog",
        "en",
        f"{_DOC}/libc6/changelog.Debian.gz",
        "Debian libc6",
        "c87ea111f5793a8c102c7f0a3114cf25b91ff287cf0cf314ee04328b4ebad705",
        "glibc (2.36-9+deb12u11)",
    ),
    Source(
        "curl-changelog",
        "en",
        f"{_DOC}/curl/changelog.Debian.gz",
        "Debian curl",
        "7bfda3d465cc0915b5b7f3e391ecb237f5074a5a02b9b6f361fad3af2193ef91",
        "curl (7.88.1-10+deb12u11)",
    ),
    Source(
        "coreutils-changelog",
        "en",
        f"{_DOC}/coreutils/changelog.Debian.gz",
        "Debian coreutils",
        "0195e1127e8ada79164f9b9642f4253cd8676a1315fdda2acf5e4d9271c27d8f",
        "coreutils (8.32-4)",
    ),
    Source(
        "chromium-changelog",
        "en",
        f"{_DOC}/chromium/changelog.Debian.gz",
        "Debian chromium (.ci/run)",
        "24635ef83a5f190f8280d2469127f6bd2e8211c0ca955588462b268e4fe58bb7",
        "chromium (156.0.8078.73-1~deb12u1)",
    ),
    Source(
        "postgresql-changelog",
        "en",
        f"{_DOC}/postgresql-15/changelog.Debian.gz",
        "Debian postgresql-15 (.ci/run)",
        "aa830221cbf8b1523de32561a755948d5f3501920750b4938d1615b7889f500a",
        "postgresql-15 (15.16-0+deb12u1)",
    ),
    Source(
        "git-changelog",
        "en",
        f"{_DOC}/git/changelog.Debian.gz",
        "Debian git",
        "e185e1bb32f65664c366aefb16ce5ef84940f1a374964531f98d73e7d3b5bdbd",
        "git (1:2.39.5-0+deb12u1)",
    ),
    Source(
        "dpkg-changelog",
        "en",
        f"{_DOC}/dpkg/changelog.gz",
        "Debian dpkg",
        "e429df9dd22ddba2d66bad12ea6369062d67162b23a3a08d176218c7f77e86fc",
        "dpkg (1.21.21)",
    ),
    # English: CPython's NEWS (reStructuredText: gh-issue ids, ``literals``, :func: roles).
    Source(
        "cpython-news",
        "en",
        f"{_DOC}/python3.11/NEWS.gz",
        "Debian python3.11",
        "845e507f9f8a3794230086fd29e1364e95c3b824f3856a8c8d4eca1458a37157",
    ),
    Source(
        "cpython-news-library",
        "en",
        f"{_DOC}/python3.11/NEWS.gz",
        "Debian python3.11",
        "243ecca8b1543ad6d955e9d73007d0e786545bf03b21c0440c82c8da6c743af7",
        "What's New in Python 3.11.0 beta 4?",
    ),
    # English: crates' changelogs (Markdown), at the versions Cargo.lock pins.
    Source(
        "pyo3-changelog",
        "en",
        "{crates}/pyo3-0.30.1/CHANGELOG.md",
        "crate pyo3 0.30.1",
        "f452650a96695e34620fd6faea1ce30608b214fd057944081ffd29fa84fee17b",
    ),
    Source(
        "regex-changelog",
        "en",
        "{crates}/regex-1.13.2/CHANGELOG.md",
        "crate regex 1.13.2",
        "15980e2a969784608ae1a5c657524f5c3a2920900768bca998e98a8a0529e9a8",
    ),
    Source(
        "rayon-releases",
        "en",
        "{crates}/rayon-1.12.0/RELEASES.md",
        "crate rayon 1.12.0",
        "a2a6405729dd06f1bad7f2f8de0b219f8bb4e7e8b8897e28757fba5fe1246e10",
    ),
    Source(
        "libc-changelog",
        "en",
        "{crates}/libc-0.2.191/CHANGELOG.md",
        "crate libc 0.2.191",
        "a951cea9aa1665f467a275cd48c173be1f8e7b0abe0d6be85cfd4ca395a26dde",
    ),
    # English: man pages (hard-wrapped: flags, settings, paths).
    Source(
        "tar-man",
        "en",
        f"{_MAN}/man1/tar.1.gz",
        "Debian tar",
        "366c4ab055d6288c7b5a1a205135217db71d4380ab75cb1ab9e3ede587e0225a",
        "DESCRIPTION",
    ),
    Source(
        "git-config-man",
        "en",
        f"{_MAN}/man1/git-config.1.gz",
        "Debian git",
        "aabfacf8879fb1fd29dee67e33997a513ad7a51d7ccbb3e02b95ca603cb37eef",
        "DESCRIPTION",
    ),
    Source(
        "dpkg-man",
        "en",
        f"{_MAN}/man1/dpkg.1.gz",
        "Debian dpkg",
        "0fd0ad2d32527fa97b1ff3f075033344d1dbee8828a6c931bfea08f788738528",
        "DESCRIPTION",
    ),
    Source(
        "apt-conf-man",
        "en",
        f"{_MAN}/man5/apt.conf.5.gz",
        "Debian apt",
        "fe597814f766db6ea56ccae194a56812c40dd022427a8ae35c819ec29ed58253",
        "DESCRIPTION",
    ),
    # English: READMEs of pinned wheels (their METADATA).
    Source(
        "ruff-readme",
        "en",
        "{purelib}/ruff-0.17.6.dist-info/METADATA",
        "wheel ruff 0.17.6",
        "1c69fd41fc379184e6a05c90249589cf7289fb6548219aba2ea5a53594bcdad8",
    ),
    Source(
        "httpx-readme",
        "en",
        "{purelib}/httpx-0.28.1.dist-info/METADATA",
        "wheel httpx 0.28.1",
        "febb9b0f8f3e80d57c8199c304f35c4336e8581d1d18d7983c92766b82793b25",
    ),
    # Other languages: Debian's translated man pages.
    Source(
        "dpkg-deb-man-de",
        "de",
        f"{_MAN}/de/man1/dpkg-deb.1.gz",
        "Debian dpkg",
        "77a0a1010f23f8befb61931a798849a639e0649e8de81bbcb28e427ed0810c3d",
        "BESCHREIBUNG",
    ),
    Source(
        "apt-get-man-de",
        "de",
        f"{_MAN}/de/man8/apt-get.8.gz",
        "Debian apt",
        "24d8d48edae57040fa48d112ffd4fe9f81cb48c6eac6a0a812cb4350d4b8d897",
        "BESCHREIBUNG",
    ),
    Source(
        "apt-conf-man-de",
        "de",
        f"{_MAN}/de/man5/apt.conf.5.gz",
        "Debian apt",
        "b4edfef5888ca64892d4f169bc4cc92b2e4ae5a9f32531ae7244d110558fb887",
        "BESCHREIBUNG",
    ),
    Source(
        "dpkg-man-fr",
        "fr",
        f"{_MAN}/fr/man1/dpkg.1.gz",
        "Debian dpkg",
        "9e40b9c6157cbb54462d03c3dd111a0dc0e944f7d56d406c46ca3eb9b4d5b0a5",
        "DESCRIPTION",
    ),
    Source(
        "apt-get-man-fr",
        "fr",
        f"{_MAN}/fr/man8/apt-get.8.gz",
        "Debian apt",
        "3b008314970fab8c9b6c7cd07650582640bbeee038861c8376e80e0f741bada7",
        "DESCRIPTION",
    ),
    Source(
        "apt-conf-man-fr",
        "fr",
        f"{_MAN}/fr/man5/apt.conf.5.gz",
        "Debian apt",
        "ce60b4d99b616e0823b534d2395323d687e912454bdc3308eea40f1dc29320b4",
        "DESCRIPTION",
    ),
    Source(
        "apt-cache-man-es",
        "es",
        f"{_MAN}/es/man8/apt-cache.8.gz",
        "Debian apt",
        "bc9354cd526a29a65d50570e772a9be9dfae4e2401021b0fe5d1c4d4c291d8b9",
        "DESCRIPCIÓN",
    ),
    Source(
        "apt-preferences-man-es",
        "es",
        f"{_MAN}/es/man5/apt_preferences.5.gz",
        "Debian apt",
        "21f3be2a242f990afc8044d51e623c2cef9fb25de75fdc9b5bd3a6a36cce75b2",
        "DESCRIPCIÓN",
    ),
    Source(
        "man-man-es",
        "es",
        f"{_MAN}/es/man1/man.1.gz",
        "Debian man-db",
        "fb76dfd3bc5a16895055a09676a03bb0e57a8f4466ae3a05c1732ca401fcd428",
        "DESCRIPCIÓN",
    ),
    Source(
        "apt-get-man-ja",
        "ja",
        f"{_MAN}/ja/man8/apt-get.8.gz",
        "Debian apt",
        "4bfec2699d2f759b96fe71b5217fb632608d84ea12c98c14f678221c0cc1b15f",
        "説明",
    ),
    Source(
        "man-man-ja",
        "ja",
        f"{_MAN}/ja/man1/man.1.gz",
        "Debian man-db",
        "acab73c149fe4937a2acc8b250adcfd25bf03d63d9421afe042f1f2268cb5575",
        "説明",
    ),
    # Tool output: CycloneDX SBOMs (JSON, written by cargo-cyclonedx) of pinned wheels.
    Source(
        "maturin-sbom",
        "json",
        "{purelib}/maturin-1.16.0.dist-info/sboms/maturin.cyclonedx.json",
        "wheel maturin 1.16.0",
        "111b4eb05b6d8b690ee588f1716067704833fc3c661724436dc264fa82622dd7",
        chars=WHOLE,
    ),
    Source(
        "ruff-sbom",
        "json",
        "{purelib}/ruff-0.17.6.dist-info/sboms/ruff.cyclonedx.json",
        "wheel ruff 0.17.6",
        "0b750237e234603778cf4c68103994b515db9526d38d03ea8959af8481ecdb85",
        chars=WHOLE,
    ),
]
BY_NAME = {s.name: s for s in SOURCES}


def main() -> None:
    """Prints each source's current hash (or why it cannot be read)."""
    for source in SOURCES:
        path = resolved(source)
        if not path.is_file():
            print(f"{source.name}: MISSING {path}")
            continue
        raw = _read(path)
        text = troff.render(raw) if source.is_man else raw
        try:
            part = _part(text, source.start, source.chars)
        except ValueError:
            print(f"{source.name}: no line starting {source.start!r}")
            continue
        digest = hashlib.sha256((raw if source.is_man else part).encode()).hexdigest()
        print(f"{source.name}: {digest} ({len(part)} chars)")


if __name__ == "__main__":
    main()

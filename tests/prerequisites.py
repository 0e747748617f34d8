"""What `make test` needs on the machine beyond what it installs into .venv, checked before anything
is built: a missing tool stops the run in seconds, with the command that installs it, rather than
failing its tests after ten minutes. `make test-fast` needs none of these.

Run with the system's python3 (the venv may not exist yet): `python3 tests/prerequisites.py`.
"""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Debian packages the integration tests and the benchmarks start: the page's browser, PostgreSQL's
# server binaries (throwaway clusters), the balancer in front of two workers, the gateway
# benchmark's HTTP load tool.
DEBIAN = {
    "chromium": ("the preview page's browser test", lambda: Path("/usr/bin/chromium").exists()),
    "postgresql": ("the store's tests", lambda: bool(glob.glob("/usr/lib/postgresql/*/bin/initdb"))),
    "haproxy": ("the balancer test and benchmark", lambda: Path("/usr/sbin/haproxy").exists()),
    "wrk": ("the gateway benchmark's load tool", lambda: Path("/usr/bin/wrk").exists()),
    "libsqlite3-dev": (
        "the core's link to the system's SQLite (its group commits)",
        lambda: bool(glob.glob("/usr/lib/*/libsqlite3.so") + glob.glob("/usr/lib/libsqlite3.so")),
    ),
}


def _go_version() -> tuple[int, ...] | None:
    go = shutil.which("go")
    if go is None:
        return None
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout
    found = re.match(r"go(\d+)\.(\d+)", out.strip())
    return tuple(int(n) for n in found.groups()) if found else None


def _go_wanted() -> tuple[int, ...]:
    text = (ROOT / "clients" / "go" / "go.mod").read_text(encoding="utf-8")
    found = re.search(r"^go (\d+)\.(\d+)", text, re.MULTILINE)
    assert found is not None, "clients/go/go.mod names its Go version"
    return tuple(int(n) for n in found.groups())


# The gateway's Node test (tests/node: the openai npm package, installed by `npm ci`).
NODE_WANTED = 20


def _node_version() -> int | None:
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        return None
    out = subprocess.run([node, "--version"], capture_output=True, text=True, check=False).stdout
    found = re.match(r"v(\d+)\.", out.strip())
    return int(found.group(1)) if found else None


def missing() -> list[str]:
    """One line per missing prerequisite, each with what installs it."""
    lines = []
    absent = {package: why for package, (why, present) in DEBIAN.items() if not present()}
    if absent:
        named = ", ".join(f"{package} ({why})" for package, why in absent.items())
        lines.append(f"missing: {named}; as root: apt-get install -y {' '.join(absent)}")
    if shutil.which("cargo") is None:
        lines.append("missing: cargo (the Rust toolchain); install it from https://rustup.rs")
    wanted, have = _go_wanted(), _go_version()
    if have is None or have < wanted:
        shown = ".".join(map(str, wanted))
        found = f"found {'.'.join(map(str, have))}" if have else "not found"
        lines.append(
            f"missing: Go {shown} or newer ({found}; buf, ghz and the Go client test); https://go.dev/dl"
        )
    node = _node_version()
    if node is None or node < NODE_WANTED:
        found = f"found {node}" if node else "node or npm not found"
        lines.append(
            f"missing: Node {NODE_WANTED} or newer with npm ({found}; the gateway's Node client test); "
            "as root: apt-get install -y nodejs npm"
        )
    return lines


def main() -> int:
    lines = missing()
    for line in lines:
        print(line, file=sys.stderr)
    if lines:
        print("`make test-fast` runs the unit tier without these.", file=sys.stderr)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())

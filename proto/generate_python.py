"""Generate the committed Python code for the API under service/contextshift/_proto/.

    python proto/generate_python.py          # write it (`make proto`)
    python proto/generate_python.py --check  # exit 1 if the committed code is stale

protoc (from the pinned grpcio-tools) writes `_pb2.py`; mypy-protobuf writes typed `.pyi` stubs for
messages and services. The .proto package `contextshift.v1` would import as `contextshift.v1`, which
is not where the code lives, so imports are rewritten to `contextshift._proto.contextshift.v1`.
The descriptors themselves keep the real package names (reflection and the wire need them).
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc_tools  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
TARGET = ROOT / "service" / "contextshift" / "_proto"
PREFIX = "contextshift._proto."

# `from contextshift.v1 import x_pb2`, `import contextshift.v1.x_pb2`, and dotted references to
# generated modules in stubs and builder calls; never the descriptors' `contextshift.v1.Block`.
_IMPORT = re.compile(r"\b(from|import) (contextshift\.(?:bench\.)?v1)\b")
_MODULE_REF = re.compile(r"(?<![\w./])(contextshift\.(?:bench\.)?v1\.\w+_pb2(?:_grpc)?)\b")


def _rewrite(text: str) -> str:
    text = _IMPORT.sub(lambda m: f"{m.group(1)} {PREFIX}{m.group(2)}", text)
    return _MODULE_REF.sub(lambda m: PREFIX + m.group(1), text)


def run_protoc(*args: str) -> None:
    """The pinned protoc (grpcio-tools) over proto/, with the well-known types it ships."""
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", *args]
    subprocess.run(command, check=True, cwd=PROTO_ROOT)


def generate(out: Path) -> None:
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    scripts = Path(sys.executable).parent  # mypy-protobuf's plugins sit beside this interpreter
    run_protoc(
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--plugin=protoc-gen-mypy={scripts / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={scripts / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *protos,
    )
    for path in out.rglob("*.py*"):
        path.write_text(_rewrite(path.read_text(encoding="utf-8")), encoding="utf-8")
    for package in {out, *(p.parent for p in out.rglob("*_pb2.py"))}:
        while package != out.parent:
            (package / "__init__.py").touch()
            package = package.parent


def _differences(left: Path, right: Path) -> list[str]:
    names = {p.relative_to(left) for p in left.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    names |= {p.relative_to(right) for p in right.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    return sorted(
        str(n)
        for n in names
        if not ((left / n).is_file() and (right / n).is_file() and filecmp.cmp(left / n, right / n, False))
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="compare with the committed code; write nothing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "_proto"
        fresh.mkdir()
        generate(fresh)
        if args.check:
            stale = _differences(fresh, TARGET)
            for name in stale:
                print(f"stale: service/contextshift/_proto/{name}", file=sys.stderr)
            if stale:
                print("run `make proto` to regenerate", file=sys.stderr)
            return 1 if stale else 0
        shutil.rmtree(TARGET, ignore_errors=True)
        shutil.copytree(fresh, TARGET)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

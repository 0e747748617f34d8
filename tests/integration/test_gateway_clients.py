"""Clients a user brings, pointed at the gateway by their base URL alone: the `openai` npm package
from Node (tests/node, installed with `npm ci` from its lock file) and LangChain's ChatOpenAI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from fake_provider import FakeProvider
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI

from .conftest import ServerProcess
from .gateway_support import OPENAI_MODEL, module_gateway, module_provider, reset_provider, settled

NODE_PROJECT = Path(__file__).resolve().parents[1] / "node"


fake = pytest.fixture(scope="module", name="fake")(module_provider)
server = pytest.fixture(scope="module", name="server")(module_gateway)
fresh = pytest.fixture(autouse=True, name="fresh")(reset_provider)


def node_modules() -> Path:
    """tests/node's packages, installed from its lock file (the npm registry) when missing or older
    than the lock file."""
    installed = NODE_PROJECT / "node_modules" / ".package-lock.json"
    lock = NODE_PROJECT / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        npm = shutil.which("npm")
        assert npm is not None, "npm is missing (Node 20+ with npm: apt-get install -y nodejs npm)"
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_PROJECT, check=True, timeout=300)
    return installed.parent


def test_the_openai_npm_package_from_node(server: ServerProcess, fake: FakeProvider) -> None:
    node_modules()
    node = shutil.which("node")
    assert node is not None
    environment = os.environ | {"GATEWAY_URL": server.http_url, "SMALL_MODEL": OPENAI_MODEL}
    ran = subprocess.run(
        [node, "gateway.mjs"], cwd=NODE_PROJECT, env=environment, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert out["chat"] == "done" and out["kept"] == "2"
    assert out["stream"] == "part0 part1 part2 " and out["streamUsage"] > 0
    assert out["responses"] == "done"
    assert out["error"] == "400 context_length_exceeded"
    assert fake.requests[0].headers["user-agent"].startswith("OpenAI/JS")
    assert fake.requests[0].headers["authorization"] == "Bearer sk-node-0123456789"
    assert settled(server, "node-chat")["status"] == "GENERATION_STATUS_COMPLETED"


def test_langchain_chat_openai(server: ServerProcess, fake: FakeProvider) -> None:
    llm = ChatOpenAI(
        model="gpt-4o",
        base_url=f"{server.http_url}/v1",
        api_key="sk-langchain-0123456789",
        max_retries=0,
        default_headers={"x-chat-id": "langchain"},
    )
    answer = llm.invoke([SystemMessage("Be terse."), HumanMessage("hello")])
    assert answer.content == "done"
    assert "".join(str(chunk.content) for chunk in llm.stream("hello")) == "part0 part1 part2 "
    assert settled(server, "langchain")["status"] == "GENERATION_STATUS_COMPLETED"

    # A history over the small model's window: fitted on the way, the oldest turns left out.
    small = ChatOpenAI(
        model=OPENAI_MODEL,
        base_url=f"{server.http_url}/v1",
        api_key="sk-langchain-0123456789",
        max_retries=0,
        max_tokens=500,
    )
    history: list[SystemMessage | HumanMessage | AIMessage] = [SystemMessage("Be terse.")]
    for i in range(20):
        history += [
            HumanMessage(f"question {i} " + "about lakes " * 300),
            AIMessage(f"answer {i} " + "lakes " * 300),
        ]
    history.append(HumanMessage("and now?"))
    assert small.invoke(history).content == "done"
    received = fake.last.body["messages"]
    assert received[0]["content"] == "Be terse." and received[-1]["content"] == "and now?"
    assert len(received) < len(history)

"""The deployment kit against the server it deploys: containers cannot run on the machines this
project is built on, so what can be checked without them is checked here. Every YAML file under
deploy/ parses; the Kubernetes core objects validate against Kubernetes' own schemas (the
`kubernetes-validate` package bundles them), strictly (no unknown field); and the ports, probe
paths, environment variables and header in the Dockerfile, the manifests and the HAProxy
configuration are the server's real ones, read from the code (`config.SETTINGS`, the HTTP app's
routes answering as liveness and readiness do, `chat_header.HEADER`), not from a copy.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from unittest import mock

import kubernetes_validate
import pytest
import yaml
from starlette.testclient import TestClient

from contextshift.api import config
from contextshift.api.http.app import HttpApi
from contextshift.api.service import chat_header
from contextshift.api.service.gate import Gate

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
KUBERNETES_VERSION = "1.30.0"  # the oldest minor the manifests are meant for
CORE_KINDS = {"Deployment", "Service", "Secret"}
SETTINGS = {s.env: s for s in config.SETTINGS}
DEFAULTS = {s.name: s.default for s in config.SETTINGS}


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def manifests() -> list[dict[str, Any]]:
    return [d for path in sorted(KUBERNETES.glob("*.yaml")) for d in documents(path)]


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [d for d in manifests() if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return found


def setting_value(env: dict[str, str], name: str) -> Any:
    """A setting's value as the container's environment leaves it (else its default)."""
    setting = next(s for s in config.SETTINGS if s.name == name)
    return setting.kind(env[setting.env]) if setting.env in env else setting.default


@pytest.fixture(scope="module")
def http_app() -> tuple[HttpApi, TestClient]:
    """The server's real HTTP routes (the service's methods stubbed: only health is asked)."""
    api = HttpApi(mock.Mock(), Gate(None), max_request_bytes=1024)
    return api, TestClient(api.app())


def answers_as_liveness(app: tuple[HttpApi, TestClient], path: str) -> bool:
    """200 even while the server is not ready (draining): the liveness route."""
    api, client = app
    api.ready = False
    try:
        return client.get(path).status_code == 200
    finally:
        api.ready = True


def answers_as_readiness(app: tuple[HttpApi, TestClient], path: str) -> bool:
    """200 while ready, 503 while draining: the readiness route."""
    api, client = app
    ready = client.get(path).status_code
    api.ready = False
    try:
        return (ready, client.get(path).status_code) == (200, 503)
    finally:
        api.ready = True


def test_every_yaml_file_parses_and_the_kustomization_lists_every_manifest() -> None:
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert files
    for path in files:
        assert documents(path), path
    listed = documents(KUBERNETES / "kustomization.yaml")[0]["resources"]
    assert sorted(listed) == sorted(
        p.name for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml"
    )


def test_the_core_objects_validate_against_kubernetes_schemas() -> None:
    core = [d for d in manifests() if d["kind"] in CORE_KINDS]
    assert {d["kind"] for d in core} == CORE_KINDS
    for document in core:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    broken = one("Deployment") | {"spec": {"replicas": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def container() -> dict[str, Any]:
    (found,) = one("Deployment")["spec"]["template"]["spec"]["containers"]
    return found


def container_env() -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container()["env"]}


def test_the_deployment_sets_real_settings_and_listens_where_the_server_does() -> None:
    env = container_env()
    assert set(env) <= set(SETTINGS), set(env) - set(SETTINGS)
    assert setting_value(env, "host") == "0.0.0.0"  # reachable from the probes and the gateway
    ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    assert ports == {"grpc": setting_value(env, "port"), "http": setting_value(env, "http_port")}
    # The store's URL comes from the Secret, under the store setting's variable.
    (store,) = [e for e in container()["env"] if e["name"] == SETTINGS["CONTEXTSHIFT_STORE"].env]
    ref = store["valueFrom"]["secretKeyRef"]
    secret = one("Secret", ref["name"])
    assert ref["key"] in secret["stringData"] and secret["stringData"][ref["key"]].startswith("postgresql://")
    # Its drain and the calls in flight fit in the pod's grace period.
    grace = one("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert setting_value(env, "drain_seconds") + setting_value(env, "grace_seconds") < grace


def test_the_probes_ask_the_servers_liveness_and_readiness_routes(
    http_app: tuple[HttpApi, TestClient],
) -> None:
    probes = {
        name: container()[name]["httpGet"] for name in ("livenessProbe", "readinessProbe", "startupProbe")
    }
    assert {p["port"] for p in probes.values()} == {"http"}
    assert answers_as_liveness(http_app, probes["livenessProbe"]["path"])
    assert answers_as_liveness(http_app, probes["startupProbe"]["path"])
    assert answers_as_readiness(http_app, probes["readinessProbe"]["path"])


def test_the_service_and_the_routes_reach_the_containers_ports() -> None:
    service = one("Service", "contextshift")
    named = {p["name"]: p for p in container()["ports"]}
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in named
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    assert by_name["grpc"]["appProtocol"] == "kubernetes.io/h2c"  # cleartext HTTP/2 to the pods
    assert (
        service["spec"]["selector"].items()
        <= one("Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )
    for kind, port in (("GRPCRoute", "grpc"), ("HTTPRoute", "http")):
        (rule,) = one(kind)["spec"]["rules"]
        assert rule["backendRefs"] == [{"name": "contextshift", "port": by_name[port]["port"]}]


def test_the_gateway_hashes_the_servers_chat_header_on_both_routes() -> None:
    policy = one("BackendTrafficPolicy")
    balancing = policy["spec"]["loadBalancer"]
    assert balancing["type"] == "ConsistentHash"
    assert balancing["consistentHash"] == {"type": "Headers", "headers": [{"name": chat_header.HEADER}]}
    targets = {(t["kind"], t["name"]) for t in policy["spec"]["targetRefs"]}
    assert targets == {(d["kind"], d["metadata"]["name"]) for d in manifests() if d["kind"].endswith("Route")}


def test_the_haproxy_configuration_hashes_the_chat_header_and_checks_readiness(
    http_app: tuple[HttpApi, TestClient],
) -> None:
    text = (DEPLOY / "haproxy" / "haproxy.cfg").read_text()
    balances = re.findall(r"^\s*balance (.+)$", text, re.MULTILINE)
    assert balances == [f"hdr({chat_header.HEADER})"] * 2
    assert re.findall(r"^\s*hash-type (.+)$", text, re.MULTILINE) == ["consistent"] * 2
    (check,) = re.findall(r"http-check send meth GET uri (\S+)", text)
    assert answers_as_readiness(http_app, check)


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_the_dockerfile_builds_the_wheel_apart_and_runs_the_server_as_it_is_configured(
    http_app: tuple[HttpApi, TestClient],
) -> None:
    instructions = dockerfile()
    stages = [args for op, args in instructions if op == "FROM"]
    assert len(stages) == 2 and stages[0].endswith(" AS builder")  # multi-stage
    assert any(op == "RUN" and "maturin build" in args for op, args in instructions)
    assert any(op == "COPY" and args.startswith("--from=builder /wheels") for op, args in instructions)
    env = dict(pair.split("=", 1) for op, args in instructions if op == "ENV" for pair in shlex.split(args))
    assert {name for name in env if name.startswith("CONTEXTSHIFT_")} <= set(SETTINGS)
    assert setting_value(env, "host") == "0.0.0.0"
    (exposed,) = [args.split() for op, args in instructions if op == "EXPOSE"]
    assert [int(p) for p in exposed] == [setting_value(env, "port"), setting_value(env, "http_port")]
    (user,) = [args for op, args in instructions if op == "USER"]
    assert user not in {"root", "0"}
    (health,) = [args for op, args in instructions if op == "HEALTHCHECK"]
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\S*?)'", health)
    assert url is not None and int(url.group(1)) == setting_value(env, "http_port")
    assert answers_as_liveness(http_app, url.group(2))
    (entrypoint,) = [args for op, args in instructions if op == "ENTRYPOINT"]
    (command,) = [args for op, args in instructions if op == "CMD"]
    assert (entrypoint, command) == ('["contextshift"]', '["serve"]')

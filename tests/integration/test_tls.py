"""TLS and mutual TLS on both surfaces, with certificates made for each test run (trustme): with TLS
on, plaintext is refused; under mTLS a client without a certificate (or with one from another CA)
is refused, and one the client CA signed is served."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
import trustme

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift._proto.contextshift.v1 import context_service_pb2_grpc

from .conftest import ServerProcess, start_server

PREVIEW = pb.PreviewContextRequest(blocks_json='[{"role": "user", "content": "hi"}]')


@dataclass
class Pki:
    """A server CA and certificate, a client CA and a client it signed, and a stranger from another CA."""

    directory: Path
    server_ca: trustme.CA
    client_ca: trustme.CA
    client: trustme.LeafCert
    stranger: trustme.LeafCert

    def path(self, name: str) -> str:
        return str(self.directory / name)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    server_ca, client_ca = trustme.CA(), trustme.CA()
    server = server_ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(str(directory / "server.pem"))
    server.private_key_pem.write_to_path(str(directory / "server.key"))
    server_ca.cert_pem.write_to_path(str(directory / "server-ca.pem"))
    client_ca.cert_pem.write_to_path(str(directory / "client-ca.pem"))
    return Pki(
        directory, server_ca, client_ca, client_ca.issue_cert("client-1"), trustme.CA().issue_cert("client-2")
    )


@pytest.fixture(scope="module")
def tls_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    flags = ["--tls-cert", pki.path("server.pem"), "--tls-key", pki.path("server.key")]
    running = start_server(tmp_path_factory.mktemp("tls"), *flags)
    yield running
    assert running.terminate() == 0


@pytest.fixture(scope="module")
def mtls_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    flags = ["--tls-cert", pki.path("server.pem"), "--tls-key", pki.path("server.key")]
    running = start_server(
        tmp_path_factory.mktemp("mtls"), *flags, "--tls-client-ca", pki.path("client-ca.pem")
    )
    yield running
    assert running.terminate() == 0


def grpc_preview(
    server: ServerProcess, credentials: grpc.ChannelCredentials | None
) -> pb.PreviewContextResponse:
    channel = (
        grpc.insecure_channel(server.address)
        if credentials is None
        else grpc.secure_channel(server.address, credentials)
    )
    with channel:
        response: pb.PreviewContextResponse = context_service_pb2_grpc.ContextShiftServiceStub(
            channel
        ).PreviewContext(PREVIEW, timeout=5)
        return response


def credentials(pki: Pki, client: trustme.LeafCert | None = None) -> grpc.ChannelCredentials:
    root = pki.server_ca.cert_pem.bytes()
    if client is None:
        return grpc.ssl_channel_credentials(root)
    return grpc.ssl_channel_credentials(
        root, client.private_key_pem.bytes(), b"".join(pem.bytes() for pem in client.cert_chain_pems)
    )


def https(server: ServerProcess, pki: Pki, client: trustme.LeafCert | None = None) -> httpx.Client:
    context = ssl.create_default_context()
    pki.server_ca.configure_trust(context)
    if client is not None:
        client.configure_cert(context)
    return httpx.Client(base_url=f"https://127.0.0.1:{server.http_port}", verify=context, timeout=5)


def http_preview(client: httpx.Client) -> httpx.Response:
    return client.post("/api/v2/context-preview", json={"blocksJson": [{"role": "user", "content": "hi"}]})


def test_tls_serves_both_surfaces_and_refuses_plaintext(tls_server: ServerProcess, pki: Pki) -> None:
    assert grpc_preview(tls_server, credentials(pki)).plan.kept
    with pytest.raises(grpc.RpcError) as caught:
        grpc_preview(tls_server, None)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    with https(tls_server, pki) as client:
        assert http_preview(client).status_code == 200
    with pytest.raises(httpx.TransportError), httpx.Client(base_url=tls_server.http_url, timeout=5) as plain:
        http_preview(plain)
    serving = next(line for line in tls_server.log_lines() if line["msg"] == "serving")
    assert serving["tls"] is True


def test_mutual_tls_needs_a_client_certificate_from_the_client_ca(
    mtls_server: ServerProcess, pki: Pki
) -> None:
    assert grpc_preview(mtls_server, credentials(pki, pki.client)).plan.kept
    for refused in (credentials(pki), credentials(pki, pki.stranger)):
        with pytest.raises(grpc.RpcError) as caught:
            grpc_preview(mtls_server, refused)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    with https(mtls_server, pki, pki.client) as client:
        assert http_preview(client).status_code == 200
    for stranger in (None, pki.stranger):
        with pytest.raises(httpx.TransportError), https(mtls_server, pki, stranger) as client:
            http_preview(client)
    serving = next(line for line in mtls_server.log_lines() if line["msg"] == "serving")
    assert serving["tls"] == "mutual"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tls-cert", "server.pem"], "tls_cert and tls_key: set both or neither"),
        (["--tls-client-ca", "client-ca.pem"], "tls_client_ca: mutual TLS needs tls_cert and tls_key too"),
        (["--tls-cert", "server.pem", "--tls-key", "missing.key"], "tls_key: [Errno 2]"),
        (["--tls-cert", "server-ca.pem", "--tls-key", "server.key"], "not a PEM certificate and its key"),
    ],
)
def test_bad_tls_settings_stop_the_start(pki: Pki, tmp_path: Path, flags: list[str], message: str) -> None:
    paths = [pki.path(flag) if not flag.startswith("--") else flag for flag in flags]
    running = start_server(tmp_path, *paths, wait=False)
    assert running.proc.wait(30) == 2
    assert message in running.log_path.read_text()

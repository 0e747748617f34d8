"""TLS for both surfaces from the `tls_cert`, `tls_key` and `tls_client_ca` files (PEM). With a
client CA, a client must present a certificate it signed (mutual TLS); without, any client may
connect over TLS. With TLS on, plaintext connections are refused on both ports."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import grpc

from contextshift.api.config import ConfigError, ServerConfig


@dataclass(frozen=True)
class Tls:
    cert_file: str
    key_file: str
    client_ca_file: str | None
    cert: bytes
    key: bytes
    client_ca: bytes | None

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )

    @property
    def client_cert_reqs(self) -> ssl.VerifyMode:
        return ssl.CERT_REQUIRED if self.client_ca is not None else ssl.CERT_NONE


def _read(setting: str, path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as e:
        raise ConfigError(f"{setting}: {e}") from None


def load(config: ServerConfig) -> Tls | None:
    """The TLS files of `config`, read and checked (a key that does not match its certificate,
    or a file that is not PEM, is a ConfigError); None when TLS is off."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    cert = _read("tls_cert", config.tls_cert)
    key = _read("tls_key", config.tls_key)
    client_ca = None if config.tls_client_ca is None else _read("tls_client_ca", config.tls_client_ca)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except ssl.SSLError as e:
        raise ConfigError(f"tls_cert, tls_key: not a PEM certificate and its key ({e})") from None
    if config.tls_client_ca is not None:
        try:
            context.load_verify_locations(config.tls_client_ca)
        except ssl.SSLError as e:
            raise ConfigError(f"tls_client_ca: not PEM certificates ({e})") from None
    return Tls(config.tls_cert, config.tls_key, config.tls_client_ca, cert, key, client_ca)

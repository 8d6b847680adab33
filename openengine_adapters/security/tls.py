"""Transport security: TLS and mTLS server credentials that pick up renewed certificates.

gRPC asks ``CertificateReloader.fetch`` for the certificate configuration at every handshake
(``grpc.dynamic_ssl_server_credentials``), so a renewed certificate (cert-manager, a rotated
secret, a re-run ACME client) is served from the next connection on without a restart. A file is
re-read when its stat (size, mtime, inode: a swapped symlink counts) changes, or on SIGHUP
(``reload``). A half-written or mismatched pair is refused with a warning and the previous one
stays in service, so a rotation can never take the port down.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from dataclasses import dataclass

import grpc

log = logging.getLogger(__name__)


class TlsConfigError(ValueError):
    """The TLS settings are incomplete or their files cannot be used."""


@dataclass(frozen=True)
class TlsFiles:
    """The server's certificate chain and key (PEM), and for mTLS the CA that signs client certificates."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    @classmethod
    def from_options(cls, cert_file: str | None, key_file: str | None,
                     client_ca_file: str | None) -> TlsFiles | None:
        """None when TLS is off; refuses half a configuration rather than serving plaintext."""
        if not (cert_file or key_file or client_ca_file):
            return None
        if not (cert_file and key_file):
            raise TlsConfigError("TLS needs both --tls-cert-file and --tls-key-file"
                                 + (" (--tls-client-ca-file alone cannot serve TLS)" if client_ca_file else ""))
        return cls(cert_file, key_file, client_ca_file or None)

    def paths(self) -> tuple[str, ...]:
        return (self.cert_file, self.key_file) + ((self.client_ca_file,) if self.client_ca_file else ())


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _stamp(paths: tuple[str, ...]) -> tuple:
    out = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def _load(files: TlsFiles) -> grpc.ServerCertificateConfiguration:
    """Read and check the files: the key must match the certificate (checked with ``ssl``, since
    gRPC would only fail the next handshakes), the client CA must be PEM."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(files.cert_file, files.key_file)
        cert, key = _read(files.cert_file), _read(files.key_file)
        ca = None
        if files.client_ca_file:
            ssl.create_default_context(cafile=files.client_ca_file)
            ca = _read(files.client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"TLS files unusable ({', '.join(files.paths())}): {exc}") from exc
    return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)


class CertificateReloader:
    """The certificate configuration gRPC asks for at each handshake, re-read when the files change."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._lock = threading.Lock()  # gRPC may call fetch from its own threads
        self._stamp = _stamp(files.paths())
        self._initial = _load(files)  # unusable files stop start-up
        self._refused: tuple | None = None
        self._forced = False
        self.reloads = 0

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._initial, self.fetch, require_client_authentication=self.files.client_ca_file is not None)

    def reload(self) -> None:
        """SIGHUP: re-read the files at the next handshake even if their stat looks unchanged."""
        self._forced = True

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's fetcher: a new configuration when the files changed and load, else None (keep)."""
        with self._lock:
            stamp = _stamp(self.files.paths())
            if not self._forced and (stamp == self._stamp or stamp == self._refused):
                return None
            self._forced = False
            try:
                config = _load(self.files)
            except TlsConfigError as exc:
                self._refused = stamp  # not retried until a file changes again
                log.warning("TLS certificate reload refused, keeping the previous certificate: %s", exc)
                return None
            self._stamp, self._refused = stamp, None
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self.files.cert_file)
            return config


def channel_credentials(ca_file: str | None = None, cert_file: str | None = None,
                        key_file: str | None = None) -> grpc.ChannelCredentials:
    """Client side: trust ``ca_file`` (else the system roots), present ``cert_file``/``key_file`` for mTLS."""
    if bool(cert_file) != bool(key_file):
        raise TlsConfigError("a client certificate needs both its certificate and its key file")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca_file) if ca_file else None,
        private_key=_read(key_file) if key_file else None,
        certificate_chain=_read(cert_file) if cert_file else None)

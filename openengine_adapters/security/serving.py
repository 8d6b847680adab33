"""Everything the security settings put on a gRPC server: its port's credentials, the interceptor,
and the start-up lines that say what is protected and how."""

from __future__ import annotations

import logging
import os

import grpc

from openengine_adapters.security.config import SecurityConfig
from openengine_adapters.security.interceptor import SecurityInterceptor
from openengine_adapters.security.policy import OperatorPolicy
from openengine_adapters.security.tls import CertificateReloader, TlsFiles
from openengine_adapters.security.tokens import TokenSet

log = logging.getLogger(__name__)


class ServerSecurity:
    def __init__(self, config: SecurityConfig) -> None:
        self.config = config
        if config.lora_root and not os.path.isdir(config.lora_root):
            log.warning("LoRA root %s is not a directory (yet): LoadLora refuses every path until it is",
                        config.lora_root)
        files = TlsFiles.from_options(config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file)
        self.certificates = CertificateReloader(files) if files is not None else None
        self.tokens = TokenSet(config.api_keys, config.admin_api_keys)
        self.policy = OperatorPolicy(self.tokens.has_admin_key, config.allow_remote_operator)
        self.interceptor = SecurityInterceptor(self.tokens, self.policy)

    def bind(self, server: grpc.aio.Server, address: str) -> int:
        """Add the listening port (TLS when configured); returns the port, 0 when binding failed."""
        if self.certificates is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address, self.certificates.credentials())

    def reload(self) -> None:
        """SIGHUP: re-read the TLS files at the next handshake."""
        if self.certificates is not None:
            self.certificates.reload()

    def describe(self) -> list[str]:
        c = self.config
        if self.certificates is None:
            transport = "plaintext (no --tls-cert-file)"
        elif c.tls_client_ca_file:
            transport = f"mTLS (client certificates signed by {c.tls_client_ca_file})"
        else:
            transport = "TLS"
        auth = (f"{len(c.api_keys)} API key(s) required on every RPC but grpc.health" if c.api_keys
                else "no API key: data RPCs are open")
        lora = f"under {c.lora_root}" if c.lora_root else "loaded by loopback callers only (no --lora-root)"
        return [f"transport: {transport}", f"authentication: {auth}", self.policy.describe(),
                f"reflection: {'on' if c.reflection else 'off'}", f"LoRA adapter directories: {lora}"]

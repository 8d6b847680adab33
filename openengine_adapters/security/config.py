"""The security settings, one set for every launcher (flags), the plugins (environment) and tests.

Keys may come from a flag (repeatable), an environment variable or a file (one key a line); they
add up. In plugin mode the engine server's own ``--api-key`` joins them, so the gRPC port is never
weaker than the HTTP port beside it.
"""

from __future__ import annotations

import argparse
import os

from pydantic import BaseModel, ConfigDict

from openengine_adapters.security.tokens import read_key_file

API_KEY_ENV = "OPENENGINE_API_KEY"
ADMIN_API_KEY_ENV = "OPENENGINE_ADMIN_API_KEY"
# the plugins' flags, as variables (plugin_server_config)
ENV = {
    "tls_cert_file": "OPENENGINE_TLS_CERT_FILE",
    "tls_key_file": "OPENENGINE_TLS_KEY_FILE",
    "tls_client_ca_file": "OPENENGINE_TLS_CLIENT_CA_FILE",
    "api_key_file": "OPENENGINE_API_KEY_FILE",
    "admin_api_key_file": "OPENENGINE_ADMIN_API_KEY_FILE",
    "allow_remote_operator": "OPENENGINE_ALLOW_REMOTE_OPERATOR",
    "reflection": "OPENENGINE_REFLECTION",
    "lora_root": "OPENENGINE_LORA_ROOT",
}
_TRUE, _FALSE = frozenset({"1", "true", "yes", "on"}), frozenset({"0", "false", "no", "off"})


class SecurityConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    api_keys: tuple[str, ...] = ()
    admin_api_keys: tuple[str, ...] = ()
    allow_remote_operator: bool = False
    reflection: bool = True
    lora_root: str | None = None


def add_security_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("OpenEngine security")
    group.add_argument("--tls-cert-file", default=None,
                       help="serve TLS with this PEM certificate chain (re-read when it changes or on SIGHUP)")
    group.add_argument("--tls-key-file", default=None, help="the PEM private key of --tls-cert-file")
    group.add_argument("--tls-client-ca-file", default=None,
                       help="mTLS: require client certificates signed by this PEM CA bundle")
    # dest api_key / admin_api_key: the same names as SGLang's own flags, which these replace in its sidecar
    group.add_argument("--api-key", dest="api_key", action="append", default=None, metavar="KEY",
                       help=f"require 'authorization: Bearer KEY' on every RPC (repeatable; also ${API_KEY_ENV})")
    group.add_argument("--api-key-file", default=None, help="more API keys, one per line")
    group.add_argument("--admin-api-key", dest="admin_api_key", action="append", default=None, metavar="KEY",
                       help="the key of the operator RPCs: Abort of all requests, Drain, LoadLora, UnloadLora "
                            f"(repeatable; also ${ADMIN_API_KEY_ENV}); valid on every other RPC too")
    group.add_argument("--admin-api-key-file", default=None, help="more admin keys, one per line")
    group.add_argument("--allow-remote-operator", action="store_true",
                       help="without an admin key, accept operator RPCs from any authenticated peer "
                            "(default: loopback only)")
    group.add_argument("--no-reflection", dest="reflection", action="store_false", help="turn server reflection off")
    group.add_argument("--lora-root", default=None,
                       help="LoadLora accepts only adapter directories under this directory")


def _keys(values, env: str, file: str | None) -> tuple[str, ...]:
    keys: list[str] = []
    if isinstance(values, str):
        values = [values]
    keys += [v for v in values or () if v is not None]
    if os.environ.get(env):
        keys.append(os.environ[env])
    if file:
        keys += read_key_file(file)
    return tuple(dict.fromkeys(keys))


def security_from_args(ns: argparse.Namespace) -> SecurityConfig:
    return SecurityConfig(
        tls_cert_file=ns.tls_cert_file, tls_key_file=ns.tls_key_file, tls_client_ca_file=ns.tls_client_ca_file,
        api_keys=_keys(ns.api_key, API_KEY_ENV, ns.api_key_file),
        admin_api_keys=_keys(ns.admin_api_key, ADMIN_API_KEY_ENV, ns.admin_api_key_file),
        allow_remote_operator=ns.allow_remote_operator, reflection=ns.reflection, lora_root=ns.lora_root)


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(ENV[name], "").strip().lower()
    if not value:
        return default
    if value not in _TRUE | _FALSE:
        raise ValueError(f"{ENV[name]}: {value!r} is not a boolean (1/0, true/false)")
    return value in _TRUE


def security_from_env(engine_api_keys=(), engine_admin_api_keys=(), lora_root: str | None = None) -> SecurityConfig:
    """A plugin's settings: the variables of ``ENV`` plus the engine server's own keys and LoRA root."""
    env = {name: os.environ.get(var) or None for name, var in ENV.items()}
    return SecurityConfig(
        tls_cert_file=env["tls_cert_file"], tls_key_file=env["tls_key_file"],
        tls_client_ca_file=env["tls_client_ca_file"],
        api_keys=_keys(tuple(engine_api_keys), API_KEY_ENV, env["api_key_file"]),
        admin_api_keys=_keys(tuple(engine_admin_api_keys), ADMIN_API_KEY_ENV, env["admin_api_key_file"]),
        allow_remote_operator=_flag("allow_remote_operator", False), reflection=_flag("reflection", True),
        lora_root=env["lora_root"] or lora_root)

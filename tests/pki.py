"""Certificates made at test time with the ``openssl`` command: CAs, server and client certificates."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclass(frozen=True)
class Issued:
    cert: str
    key: str


@dataclass(frozen=True)
class Ca:
    cert: str
    key: str

    def issue(self, directory: Path, name: str, *, hosts: tuple[str, ...] = (), client: bool = False) -> Issued:
        """A leaf certificate signed by this CA: a server one naming ``hosts``, or a client one."""
        cert, key = directory / f"{name}.pem", directory / f"{name}.key"
        usage = "clientAuth" if client else "serverAuth"
        ext = ["-addext", "basicConstraints=critical,CA:FALSE", "-addext", f"extendedKeyUsage={usage}"]
        if hosts:
            san = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() or ":" in h else f"DNS:{h}" for h in hosts)
            ext += ["-addext", f"subjectAltName={san}"]
        _openssl("req", "-x509", "-CA", self.cert, "-CAkey", self.key, *_EC, "-keyout", str(key), "-out", str(cert),
                 "-days", "2", "-subj", f"/CN={name}", *ext)
        return Issued(str(cert), str(key))


def make_ca(directory: Path, name: str) -> Ca:
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl("req", "-x509", *_EC, "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}")
    return Ca(str(cert), str(key))

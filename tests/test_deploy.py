"""The deployments users copy (deploy/): the Kubernetes manifests validated offline against the
Kubernetes schemas (kubernetes-validate bundles them), and every manifest and compose file checked
against what the server does: our flags parse with the launchers' own types, probes follow the
lifecycle (startup until the engine has loaded, readiness off while draining or hung, liveness
any answer), the grace period outlasts the drain, non-root as the image's user, TLS and keys
read from mounted Secrets that exist. (The aggregated compose file is brought up and checked by
the conformance suite in tests/docker.)"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from openengine_adapters.server_config import add_server_args

ROOT = Path(__file__).resolve().parents[1]
KUBERNETES = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
COMPOSE = sorted((ROOT / "deploy" / "compose").glob("*.yaml"))
# the oldest Kubernetes the manifests promise (preStop sleep: 1.30) and the newest schemas bundled
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
IMAGE_USER = int(re.search(r"^USER (\d+)$", (ROOT / "docker" / "vllm" / "Dockerfile").read_text(), re.M).group(1))
FILE_FLAGS = ("tls_cert_file", "tls_key_file", "tls_client_ca_file", "api_key_file", "admin_api_key_file")


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def server_flags(args: list[str]) -> argparse.Namespace:
    """Our flags among ``args`` (the engine's are left over), parsed with the launchers' own types:
    a value out of its bounds fails here as it would at start-up."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_server_args(parser)
    ns, _ = parser.parse_known_args(args)
    return ns


def kinds(kind: str) -> list[tuple[Path, dict]]:
    return [(p, d) for p in KUBERNETES for d in documents(p) if d["kind"] == kind]


def test_there_is_something_to_check():
    assert {p.name for p in KUBERNETES} >= {"aggregated.yaml", "disaggregated.yaml", "secrets.example.yaml"}
    assert {p.name for p in COMPOSE} == {"aggregated.yaml", "disaggregated.yaml"}
    assert len(kinds("Deployment")) == 3 and len(kinds("Service")) == 3


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kubernetes_manifests_validate_against_the_schemas(version):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for path in KUBERNETES:
        for doc in documents(path):
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{path.name} {doc['kind']}/{doc['metadata']['name']} on Kubernetes {version}: "
                            f"{'.'.join(map(str, exc.path))}: {exc.message}")


@pytest.mark.parametrize("path, deployment", kinds("Deployment"), ids=lambda x: getattr(x, "name", ""))
def test_kubernetes_workers_follow_the_server_lifecycle(path, deployment):
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    ns = server_flags(container["args"])
    # probes: the image's health check (Kubernetes' gRPC probes cannot speak TLS)
    assert container["startupProbe"]["exec"]["command"] == ["openengine-healthcheck"]
    assert container["readinessProbe"]["exec"]["command"] == ["openengine-healthcheck"]
    assert container["livenessProbe"]["exec"]["command"] == ["openengine-healthcheck", "--alive"], \
        "liveness must pass a NOT_SERVING (draining or hung) server: a restart would not help"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600, "engine loading takes minutes"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["timeoutSeconds"] > 4, "the health check itself waits up to 4 s"
    # SIGTERM drains for --drain-grace-s; the kubelet must not SIGKILL before
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + ns.drain_grace_s + 15
    # non-root, as the image's user
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == IMAGE_USER
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert "limits" in container["resources"] and "requests" in container["resources"]
    # TLS and keys from mounted Secrets that secrets.example.yaml defines, with the keys named
    assert ns.tls_cert_file and ns.tls_key_file and ns.api_key_file and ns.admin_api_key_file
    env = {e["name"]: e.get("value") for e in container["env"]}
    files = [getattr(ns, f) for f in FILE_FLAGS if getattr(ns, f)] + [env["OPENENGINE_HEALTHCHECK_CA_FILE"]]
    for file in files:
        assert secret_key_of(pod, container, file), f"{path.name}: {file} is not a key of a mounted Secret"
    # ports: the gRPC and metrics ports the flags set are the container's named ports, served by a Service
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc"] == ns.port and ports["metrics"] == ns.metrics_port
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    services = [s for _, s in kinds("Service") if s["spec"]["selector"].items() <= labels.items()]
    assert len(services) == 1 and {p["targetPort"] for p in services[0]["spec"]["ports"]} <= set(ports)
    assert "--advertise-host=$(POD_IP)" in container["args"], "discovery must name a routable address"


def secret_key_of(pod: dict, container: dict, file: str) -> bool:
    secrets = {s["metadata"]["name"]: s for _, s in kinds("Secret")}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        directory = mount["mountPath"].rstrip("/") + "/"
        source = volumes[mount["name"]].get("secret")
        if not file.startswith(directory) or source is None:
            continue
        key = file[len(directory):]
        items = {i["path"]: i["key"] for i in source.get("items", ())}  # none: every key is a file
        if items and key not in items:
            return False
        return items.get(key, key) in secrets[source["secretName"]]["stringData"]
    return False


@pytest.mark.parametrize("path", COMPOSE, ids=lambda p: p.name)
def test_compose_services_follow_the_server_lifecycle(path):
    compose = yaml.safe_load(path.read_text())
    assert "version" not in compose, "the Compose Specification: no version key"
    for name, service in compose["services"].items():
        ns = server_flags(service["command"])
        grace = int(service["stop_grace_period"].rstrip("s"))
        assert grace >= ns.drain_grace_s + 10, f"{name}: stop_grace_period must outlast --drain-grace-s"
        assert ns.api_key_file and ns.admin_api_key_file, f"{name}: keys on every RPC, operator key for off-box"
        for file in (ns.api_key_file, ns.admin_api_key_file):
            secret = file.removeprefix("/run/secrets/")
            assert secret in service["secrets"] and secret in compose["secrets"], f"{name}: {file}"
        published = {p.rsplit(":", 1)[1] for p in service["ports"]}
        assert {str(ns.port), str(ns.metrics_port)} <= published, f"{name}: gRPC and metrics ports published"
        assert all(p.startswith("${OPENENGINE_BIND:-127.0.0.1}:") for p in service["ports"]), \
            f"{name}: nothing opens to the network unless OPENENGINE_BIND says so"
        assert service["restart"] == "on-failure", f"{name}: a dead engine exits non-zero and is restarted"

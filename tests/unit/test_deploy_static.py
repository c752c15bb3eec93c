"""Static checks of the Dockerfile, compose file and Kubernetes manifests (no Docker engine
here): they parse, run as non-root, probe the right routes and ports, and name real settings."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from inflight.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
SETTING_NAMES = {f"INFLIGHT_{name.upper()}" for name in Settings.model_fields}
PORT = 8787


def dockerfile_stages() -> list[list[str]]:
    lines = (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
    stages: list[list[str]] = []
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(stripped)
    return stages


def test_dockerfile_is_multistage_non_root_with_healthcheck() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2
    final = stages[-1]
    users = [line for line in final if line.upper().startswith("USER ")]
    assert users, "final stage must set USER"
    assert users[-1].split()[1].split(":")[0] not in ("root", "0")
    assert any(line.upper().startswith("HEALTHCHECK") and "/healthz" in line for line in final)
    assert any(line.upper().startswith("EXPOSE") and str(PORT) in line for line in final)
    cmd = next(line for line in final if line.upper().startswith("CMD"))
    assert "0.0.0.0" in cmd
    assert str(PORT) in cmd
    assert "--proxy-headers" in cmd


def test_dockerfile_installs_from_the_lock_and_bakes_encodings() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"pip install --no-deps -r deploy/requirements\.lock", text)
    assert "python -m inflight.tokens.encodings --cache-dir /opt/tiktoken" in text
    assert "TIKTOKEN_CACHE_DIR=/opt/tiktoken" in text
    for line in text.splitlines():
        if line.startswith("COPY") and "--from=" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source


def test_the_build_stage_copies_every_directory_the_package_is_built_from() -> None:
    """`pip install .` in the image needs every folder pyproject's package-dir maps (`app/` is
    `inflight`, `config/` its default config) copied in before it runs."""
    text = (ROOT / "Dockerfile").read_text()
    build = text[: text.index("RUN pip install --no-deps .")]
    copied = {line.split()[1] for line in build.splitlines() if line.startswith("COPY")}
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(tool["package-dir"].values()) <= copied


def test_every_runtime_dependency_is_pinned_in_the_lock() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (ROOT / "deploy" / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"unpinned: {line}"
            pins[name.lower().replace("_", "-")] = version
    for requirement in project["dependencies"]:
        name = re.split(r"[\[<>=!~ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        assert name in pins, f"{name} missing from deploy/requirements.lock"


def test_dockerignore_keeps_the_context_small() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "tests", "bench/out"):
        assert entry in ignored


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def test_compose_services_settings_ports_and_health() -> None:
    services = compose()["services"]
    proxies = {name: s for name, s in services.items() if name.startswith("inflight")}
    assert {"inflight", "inflight-ollama", "inflight-vllm", "inflight-shared"} <= set(proxies)
    for name, service in proxies.items():
        env = service["environment"]
        assert set(env) <= SETTING_NAMES, f"{name}: unknown settings {set(env) - SETTING_NAMES}"
        upstream = re.match(r"http://([\w-]+):(\d+)/v1", env["INFLIGHT_UPSTREAM_URL"])
        assert upstream, name
        assert upstream.group(1) in services, f"{name} points at a missing service"
        for port in service.get("ports", ()):
            assert port.startswith("127.0.0.1:"), "publish on loopback only"
            assert port.endswith(f":{PORT}")
        assert "/healthz" in " ".join(service["healthcheck"]["test"])
        assert any(v.endswith(":/data") for v in service["volumes"])
    for name in ("llama", "ollama", "vllm", "postgres", "redis"):
        assert "healthcheck" in services[name], name


def test_compose_profiles() -> None:
    services = compose()["services"]
    assert "vllm" in services["vllm"]["profiles"]
    shared = services["inflight-shared"]
    assert "shared" in shared["profiles"]
    assert shared["environment"]["INFLIGHT_DATABASE_URL"].startswith("postgresql://")
    assert "@postgres:5432/" in shared["environment"]["INFLIGHT_DATABASE_URL"]
    assert shared["environment"]["INFLIGHT_CACHE_URL"] == "redis://redis:6379/0"
    assert {"postgres", "redis"} <= set(shared["depends_on"])


def test_shared_replicas_sit_behind_a_balancer_without_stickiness() -> None:
    """The `shared` profile's replicas are reached only through nginx (official image), whose
    config (deploy/nginx/inflight.conf) balances round robin over the replicas' service name
    with no session affinity, streams unbuffered and re-resolves scaled replicas."""
    services = compose()["services"]
    shared, balancer = services["inflight-shared"], services["balancer"]
    assert "ports" not in shared, "replicas are reached through the balancer only"
    assert shared["deploy"]["replicas"] >= 2
    assert balancer["image"].startswith("nginx:")
    assert "shared" in balancer["profiles"]
    assert "inflight-shared" in balancer["depends_on"]
    assert all(p.startswith("127.0.0.1:") and p.endswith(f":{PORT}") for p in balancer["ports"])
    mount = next(v for v in balancer["volumes"] if v.endswith("/etc/nginx/conf.d/default.conf:ro"))
    conf = (ROOT / mount.split(":")[0]).read_text()
    upstream = re.search(r"upstream (\w+) \{(.*?)\}", conf, re.S)
    assert upstream is not None
    assert re.search(rf"server inflight-shared:{PORT}\b", upstream.group(2))
    for sticky in ("ip_hash", "hash ", "sticky", "least_conn"):
        assert sticky not in upstream.group(2), f"no affinity assumed: {sticky}"
    assert f"proxy_pass http://{upstream.group(1)};" in conf
    assert "proxy_buffering off;" in conf
    assert f"listen {PORT};" in conf
    assert re.search(r"proxy_read_timeout (\d+)s;", conf)


def test_kubernetes_service_balances_without_affinity() -> None:
    """The Service spreads requests over every ready pod: no sessionAffinity (ClientIP would
    pin a client to one replica, which nothing needs)."""
    service = manifests()["Service/inflight"]["spec"]
    assert service.get("sessionAffinity", "None") == "None"
    assert service.get("type", "ClusterIP") == "ClusterIP"
    annotations = manifests()["Ingress/inflight"]["metadata"]["annotations"]
    assert not any("affinity" in key for key in annotations)


def manifests() -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs[f"{doc['kind']}/{doc.get('metadata', {}).get('name', path.stem)}"] = doc
    return docs


def test_manifests_parse_and_cover_the_kinds() -> None:
    kinds = {key.split("/")[0] for key in manifests()}
    expected = {"Deployment", "Service", "ConfigMap", "Secret", "HorizontalPodAutoscaler",
                "PodDisruptionBudget", "Ingress", "Kustomization"}  # fmt: skip
    assert expected <= kinds


def test_deployment_probes_ports_env_and_security() -> None:
    docs = manifests()
    deployment = docs["Deployment/inflight"]
    spec = deployment["spec"]["template"]["spec"]
    container = spec["containers"][0]
    port = container["ports"][0]
    assert port["containerPort"] == PORT
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["port"] in (PORT, port["name"])
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]
    assert spec["terminationGracePeriodSeconds"] >= 60
    names = {e["name"] for e in container["env"]}
    assert names <= SETTING_NAMES
    assert {"INFLIGHT_DATABASE_URL", "INFLIGHT_CACHE_URL", "INFLIGHT_API_KEYS"} <= names
    labels = deployment["spec"]["selector"]["matchLabels"]
    service = docs["Service/inflight"]
    assert service["spec"]["selector"] == labels
    assert service["spec"]["ports"][0]["targetPort"] == PORT
    assert docs["PodDisruptionBudget/inflight"]["spec"]["selector"]["matchLabels"] == labels
    target = docs["HorizontalPodAutoscaler/inflight"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "inflight")
    secret_keys = set(docs["Secret/inflight-secrets"]["stringData"])
    for env in container["env"]:
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["key"] in secret_keys
    mounted = {v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v}
    assert "inflight-config" in mounted


def test_ingress_is_sse_safe() -> None:
    annotations = manifests()["Ingress/inflight"]["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 300


def test_kustomization_lists_exactly_the_manifests() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert listed == present


def test_configmap_is_in_sync_with_config() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("render", ROOT / "deploy" / "render_configmap.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (K8S / "configmap.yaml").read_text() == module.render(), (
        "run: python deploy/render_configmap.py"
    )


@pytest.mark.parametrize(
    "path", ["docker-compose.yml", *[f"deploy/kubernetes/{p.name}" for p in K8S.glob("*.yaml")]]
)
def test_yaml_has_no_tabs(path: str) -> None:
    assert "\t" not in (ROOT / path).read_text()
